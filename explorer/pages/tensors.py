"""Tensor Viewer: every tensor of the profile's NEFFs with the real Neuron Explorer's columns
(``variable_name``, ``type``, ``format``, ``shape``, ``size``, ``node``, ``load_to_sbuf_*``) plus its
dtype and graph; each loaded tensor links to its first load DMA on the timeline, and ``node`` in the
URL (the timeline's instruction panel links here) keeps the tensors of one op.
"""
from __future__ import annotations

from dash import dcc, html

from explorer import data, records, ui
from explorer.figures import fmt_bytes

#: Tensors per page (a profile holds hundreds: one table was 6,576 px tall).
PAGE_ROWS = 50


def pager(key, node, page: int, pages: int, total: int):
    """``‹ previous · page 2 of 4 (173 tensors) · next ›`` links (query ``page=``)."""
    def link(text, p, id_):
        return dcc.Link(text, href=ui.href("/tensors", profile=key, node=node, page=p), id=id_)
    return html.Span([link("‹ previous", page - 1, "tensors-prev") if page > 1 else None,
                      f" page {page} of {pages} ({total} tensors) ",
                      link("next ›", page + 1, "tensors-next") if page < pages else None], id="tensors-pager")


@ui.guarded
def layout(profile=None, node=None, page=None, **_):
    key = ui.profile_key(profile)
    if node is not None and (not isinstance(node, str) or len(node) > 200):
        raise data.ExplorerError("node must be a graph node name of at most 200 characters")
    L = data.resolve(key)
    every = records.tensors(L, node)
    pages = max(1, -(-len(every) // PAGE_ROWS))
    page = data.parse_int(page, "page", 1, pages) if page not in (None, "") else 1
    rows = every[(page - 1) * PAGE_ROWS: page * PAGE_ROWS]

    def load_link(r):
        if r["first_load_ns"] is None:
            return "—"
        t = r["first_load_ns"]
        return dcc.Link(f"{r['first_load_queue']} pc {r['first_load_pc']}",
                        href=ui.href("/timeline", profile=key, start=max(t - 2_000, 0), end=t + 8_000))

    table = ui.table([
        ("variable_name", "variable_name"), ("type", "type"), ("format", "format"), ("shape", "shape"),
        ("dtype", "dtype"), ("size", lambda r: fmt_bytes(r["size"])),
        ("node", lambda r: dcc.Link(r["node"], href=ui.href("/tensors", profile=key, node=r["node"]))),
        ("graph", "graph"), ("load_to_sbuf_dma_count", "load_to_sbuf_dma_count"),
        ("load_to_sbuf_total_size_bytes", "load_to_sbuf_total_size_bytes"),
        ("load_to_sbuf_avg_size_bytes", "load_to_sbuf_avg_size_bytes"),
        ("load_to_sbuf_repeat_factor", "load_to_sbuf_repeat_factor"), ("first load", load_link),
    ], rows, id="tensors-table", max_rows=2000)
    shown = f"{len(every)} tensors" + (f" of node {node}" if node else "")
    return html.Div([
        html.H2(["Tensor Viewer · ", data.registry().label(key)]),
        html.Div([html.Span(shown, id="tensors-count"), " ",
                  dcc.Link("all tensors", href=ui.href("/tensors", profile=key)) if node else None,
                  pager(key, node, page, pages, len(every)) if pages > 1 else None],
                 className="toolbar"),
        html.Div("A repeat factor above 1 means the tensor is loaded into SBUF more than once (a weight re-read per "
                 "tile, or an intermediate that spilled).", className="hint"),
        html.Div(table if rows else html.Span("No tensors recorded (a profile from before schema 1.3.0).",
                                             className="hint"), className="card"),
    ])


#: Registered by explorer.app after the Dash app exists (Dash refuses earlier).
PAGE = dict(path="/tensors", name="Tensors", title="Tensor Viewer · Neuron Explorer")
