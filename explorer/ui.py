"""Small building blocks shared by the Explorer's pages: links that keep the profile, tables, errors.

>>> href("/timeline", profile="mlp", sel="op:3", start=None)
'/timeline?profile=mlp&sel=op%3A3'
"""
from __future__ import annotations

import functools
from urllib.parse import urlencode

from dash import dcc, html

from explorer import data
from traces.console import RefusedQuery


def href(path: str, **query) -> str:
    """A page link with its query string (empty values dropped)."""
    q = {k: v for k, v in query.items() if v not in (None, "")}
    return path + ("?" + urlencode(q) if q else "")


def error_box(message: str, hint: str = "") -> html.Div:
    """The one-line problem (and the fix) a page shows instead of its content."""
    return html.Div([html.Strong("Cannot show this page: "), html.Span(message),
                     html.Div(hint, className="hint") if hint else None], className="error-box", role="alert")


def profile_key(profile) -> str:
    """The requested profile key, or the first one served; raises when none is served."""
    key = profile or data.registry().default_key()
    if key is None:
        raise data.ExplorerError("no profile is open: start the Explorer with "
                                 "`neuron-explorer view output/<session>/profile.duckdb`")
    return key


def guarded(layout_fn):
    """Wrap a page's ``layout(**query)`` so a bad profile or parameter becomes a message, not a 500."""
    @functools.wraps(layout_fn)
    def wrapper(**query):
        try:
            return layout_fn(**query)
        except (data.ExplorerError, RefusedQuery) as exc:
            return error_box(str(exc))
        except Exception as exc:  # the server stays up whatever one profile contains
            return error_box(f"{type(exc).__name__}: {data._one_line(exc)}",
                             "The profile may be from an incompatible version; re-run `neuron-explorer inspect`.")
    return wrapper


def table(columns, rows, *, id=None, class_name="data", row_id=None, max_rows: int = 500) -> html.Table:
    """An HTML table. ``columns``: ``[(header, key_or_fn)]``; a fn gets the row and returns a cell."""
    head = html.Thead(html.Tr([html.Th(h) for h, _ in columns]))
    body = []
    for r in rows[:max_rows]:
        cells = [html.Td(f(r) if callable(f) else _cell(r.get(f))) for _, f in columns]
        body.append(html.Tr(cells, id=row_id(r)) if row_id else html.Tr(cells))
    kw = {"id": id} if id else {}
    return html.Table([head, html.Tbody(body)], className=class_name, **kw)


def _cell(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


def stat(label: str, value, sub: str = "", id=None) -> html.Div:
    kw = {"id": id} if id else {}
    return html.Div([html.Div(label, className="stat-label"), html.Div(value, className="stat-value"),
                     html.Div(sub, className="stat-sub") if sub else None], className="stat", **kw)


def url_sink(page: str) -> list:
    """A store whose data (a dict of query params) the browser writes into the address bar.

    Uses ``history.replaceState`` (see assets/explorer.js) so the page does not re-render while
    the URL stays shareable.
    """
    return [dcc.Store(id=f"{page}-url"), html.Div(id=f"{page}-url-sink", hidden=True)]


def register_url_sync(page: str) -> None:
    from dash import ClientsideFunction, Input, Output, clientside_callback

    clientside_callback(ClientsideFunction("explorer", "syncUrl"),
                        Output(f"{page}-url-sink", "children"), Input(f"{page}-url", "data"))
