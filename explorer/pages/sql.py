"""SQL: a read-only console over the profile. One SELECT (or WITH … SELECT) per run, checked by
DuckDB's own parser, at most ``data.CONSOLE_LIMIT`` rows; results as a table and a quick chart."""
from __future__ import annotations

import dash
import plotly.graph_objects as go
from dash import ALL, Input, Output, State, callback, ctx, dcc, html

from explorer import data, ui
from traces.console import EXAMPLE_QUERIES, RefusedQuery, table_query

EXAMPLES = EXAMPLE_QUERIES


@ui.guarded
def layout(profile=None, q=None, **_):
    key = ui.profile_key(profile)
    data.resolve(key)
    query = q if isinstance(q, str) and len(q) <= 20_000 else next(iter(EXAMPLES.values()))
    return html.Div([
        *ui.url_sink("sql"),
        dcc.Store(id="sql-profile", data=key),
        html.H2("SQL console (read-only)"),
        html.Div(["Examples: ", dcc.Dropdown(id="sql-examples", options=list(EXAMPLES), placeholder="pick a query",
                                             style={"minWidth": "320px"})], className="toolbar"),
        dcc.Textarea(id="sql-query", value=query, className="sql", spellCheck=False),
        html.Div([html.Button("Run", id="sql-run", className="btn"),
                  html.Button("Download CSV", id="sql-csv", className="btn"), dcc.Download(id="sql-download"),
                  html.Span(f"One SELECT or WITH … SELECT; at most {data.CONSOLE_LIMIT:,} rows; "
                            "the tables are listed under Schema below.", className="hint")], className="toolbar"),
        html.Div(id="sql-message"),
        # the last queries run, kept in this browser (localStorage); a click puts one back in the editor
        dcc.Store(id="sql-history", storage_type="local", data=[]),
        html.Details([html.Summary("History: the last queries run here"), html.Div(id="sql-history-list")],
                     id="sql-history-box", className="card", open=True),
        html.Details([html.Summary("Schema: every table and its columns (click a table to query it)"),
                      _schema(data.schema_fields(data.resolve(key)))], id="sql-schema", className="card"),
        html.Div([html.Div(id="sql-result", className="card col", style={"maxHeight": "60vh", "overflow": "auto"}),
                  html.Div(dcc.Graph(id="sql-chart", config={"displaylogo": False}), className="card col")],
                 className="row"),
    ])


def _schema(tables: dict) -> html.Div:
    """The schema inspector: per table, a button that loads its first rows into the editor, its columns, and
    (opened) what ``SchemaFields`` says of each column: required, unit, an example and its meaning."""
    cols = [("column", lambda c: html.Code(c["column"])), ("type", lambda c: c["type"].lower()),
            ("required", lambda c: {True: "yes", False: "no"}.get(c["required"], "")),
            ("unit", lambda c: c["unit"] or ""), ("example", lambda c: html.Code(c["example"]) if c["example"] else ""),
            ("meaning", lambda c: c["description"] or "")]
    return html.Div([html.Div([
        html.Button(name, id={"type": "sql-schema-table", "table": name}, className="btn"),
        html.Details([html.Summary(", ".join(f"{c['column']} {c['type'].lower()}" for c in fields), className="hint"),
                      ui.table(cols, fields, class_name="data schema-fields")],
                     className="schema-fields-box", id=f"sql-schema-{name}"),
    ], className="schema-row") for name, fields in tables.items()])


#: Queries the history keeps.
HISTORY = 20


@callback(Output("sql-history-list", "children"), Input("sql-history", "data"))
def history_list(history):
    """The history as buttons, newest first."""
    items = [q for q in (history or []) if isinstance(q, str)][:HISTORY]
    if not items:
        return html.Span("No query run yet in this browser.", className="hint")
    return html.Ol([html.Li(html.Button(q if len(q) <= 160 else q[:160] + "…", title=q, className="history-q",
                                        id={"type": "sql-history-q", "i": i}, n_clicks=0))
                    for i, q in enumerate(items)], id="sql-history-items")


@callback(Output("sql-query", "value"), Input("sql-examples", "value"),
          Input({"type": "sql-schema-table", "table": ALL}, "n_clicks"),
          Input({"type": "sql-history-q", "i": ALL}, "n_clicks"), State("sql-profile", "data"),
          State("sql-history", "data"), prevent_initial_call=True)
def example(name, _clicks, _history_clicks, key, history):
    """An example query, the first rows of a table clicked in the schema (``traces.console.table_query``), or
    a query from the history."""
    trig = ctx.triggered_id
    if isinstance(trig, dict) and trig.get("type") == "sql-history-q":
        i = trig.get("i")
        ok = ctx.triggered and ctx.triggered[0]["value"] and isinstance(i, int) and 0 <= i < len(history or [])
        return history[i] if ok else dash.no_update
    if isinstance(trig, dict) and ctx.triggered and ctx.triggered[0]["value"]:
        table = trig.get("table")
        if table in data.schema(data.resolve(key)):    # a name the profile has, never user text
            return table_query(table)
        return dash.no_update
    return EXAMPLES.get(name, dash.no_update)


@callback(Output("sql-download", "data"), Output("sql-message", "children", allow_duplicate=True),
          Input("sql-csv", "n_clicks"), State("sql-query", "value"), State("sql-profile", "data"),
          prevent_initial_call=True)
def download(_clicks, query, key):
    """The query's result as ``query.csv`` (the console's checks and row cap)."""
    try:
        text = data.console_csv(data.resolve(key), query or "")
    except (RefusedQuery, data.ExplorerError) as exc:
        return dash.no_update, html.Div(f"Refused: {exc}" if isinstance(exc, RefusedQuery) else f"Error: {exc}",
                                        className="error-box", id="sql-error")
    return dict(content=text, filename="query.csv", type="text/csv"), dash.no_update


def quick_chart(columns, rows) -> go.Figure:
    """A bar chart of the first numeric column after the first against the columns before it (joined with
    " · ": an (exec_id, opcode, n) result charts n per "exec_id · opcode"), when the result has one.

    >>> quick_chart(["exec_id", "opcode", "n"], [{"exec_id": 1, "opcode": "MATMUL", "n": 4}]).data[0].x
    ('1 · MATMUL',)
    """
    fig = go.Figure()
    numeric = [i for i, c in enumerate(columns) if i and rows and
               all(isinstance(r[c], (int, float)) and not isinstance(r[c], bool) or r[c] is None for r in rows)]
    if columns and numeric and rows:
        y, keys = columns[numeric[0]], columns[:numeric[0]]
        fig.add_bar(x=[" · ".join(str(r[k]) for k in keys) for r in rows[:200]], y=[r[y] for r in rows[:200]],
                    name=y)
        fig.update_layout(xaxis_title=" · ".join(keys), yaxis_title=y)
    fig.update_layout(height=360, margin=dict(l=10, r=10, t=20, b=40))
    return fig


@callback(Output("sql-result", "children"), Output("sql-message", "children"), Output("sql-chart", "figure"),
          Output("sql-url", "data"), Output("sql-history", "data"),
          Input("sql-run", "n_clicks"), State("sql-query", "value"), State("sql-profile", "data"),
          State("sql-history", "data"))
def run(_clicks, query, key, history=None):
    """Run the console query (also on page load, so a shared ``?q=`` link shows its result); a query the
    user ran goes to the top of the history."""
    try:
        res = data.run_console(data.resolve(key), query or "")
    except (RefusedQuery, data.ExplorerError) as exc:
        return html.Div(), html.Div(f"Refused: {exc}" if isinstance(exc, RefusedQuery) else f"Error: {exc}",
                                    className="error-box", id="sql-error"), go.Figure(), dash.no_update, \
            dash.no_update
    table = ui.table([(c, c) for c in res["columns"]], res["rows"], id="sql-table", max_rows=data.CONSOLE_LIMIT)
    note = f"{len(res['rows']):,} rows" + (f" (first {data.CONSOLE_LIMIT:,} shown)" if res["truncated"] else "")
    kept = dash.no_update
    if history is not None and ctx.triggered_id == "sql-run":
        kept = [query] + [q for q in (history or []) if isinstance(q, str) and q != query][:HISTORY - 1]
    return (table, html.Div(note, className="hint", id="sql-count"), quick_chart(res["columns"], res["rows"]),
            {"q": query}, kept)


ui.register_url_sync("sql")


#: Registered by explorer.app after the Dash app exists (Dash refuses earlier).
PAGE = dict(path="/sql", name="SQL", title="SQL · Neuron Explorer")
