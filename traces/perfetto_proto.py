"""Perfetto's protobuf trace (``.pftrace``), as the real ``view --output-format perfetto`` writes it:
``system_profile.pftrace`` (the System Trace: framework, ``neuron_rt`` and ``neuron_hw`` events grouped by the
real ``--system-trace-primary-group`` / ``--system-trace-secondary-group`` fields, host → device flows, the
host's CPU fallbacks and compiles, and the host CPU, host memory and HBM counters) and one
``device_profile_model_<graph_id>.pftrace`` per compiled graph (its executions and every instruction on the
real lanes, ``Tensor(nc0)``, ``qSyncIO0(nc0)``, ..., with the op, source line and bytes as arguments).

The rows are the Chrome JSON export's (:mod:`traces.export`: ``instr_rows``, ``exec_rows``, ``host_rows``,
``system_rows``): one query, two encoders. Packets are streamed to the file batch by batch (Perfetto's
``StreamingTraceProtoBuilder``), so memory stays flat; each file holds at most :data:`MAX_SLICES` slices,
the first in time (the rest are counted as cut).

>>> import tempfile, traces, traces.synthetic
>>> d = Path(tempfile.mkdtemp())
>>> _ = traces.synthetic.write_run(d, executions=1, instructions=40)
>>> with traces.open(d) as p:
...     files = write(p, d)
>>> [f.path.name.split("_")[0] for f in files]
['system', 'device']
>>> tracks, events = read(files[1].path)
>>> sum(1 for e in events if e["type"] == "B") == files[1].slices, events[0]["name"], events[0]["cat"]
(True, 'Block.forward (warm-up)', 'execution')
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
from perfetto.trace_builder.proto_builder import StreamingTraceProtoBuilder

from traces import export, q_system
from traces.errors import TraceError

#: the real flags' fields (Neuron Explorer's "Perfetto output view options") and defaults
PRIMARY_FIELDS = ("instance_id", "thread_id", "lnc_idx", "process_id")
SECONDARY_FIELDS = ("instance_id", "worker_gid", "thread_id", "lnc_idx", "process_id")
PRIMARY_DEFAULT = "instance_id,process_id"
SECONDARY_DEFAULT = "worker_gid,lnc_idx,thread_id"
#: slices per file at most: the JSON export's bound per table
MAX_SLICES = export.JSON_MAX_ROWS

#: a grouping field → (its column in ``system_rows``, how a track name shows its value)
_FIELD = {"instance_id": ("host", "{}"), "process_id": ("process_id", "PID:{}"), "thread_id": ("thread_id", "TID:{}"),
          "lnc_idx": ("core", "NC:{}"), "worker_gid": ("worker_gid", "GID:{}")}
BATCH = 8192   # rows per batch turned into Python objects at a time
_SEQ = 1   # one writer: every packet on one trusted sequence
_B, _E, _I, _C = (pb.TrackEvent.TYPE_SLICE_BEGIN, pb.TrackEvent.TYPE_SLICE_END, pb.TrackEvent.TYPE_INSTANT,
                  pb.TrackEvent.TYPE_COUNTER)


@dataclass(frozen=True)
class Written:
    """One file written: its path, the slices in it, and the slices past :data:`MAX_SLICES` left out."""
    path: Path
    slices: int
    cut: int


def parse_group(raw: str | None, flag: str = "--system-trace-primary-group") -> tuple[str, ...]:
    """A grouping flag's comma-separated fields, checked against the real tool's allowed ones; the default
    when ``raw`` is None.

    >>> parse_group(None), parse_group("lnc_idx, thread_id", "--system-trace-secondary-group")
    (('instance_id', 'process_id'), ('lnc_idx', 'thread_id'))
    >>> parse_group("worker_gid")     # doctest: +ELLIPSIS
    Traceback (most recent call last):
    traces.errors.TraceError: --system-trace-primary-group: unknown field 'worker_gid'; use instance_id, ...
    """
    secondary = "secondary" in flag
    allowed = SECONDARY_FIELDS if secondary else PRIMARY_FIELDS
    fields = tuple(f.strip() for f in (raw if raw is not None else
                                       SECONDARY_DEFAULT if secondary else PRIMARY_DEFAULT)[:1000].split(","))
    for f in fields:
        if f not in allowed:
            raise TraceError(f"{flag}: unknown field {f!r}; use {', '.join(allowed)}")
    if len(set(fields)) != len(fields):
        raise TraceError(f"{flag}: a field is named twice in {raw!r}")
    return fields


def group_name(row: dict, fields: tuple[str, ...]) -> str:
    """The name of the group an event falls in: its values of ``fields``, those it lacks left out.

    >>> group_name({"host": "i-1", "process_id": 7, "core": None, "thread_id": 9}, ("instance_id", "process_id"))
    'i-1/PID:7'
    >>> group_name({"core": None, "worker_gid": None, "thread_id": 9}, ("worker_gid", "lnc_idx", "thread_id"))
    'TID:9'
    """
    parts = [fmt.format(row[col]) for col, fmt in (_FIELD[f] for f in fields) if row.get(col) is not None]
    return "/".join(parts) or "host"   # none of the fields: a host-side event (framework thread, no core)


def write(profile, out_dir: str | os.PathLike, t0: int | None = None, t1: int | None = None,
          primary: tuple[str, ...] | None = None, secondary: tuple[str, ...] | None = None,
          max_slices: int = MAX_SLICES, system: bool = True, device: bool = True) -> list[Written]:
    """Write ``system_profile.pftrace`` and one ``device_profile_model_<graph_id>.pftrace`` per graph executed
    in the window ``[t0, t1)`` (projected-clock ns; the whole profile without) into the directory ``out_dir``;
    each file is written under a temporary name and renamed into place. ``primary``/``secondary``: the
    System Trace's grouping fields (:func:`parse_group`); ``system=False`` / ``device=False`` leave that side out
    (the real ``--ignore-system-profile`` / ``--ignore-device-profile``). Example: ``write(p, "output/session")``.
    """
    out_dir = Path(out_dir)
    if max_slices < 1:
        raise TraceError(f"max_slices {max_slices}: give at least 1")
    params = export._window_params(profile, t0, t1)
    groups = (primary or parse_group(None), secondary or parse_group(None, "--system-trace-secondary-group"))
    files = [_file(out_dir / "system_profile.pftrace",
                   lambda b: _system(profile, b, params, groups, max_slices))] if system else []
    if not device:
        return files
    for g in export.executed_graphs(profile, params["lo"], params["hi"]):
        files.append(_file(out_dir / f"device_profile_model_{g}.pftrace",
                           lambda b, g=g: _device(profile, b, dict(params, graph=g), max_slices)))
    return files


def _file(path: Path, fill) -> Written:
    """Run ``fill(builder)`` into a temporary file renamed to ``path``; ``fill`` returns (slices, cut)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            slices, cut = fill(_Builder(f))
        os.replace(tmp, path)
    except OSError as exc:
        raise TraceError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return Written(path, slices, cut)


class _Builder:
    """Track descriptors, slices, instants and counters as TracePackets, streamed to a file.

    Event names, categories and argument names are interned (written once on the sequence, then referred to by
    id, as Perfetto's SDK does). Slices on one Perfetto track must nest (an end closes the innermost open
    slice); one that would cross a slice still open on its track goes on a sibling track with the same name
    and merge key, which the UI draws in the same row. Slices must come in start order (the longest first at
    one start).

    >>> import io
    >>> b = _Builder(io.BytesIO())
    >>> lane = b.track("Tensor(nc0)", merge_key="Tensor(nc0)")
    >>> b.slice(lane, 0, 10, "A", None, {}); b.slice(lane, 2, 3, "B", None, {}); b.slice(lane, 8, 10, "C", None, {})
    >>> [b._tracks[t][0] for t in sorted(b._open)], len(b._open)
    (['Tensor(nc0)', 'Tensor(nc0)'], 2)
    """

    def __init__(self, f):
        self._out = StreamingTraceProtoBuilder(f)
        self._uuid = 0
        self._tracks = {}   # uuid → (name, parent, rank, merge key): what a spill track copies
        self._open = {}     # uuid → ends of the slices open on it, innermost last
        self._spill = {}    # uuid → the sibling that takes its crossing slices
        self._iids = ({}, {}, {})   # interned event names, categories, argument names → iid
        self._first = True

    def _packet(self, ts: int | None = None) -> pb.TracePacket:
        p = pb.TracePacket(trusted_packet_sequence_id=_SEQ)
        if self._first:   # the sequence's interning starts empty here
            p.sequence_flags, self._first = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED, False
        if ts is not None:
            p.timestamp = int(ts)
        return p

    def _iid(self, p: pb.TracePacket, kind: int, name: str) -> int:
        """The interned id of ``name`` (0: event name, 1: category, 2: argument name), interned in ``p`` the
        first time."""
        table = self._iids[kind]
        iid = table.get(name)
        if iid is None:
            iid = table[name] = len(table) + 1
            entries = (p.interned_data.event_names, p.interned_data.event_categories,
                       p.interned_data.debug_annotation_names)[kind]
            entries.add(iid=iid, name=name)
        return iid

    def track(self, name: str, parent: int | None = None, rank: int | None = None, merge_key: str | None = None,
              unit: str | None = None, ordered: bool = False) -> int:
        """A new track (``unit`` makes it a counter track; ``ordered``: its children keep their ``rank``'s
        order); returns its uuid."""
        self._uuid += 1
        p = self._packet()
        d = p.track_descriptor
        d.uuid, d.name = self._uuid, name
        if parent is not None:
            d.parent_uuid = parent
        if rank is not None:
            d.sibling_order_rank = rank
        if ordered:
            d.child_ordering = pb.TrackDescriptor.EXPLICIT
        if merge_key is not None:   # tracks of one group share one row in the UI
            d.sibling_merge_behavior = pb.TrackDescriptor.SIBLING_MERGE_BEHAVIOR_BY_SIBLING_MERGE_KEY
            d.sibling_merge_key = merge_key
        if unit is not None:
            d.counter.unit_name = unit
        self._out.write_packet(p)
        self._tracks[self._uuid] = (name, parent, rank, merge_key)
        return self._uuid

    def _place(self, track: int, ts: int, end: int) -> int:
        """The track a slice ``[ts, end)`` goes on: ``track``, or its spill sibling if it would cross there."""
        while True:
            stack = self._open.setdefault(track, [])
            while stack and stack[-1] <= ts:
                stack.pop()
            if not stack or end <= stack[-1]:
                stack.append(end)
                return track
            if track not in self._spill:
                name, parent, rank, key = self._tracks[track]
                self._spill[track] = self.track(name, parent=parent, rank=rank, merge_key=key or name)
            track = self._spill[track]

    def slice(self, track: int, ts: int, dur: int, name: str, cat: str | None, args: dict,
              flow: int | None = None, flow_end: int | None = None) -> None:
        """A slice ``[ts, ts + dur)`` (an instant when ``dur`` is 0) with ``args`` as debug annotations; ``flow``
        starts a flow arrow at it, ``flow_end`` ends one there."""
        if dur > 0:
            track = self._place(track, ts, ts + dur)
        p = self._packet(ts)
        p.sequence_flags |= pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
        e = p.track_event
        e.type, e.track_uuid, e.name_iid = (_B if dur > 0 else _I), track, self._iid(p, 0, name)
        if cat:
            e.category_iids.append(self._iid(p, 1, cat))
        for k, v in args.items():
            if v is None:
                continue
            a = e.debug_annotations.add()
            a.name_iid = self._iid(p, 2, k)
            if isinstance(v, bool):
                a.bool_value = v
            elif isinstance(v, int):
                a.int_value = v
            elif isinstance(v, float):
                a.double_value = v
            else:
                a.string_value = str(v)
        if flow is not None:
            e.flow_ids.append(flow & 0xFFFF_FFFF_FFFF_FFFF)
        if flow_end is not None:
            e.terminating_flow_ids.append(flow_end & 0xFFFF_FFFF_FFFF_FFFF)
        self._out.write_packet(p)
        if dur > 0:
            end = self._packet(ts + dur)
            end.track_event.type, end.track_event.track_uuid = _E, track
            self._out.write_packet(end)

    def counter(self, track: int, ts: int, value: float) -> None:
        p = self._packet(ts)
        p.track_event.type, p.track_event.track_uuid = _C, track
        p.track_event.double_counter_value = float(value)
        self._out.write_packet(p)


def read(path: str | os.PathLike) -> tuple[dict, list[dict]]:
    """A ``.pftrace`` file written here, read back with Perfetto's ``Trace`` message: its track descriptors by
    uuid, and its track events in file order as dicts (``ts``, ``type`` B/E/I/C, ``track``, ``name``, ``cat``,
    ``args``, ``flows``, ``flow_ends``, ``value``) with the interned names resolved as Perfetto does, in
    sequence order. Example: ``tracks, events = read("system_profile.pftrace")``.
    """
    trace = pb.Trace.FromString(Path(path).read_bytes())
    names, cats, keys, tracks, events = {}, {}, {}, {}, []
    kinds = {_B: "B", _E: "E", _I: "I", _C: "C"}
    for p in trace.packet:
        if p.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
            names, cats, keys = {}, {}, {}
        names.update((i.iid, i.name) for i in p.interned_data.event_names)
        cats.update((i.iid, i.name) for i in p.interned_data.event_categories)
        keys.update((i.iid, i.name) for i in p.interned_data.debug_annotation_names)
        if p.HasField("track_descriptor"):
            tracks[p.track_descriptor.uuid] = p.track_descriptor
        if not p.HasField("track_event"):
            continue
        e = p.track_event
        args = {keys.get(a.name_iid, a.name): getattr(a, a.WhichOneof("value")) for a in e.debug_annotations}
        events.append({"ts": p.timestamp, "type": kinds[e.type], "track": e.track_uuid,
                       "name": names.get(e.name_iid, e.name), "cat": cats.get(e.category_iids[0]) if e.category_iids
                       else None, "args": args, "flows": list(e.flow_ids), "flow_ends": list(e.terminating_flow_ids),
                       "value": e.double_counter_value})
    return tracks, events


def _used(query: str, params: dict) -> dict:
    return {k: v for k, v in params.items() if f"${k}" in query}   # DuckDB refuses unused parameters


def _each(profile, query: str, params: dict, limit: int, fn) -> tuple[int, int]:
    """Call ``fn(row)`` on the rows of ``query`` in time order (the longest first at one start, so parents open
    first), at most ``limit`` of them, streamed in small batches; return (rows, rows past the limit)."""
    q = f"SELECT * FROM ({query}) ORDER BY ts_ns, dur_ns DESC LIMIT $n"
    n = 0
    for batch in profile.batches(q, {**_used(query, params), "n": max(limit, 0) + 1}, batch_size=BATCH):
        for row in batch.to_pylist():
            if n == limit:
                total = profile.sql(f"SELECT count(*) FROM ({query})", _used(query, params)).column(0)[0].as_py()
                return n, total - n
            fn(row)
            n += 1
    return n, 0


def _device(profile, b: _Builder, params: dict, max_slices: int) -> tuple[int, int]:
    """One graph's device profile: a parent track per NeuronCore, its executions and lanes under it."""
    lanes = export._lanes_sql()
    q = f"WITH {lanes} SELECT t.pid, t.tid, t.track, t.core, r.tag FROM threads t LEFT JOIN runs r USING (run_id)"
    threads = profile.sql(q + " ORDER BY t.pid, t.tid", _used(q, params)).to_pylist()
    multi = len({t["pid"] for t in threads}) > len({t["core"] for t in threads})   # several runs on a core
    parents, tracks = {}, {}
    for t in threads:
        if t["pid"] not in parents:
            parents[t["pid"]] = b.track(f"NeuronCore nc{t['core']}" + (f" · {t['tag']}" if multi and t["tag"] else ""),
                                         ordered=True)
        tracks[(t["pid"], t["tid"])] = b.track(t["track"], parent=parents[t["pid"]], rank=t["tid"],
                                                merge_key=t["track"])
    n = cut = 0
    for query in (export.exec_rows(lanes), export.instr_rows(lanes)):
        got, more = _each(profile, query, params, max_slices - n, lambda r: b.slice(
            tracks[(r["pid"], r["tid"])], r["ts_ns"], r["dur_ns"], r["name"], r["cat"], r["args"]))
        n, cut = n + got, cut + more
    return n, cut


def _system(profile, b: _Builder, params: dict, groups: tuple, max_slices: int) -> tuple[int, int]:
    """The system profile: events under their primary group (a parent track) and secondary group (one row,
    merged from the profile's tracks that fall in it), with host → device flows; the hosts' events; the
    host counters."""
    lanes = export._lanes_sql()
    primary, secondary = groups
    parents, tracks = {}, {}

    def system_event(r: dict) -> None:
        top, row = group_name(r, primary), group_name(r, secondary)
        if top not in parents:
            parents[top] = b.track(top)
        key = (top, row, r["track"])
        if key not in tracks:
            tracks[key] = b.track(row, parent=parents[top], merge_key=row)
        flow = r["flow_id"]
        args = {"instance_id": r["host"], "process_id": r["process_id"], "thread_id": r["thread_id"],
                "lnc_idx": r["core"], "worker_gid": r["worker_gid"], "exec_id": r["exec_id"], "flow_id": flow,
                "track": r["track"], "detail": r["detail"]}
        b.slice(tracks[key], r["ts_ns"], r["dur_ns"], r["name"], r["source"], args,
                flow=flow if r["name"] == "nrt_execute" else None,
                flow_end=flow if r["name"] == "nc_exec_running" else None)

    def host_event(r: dict) -> None:
        if (r["host"], r["tid"]) not in tracks:
            if r["host"] not in parents:
                parents[r["host"]] = b.track(r["host"], ordered=True)
            tracks[(r["host"], r["tid"])] = b.track(labels[r["tid"]], parent=parents[r["host"]], rank=r["tid"],
                                                    merge_key=labels[r["tid"]])
        b.slice(tracks[(r["host"], r["tid"])], r["ts_ns"], r["dur_ns"], r["name"], r["cat"], r["args"])

    labels = dict(export.HOST_THREADS)
    n = cut = 0
    if "system_events" in profile.tables():
        n, cut = _each(profile, export.system_rows(lanes), params, max_slices, system_event)
    got, more = _each(profile, export.host_rows(lanes), params, max_slices - n, host_event)
    _counters(profile, b, params)
    return n + got, cut + more


def _counters(profile, b: _Builder, params: dict) -> None:
    """Host CPU (%), host memory (bytes) and device memory (HBM bytes) over time, in the window."""
    series = q_system.host_series(profile)
    for key, column, name, unit in (("cpu", "util_percent", "host CPU %", "%"),
                                    ("memory", "used_bytes", "host memory", "bytes"),
                                    ("hbm", "hbm_bytes", "device memory (HBM)", "bytes")):
        t = series[key]
        if t.num_rows == 0:
            continue
        ts, values = t.column("ts_ns").to_pylist(), t.column(column).to_pylist()
        keep = [(s, v) for s, v in zip(ts, values) if params["lo"] <= s < params["hi"] and v is not None]
        if keep:
            track = b.track(name, unit=unit)
            for s, v in keep:
                b.counter(track, s, v)
