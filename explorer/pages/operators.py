"""Operators: the real Neuron Explorer's Operator Table. Layer → op → opcode of the measured executions, each
row with its device time, wall (active) time, MFU, HFU, FLOPs and bytes moved, sortable and filterable, each
linked to its first execution's window on the timeline (with the op selected) and to its source line.
The figures are ``Profile.operator_table`` (traces/q_operators.py)."""
from __future__ import annotations

from dash import dash_table, html

from explorer import data, records, ui

_COLUMNS = (
    ("name", "operator", "text"), ("level", "level", "text"), ("layer", "layer", "text"),
    ("opcode", "opcode", "text"), ("device_us", "device time (µs)", "numeric"),
    ("active_us", "active time (µs)", "numeric"), ("mfu_percent", "MFU %", "numeric"),
    ("hfu_percent", "HFU %", "numeric"), ("flops", "FLOPs", "numeric"), ("hbm_bytes", "HBM bytes", "numeric"),
    ("sbuf_bytes", "SBUF bytes", "numeric"), ("instructions", "instructions", "numeric"),
    ("timeline", "timeline", "text"), ("source", "source", "text"),
)


def _selection(r) -> str:
    if r["level"] == "layer":
        return f"module:{r['layer']}" if r["layer"] else ""
    return f"op:{r['op_id']}"


def _row(key: str, r: dict) -> dict:
    out = {c: r.get(c) for c, _, _ in _COLUMNS if c in r}
    out["device_us"] = round((r["device_ns"] or 0) / 1e3, 3)
    out["active_us"] = round((r["active_ns"] or 0) / 1e3, 3)
    for c in ("mfu_percent", "hfu_percent"):
        out[c] = round(r[c], 4) if r[c] is not None else None
    if r.get("first_start_ns") is not None:
        link = ui.href("/timeline", profile=key, start=r["first_start_ns"], end=r["first_end_ns"], sel=_selection(r))
        out["timeline"] = f"[show]({link})"
    if r.get("source_id") is not None:
        where = f"{r['file'].rsplit('/', 1)[-1]}:{r['line']}" if r.get("file") else "source"
        out["source"] = f"[{where}]({ui.href('/source', profile=key, line=r['source_id'])})"
    return out


@ui.guarded
def layout(profile=None, **_):
    key = ui.profile_key(profile)
    rows = records.operators(data.resolve(key))
    if not rows:
        return ui.error_box("this profile holds no instruction rows to add up by operator.",
                            "Record it with profiling on: `neuron-explorer inspect -- python script.py`.")
    columns = [{"id": c, "name": n, "type": t, **({"presentation": "markdown"} if c in ("timeline", "source")
                                                     else {})} for c, n, t in _COLUMNS]
    return html.Div([
        html.H2(["Operators · ", data.registry().label(key)]),
        html.Div("Each layer (nn.Module path), its ops and their opcodes over the measured executions. Device time "
                 "adds the instructions' durations (engine time, as the Summary's top ops); active time merges "
                 "their overlaps (wall time), and MFU / HFU are Tensor Engine FLOPs without / with transposes over "
                 "the peak for the active time. Sort by a header; filter by typing in the row under it "
                 "(e.g. eq \"op\", > 10, fc1).", className="hint"),
        html.Div(dash_table.DataTable(
            id="operators-table", columns=columns, data=[_row(key, r) for r in rows],
            sort_action="native", filter_action="native", page_action="native", page_size=50,
            markdown_options={"link_target": "_self"},
            style_table={"overflowX": "auto", "maxWidth": "100%"},
            style_cell={"fontFamily": "inherit", "fontSize": "13px", "padding": "2px 6px", "textAlign": "left",
                        "maxWidth": "320px", "overflow": "hidden", "textOverflow": "ellipsis"},
            style_header={"fontWeight": "600"},
            style_data_conditional=[{"if": {"filter_query": '{level} = "layer"'}, "fontWeight": "600"}],
        ), className="card"),
    ])


#: Registered by explorer.app after the Dash app exists (Dash refuses earlier).
PAGE = dict(path="/operators", name="Operators", title="Operators · Neuron Explorer")
