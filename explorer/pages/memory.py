"""Memory Viewer: one execution's SBUF (or PSUM) allocations as address ranges over time, as the
real Neuron Explorer's: each block is an allocation of the compiler's allocators (tile ring,
resident heap, PSUM banks) from its first to its last access, coloured by op; spilled ones are
outlined red. Pick the memory, the execution and a partition; click a block for its opcode,
operands, DMA queue, tensor and a link to that time on the timeline (``t`` in the URL draws the
instant the timeline linked from).
"""
from __future__ import annotations

from dash import Input, Output, State, callback, dcc, html

from explorer import data, records, ui
from explorer.figures import fmt_bytes, fmt_ns, memory_figure


def _view(key, exec_id, memory, partition, t):
    L = data.resolve(key)
    return records.memory(L, exec_id, memory or "SBUF", partition), t


@ui.guarded
def layout(profile=None, exec=None, memory="SBUF", partition=None, t=None, **_):
    key = ui.profile_key(profile)
    exec_id = data.parse_int(exec, "exec")
    part = data.parse_int(partition, "partition", 0, records.PARTITIONS - 1)
    t = data.parse_int(t, "t")
    mv, _ = _view(key, exec_id, memory, part, t)
    if not mv["executions"]:
        return ui.error_box("this profile holds no SBUF allocations.",
                            "Record it again with this neuron_stack (schema 1.3.0): "
                            "`neuron-explorer inspect -- python script.py`.")
    said = data.execution_labels(data.resolve(key))      # graph, input shapes, warm-up, device time, core
    execs = [{"label": f"{said.get(e['exec_id'], e['graph'])} · at {fmt_ns(e['start_ns'])} "
                       f"({e['allocations']} allocations)", "value": str(e["exec_id"])} for e in mv["executions"]]
    return html.Div([
        html.H2(["Memory Viewer · ", data.registry().label(key)]),
        dcc.Store(id="memory-state", data={"profile": key, "t": t}),
        html.Div([
            dcc.RadioItems(id="memory-kind", options=list(records.MEMORIES), value=mv["memory"], inline=True),
            dcc.Dropdown(id="memory-exec", options=execs, value=str(mv["exec_id"]), clearable=False,
                         style={"minWidth": "28em"}),
            dcc.Input(id="memory-partition", type="number", min=0, max=records.PARTITIONS - 1, value=part,
                      placeholder="partition (all)", debounce=True, style={"width": "11em"}),
            html.Span(id="memory-status", className="hint"),
        ], className="toolbar"),
        html.Div(dcc.Graph(id="memory-graph", figure=memory_figure(mv["rows"], t), config={"displaylogo": False}),
                 className="card"),
        html.Div([html.H3("Allocation"), html.Div("Click a block.", id="memory-details", className="hint")],
                 className="card"),
    ])


@callback(Output("memory-graph", "figure"), Output("memory-status", "children"),
          Input("memory-kind", "value"), Input("memory-exec", "value"), Input("memory-partition", "value"),
          State("memory-state", "data"))
def update(kind, exec_value, partition, state):
    """Another memory, execution or partition: query its allocations again."""
    try:
        exec_id = data.parse_int(exec_value, "exec")
        part = data.parse_int(partition, "partition", 0, records.PARTITIONS - 1)
        mv, t = _view(state["profile"], exec_id, kind, part, state.get("t"))
    except data.ExplorerError as exc:
        return memory_figure([], None), str(exc)
    rows = mv["rows"]
    spilled = sum(1 for r in rows if r["spill"])
    where = f" spanning partition {part}" if part is not None else ""
    return memory_figure(rows, t), f"{len(rows)} {kind} allocations{where}; {spilled} moved by spill traffic"


@callback(Output("memory-details", "children"), Input("memory-graph", "clickData"),
          State("memory-kind", "value"), State("memory-exec", "value"), State("memory-partition", "value"),
          State("memory-state", "data"), prevent_initial_call=True)
def details(click, kind, exec_value, partition, state):
    """The clicked allocation, with a link to its lifetime on the timeline."""
    point = ((click or {}).get("points") or [{}])[0]
    i = point.get("customdata")
    key = state["profile"]
    try:
        i = data.parse_int(i[0] if isinstance(i, list) and i else i, "allocation", 0, 10**7)
        mv, _ = _view(key, data.parse_int(exec_value, "exec"), kind,
                      data.parse_int(partition, "partition", 0, records.PARTITIONS - 1), None)
    except data.ExplorerError as exc:
        return ui.error_box(str(exc))
    if i is None or i >= len(mv["rows"]):
        return html.Span("Click a block.", className="hint")
    r = mv["rows"][i]
    pad = max((r["end_ts"] - r["start_ts"]) // 4, 500)
    fields = [("tensor", r["tensor_name"]), ("op", r["op"]), ("memory", r["memory"]),
              ("address", f"{r['start_address']:#x} – {r['end_address']:#x} "
                          f"({fmt_bytes(r['end_address'] - r['start_address'] + 1)} per partition)"),
              ("partitions", f"{r['partition']} – {r['partition'] + r['partition_count'] - 1}"),
              ("start / end", f"{fmt_ns(r['start_ts'])} – {fmt_ns(r['end_ts'])}"),
              ("duration", fmt_ns(r["end_ts"] - r["start_ts"])), ("first access", r["op_source_type"]),
              ("opcode", r["opcode"]), ("operands", r["operands"]), ("DMA queue", r["queue_name"] or "—"),
              ("spill", r["spill"] or "—")]
    return html.Div([
        ui.table([("field", lambda x: x[0]), ("value", lambda x: str(x[1]))], fields, class_name="data"),
        dcc.Link("Show on the timeline →", id="memory-open-timeline",
                 href=ui.href("/timeline", profile=key, start=max(r["start_ts"] - pad, 0), end=r["end_ts"] + pad)),
    ])


#: Registered by explorer.app after the Dash app exists (Dash refuses earlier).
PAGE = dict(path="/memory", name="Memory", title="Memory Viewer · Neuron Explorer")
