"""Pass 6, emit: the NEFF, a versioned, self-describing archive, and its safe loader.

A NEFF is a zip archive (members stored uncompressed so weights load fast):

- ``neff.json``      header: magic, format version, name, uuid, graph hash, target, compiler version,
                     core count, compile flags, and a sha256 of every other member;
- ``program.json``   the compiled :class:`~neuron_stack.ir.Program` (op table with placement, fusion,
                     module path and source of every op; tensor specs; partitions);
- ``weights.bin`` + ``weights.json``   the weights: raw tensor bytes and their layout
                     (:mod:`neuron_stack.isa.weights`; never pickled code). Older NEFFs hold
                     ``constants.pt`` (``torch.save``, read with ``weights_only=True``), still read;
- ``schedule/<p>.arrow`` + ``schedule.json``   each device partition's instruction table (Arrow IPC)
                     and its scalars (device_ns, busy_ns per engine, HBM bytes, FLOPs);
- ``sources.json``, ``source_files.json``   the source table and the text of every referenced file;
- ``compile.log``    the verbose compile log.

Loading checks all of it; a truncated, corrupt, wrong-version or wrong-target file raises
:class:`NeffError` whose message is one line naming the problem and the fix.

>>> import tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "bad.neff")
>>> _ = open(path, "wb").write(b"not a neff")
>>> try:
...     load(path)
... except NeffError as e:
...     print(str(e).split(":")[1].strip())
not a NEFF archive (no zip directory
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import uuid as uuidlib
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

import pyarrow as pa

from neuron_stack.ir import Program
from neuron_stack.isa import weights as weights_mod
from traces.safeio import special_kind

MAGIC = "NEFF-neuron_stack"
FORMAT_VERSION = 1


class NeffError(RuntimeError):
    """A NEFF that cannot be used; the message is one line naming the file, the problem and the fix."""


@dataclass(frozen=True)
class PartitionSchedule:
    """What a NEFF holds for one device partition: its instruction table (the contract columns of
    ``neuron_stack.compiler.schedule.TABLE_SCHEMA``, times relative to the partition start) and
    the scalars the runtime adds up at load."""

    table: pa.Table
    device_ns: int
    busy_ns: dict[str, int]                    # per engine (traces.vocab.ENGINES)
    hbm_read_bytes: int
    hbm_write_bytes: int
    spill_save_bytes: int = 0
    spill_reload_bytes: int = 0
    flops: int = 0
    # the profiler's record tables (compiler/records.py), members ``schedule/<p>.<name>.arrow``;
    # empty for a NEFF written before they existed
    records: dict = field(default_factory=dict, compare=False)

    def scalars(self) -> dict:
        """Everything but the tables, JSON-able (``schedule.json``)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("table", "records")}


@dataclass
class Neff:
    """A compiled graph: header, program, constants (inside ``program``), schedules, sources, log.

    Example: ``Neff.load("model.neff").header["target"]``.
    """

    header: dict
    program: Program
    schedules: dict[int, PartitionSchedule] = field(default_factory=dict)   # device partition index -> schedule
    source_files: dict[str, str] = field(default_factory=dict)
    log: str = ""

    @property
    def name(self) -> str:
        return self.header["name"]

    @property
    def target(self) -> str:
        return self.header["target"]

    def save(self, path: str | os.PathLike, weights: bool = True) -> Path:
        """Write the archive to ``path`` atomically (temp file + rename). Returns the path."""
        return save(self, path, weights)

    @staticmethod
    def load(path: str | os.PathLike, target: str | None = None) -> "Neff":
        return load(path, target)


def _table_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def members(neff: Neff) -> dict[str, bytes]:
    """Every member but the header and the weights, as bytes (shared by :func:`save` and the checksum)."""
    out: dict[str, bytes] = {
        "program.json": json.dumps(neff.program.to_json()).encode(),
        "compile.log": neff.log.encode(),
        "source_files.json": json.dumps(neff.source_files).encode(),
    }
    sources = {}
    for n in neff.program.nodes:
        if n.source is not None:
            sources[f"{n.source.file}:{n.source.line}"] = {"file": n.source.file, "line": n.source.line,
                                                           "function": n.source.function, "code": n.source.code}
    out["sources.json"] = json.dumps(list(sources.values())).encode()
    scalars = {}
    for p, s in neff.schedules.items():
        out[f"schedule/{p}.arrow"] = _table_bytes(s.table)
        for name, t in s.records.items():
            out[f"schedule/{p}.{name}.arrow"] = _table_bytes(t)
        scalars[str(p)] = s.scalars()
    out["schedule.json"] = json.dumps(scalars).encode()
    return out


def save(neff: Neff, path: str | os.PathLike, weights: bool = True) -> Path:
    """Write ``neff`` to ``path`` (see module docstring for the layout). Example: ``save(neff, "m.neff")``.

    ``weights=False`` leaves the weights out (header ``"weights": "external"``): the compile
    cache's entries, whose weights always come from the model being traced (most of a NEFF's bytes,
    and most of a cold compile's time, are the weights).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = members(neff)
    sums = {k: hashlib.sha256(v).hexdigest() for k, v in data.items()}
    tmp = path.with_name(f".{path.name}.{uuidlib.uuid4().hex[:8]}.tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as z:
        for k, v in data.items():
            z.writestr(k, v)
        if weights:   # streamed: the checksum is known once they are written, so the header goes last
            index, sums[weights_mod.BIN] = weights_mod.write_weights(z, neff.program.constants)
            z.writestr(weights_mod.INDEX, index)
            sums[weights_mod.INDEX] = hashlib.sha256(index).hexdigest()
        header = dict(neff.header, magic=MAGIC, format_version=FORMAT_VERSION,
                      weights="inline" if weights else "external", checksums=sums)
        z.writestr("neff.json", json.dumps(header, indent=1))
    neff.header = header
    os.replace(tmp, path)
    return path


def _fail(path, problem: str, fix: str = "recompile the model to regenerate it") -> NeffError:
    return NeffError(f"{path}: {problem}; {fix}")


def read_header(path: str | os.PathLike) -> dict:
    """Only the header of a NEFF (cheap). Raises :class:`NeffError` like :func:`load`."""
    path = Path(path)
    kind = special_kind(path)
    if kind is not None:   # zipfile would block on a FIFO or seek through /dev/zero forever
        raise _fail(path, f"{kind}, not a NEFF file", "pass the path of a .neff file")
    if not path.exists():
        raise NeffError(f"{path}: no such NEFF file; check the path or compile one with `neuron-cc compile`")
    try:
        with zipfile.ZipFile(path) as z:
            header = json.loads(z.read("neff.json"))
    except zipfile.BadZipFile:
        raise _fail(path, "not a NEFF archive (no zip directory: the file is truncated or not a NEFF)") from None
    except KeyError:
        raise _fail(path, "not a NEFF archive (no neff.json header)") from None
    except Exception as exc:  # a damaged archive raises many types (zlib.error, NotImplementedError, ...)
        raise _fail(path, f"unreadable NEFF header ({type(exc).__name__})") from None
    if not isinstance(header, dict) or header.get("magic") != MAGIC:
        raise _fail(path, "not a neuron_stack NEFF (bad magic)")
    if header.get("format_version") != FORMAT_VERSION:
        raise _fail(path, f"NEFF format version {header.get('format_version')} but this runtime reads "
                          f"version {FORMAT_VERSION}", "recompile it with this neuron_stack")
    return header


#: The per-partition scalars the runtime adds up at load (schedule.json): ints, busy_ns per engine.
SCHEDULE_SCALARS = ("device_ns", "hbm_read_bytes", "hbm_write_bytes", "flops")


#: Every count, byte total and duration in a NEFF is in [0, this): 2**62 ns is 146 years, and interval
#: ends must not overflow int64 (the trace store's bound, ``traces.intervals.MAX_NS``).
MAX_SCALAR = 1 << 62


def _in_range(v) -> bool:
    return type(v) is int and 0 <= v < MAX_SCALAR


def _check_scalars(path, partition: str, s) -> None:
    """A partition's schedule scalars: the schema's types, then signs and ranges (after the checksum,
    so these catch a NEFF written by a bug or edited by hand, before any figure is computed from it)."""
    ok = (isinstance(s, dict) and all(type(s.get(k)) is int for k in SCHEDULE_SCALARS)
          and isinstance(s.get("busy_ns"), dict)
          and all(isinstance(e, str) and type(v) is int for e, v in s["busy_ns"].items()))
    if not ok:
        raise _fail(path, f"malformed schedule scalars for partition {partition!r} in schedule.json")
    for key in (*SCHEDULE_SCALARS, *(f"busy_ns.{e}" for e in s["busy_ns"])):
        v = s["busy_ns"][key[8:]] if key.startswith("busy_ns.") else s[key]
        if not _in_range(v):
            raise _fail(path, f"schedule.json partition {partition!r}: {key} = {v} is outside [0, 2**62)")


def _check_program(path, program: Program, schedules: dict) -> None:
    """The program's own consistency: inputs, outputs and partitions name nodes it has, shapes are sizes."""
    names = {n.name for n in program.nodes}
    if not program.nodes or not program.output_names:
        raise _fail(path, "its program is empty (no nodes or no outputs)")

    def leaves(v):
        if isinstance(v, (list, tuple)):
            for x in v:
                yield from leaves(x)
        elif isinstance(v, str):
            yield v

    for what, wanted in (("input", program.input_names), ("output", list(leaves(program.output_names))),
                         *(("partition node", list(part.nodes)) for part in program.partitions)):
        missing = next((w for w in wanted if w not in names and w not in program.constants), None)
        if missing is not None:
            raise _fail(path, f"its program is inconsistent: {what} {missing!r} is not one of its nodes")
    for n in program.nodes:
        for spec in n.outputs:
            if not all(_in_range(d) or d == -1 for d in spec.shape):   # -1: data-dependent (a CPU op's output)
                raise _fail(path, f"its program is inconsistent: node {n.name!r} has shape {spec.shape}")
    devices = {p.index for p in program.partitions if p.kind != "cpu"}
    if not set(schedules) <= devices:
        raise _fail(path, f"schedule.json names device partitions {sorted(set(schedules) - devices)} the "
                          "program does not have")


class RecordTables(Mapping):
    """One partition's record tables (members ``schedule/<p>.<name>.arrow``: Flow, SemaphoreUpdate, ...),
    read and checked against their checksums on first use. Only a profiler reads them, and they are most
    of a NEFF's bytes (50 of a BERT-base cache entry's 57 MB), so a compile-cache hit leaves them on disk.
    Example: ``neff.schedules[0].records["Flow"]``.
    """

    def __init__(self, path: Path, members: dict[str, tuple[str, str]]):
        self._path, self._members = path, members      # name -> (member, sha256)
        self._tables: dict | None = None

    def _read(self) -> dict:
        if self._tables is None:
            tables = {}
            try:
                with zipfile.ZipFile(self._path) as z:
                    for name, (member, digest) in self._members.items():
                        blob = z.read(member)
                        if hashlib.sha256(blob).hexdigest() != digest:
                            raise _fail(self._path, f"checksum mismatch in member {member} (the file changed "
                                                    "after it was loaded, or is corrupt)")
                        tables[name] = pa.ipc.open_file(pa.py_buffer(blob)).read_all()
            except NeffError:
                raise
            except Exception as exc:   # deleted or replaced since the load: a damaged archive raises many types
                raise _fail(self._path, f"its record tables cannot be read ({type(exc).__name__}: "
                                        f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
            self._tables = tables
        return self._tables

    def __getitem__(self, name: str) -> pa.Table:
        return self._read()[name]

    def __iter__(self):
        return iter(self._members)

    def __len__(self) -> int:
        return len(self._members)


_RECORD_MEMBER = re.compile(r"schedule/(\d+)\.(\w+)\.arrow")


def load(path: str | os.PathLike, target: str | None = None, constants: dict | None = None,
         lazy_records: bool = False) -> Neff:
    """Read and verify a NEFF. ``target`` (if given) must match the NEFF's target.

    ``constants``: the weights, when the caller already holds tensors proven equal to the NEFF's (a
    compile-cache hit: the graph hash covers every weight byte): the NEFF's own weights, the bulk of
    the file, are then not read, and a NEFF saved without weights can be loaded. ``lazy_records``: the
    profiler's record tables stay on disk until read (:class:`RecordTables`; for a file that stays where it
    is, a compile-cache entry). Example: ``neff = load("model.neff", target="trn1")``.
    """
    path = Path(path)
    header = read_header(path)
    if header.get("weights") == "external" and constants is None:
        raise _fail(path, "this NEFF holds no weights (a compile-cache entry: trace supplies the model's)",
                    "load a NEFF written by NeuronModule.save, neuron-cc -o or trace(compiler_workdir=...)")
    if target is not None and header.get("target") != target:
        raise _fail(path, f"compiled for target {header.get('target')} but loaded on {target}",
                    f"recompile with --target {target}")
    sums = header["checksums"]
    try:
        lazy: dict[str, dict[str, tuple[str, str]]] = {}      # partition -> record name -> (member, sha256)
        with open(path, "rb") as f, zipfile.ZipFile(f) as z:
            data = {}
            for name, digest in sums.items():
                if name in ("constants.pt", weights_mod.BIN) and constants is not None:
                    continue      # the caller's tensors (a cache hit), or read below in one piece
                if name == weights_mod.BIN:
                    continue
                m = _RECORD_MEMBER.fullmatch(name) if lazy_records else None
                if m is not None:
                    lazy.setdefault(m[1], {})[m[2]] = (name, digest)
                    continue
                blob = z.read(name)
                if hashlib.sha256(blob).hexdigest() != digest:
                    raise _fail(path, f"checksum mismatch in member {name} (the file is corrupt)")
                data[name] = blob
            if constants is None and weights_mod.BIN in sums:
                constants = weights_mod.read_weights(f, z, data[weights_mod.INDEX], sums[weights_mod.BIN])
    except NeffError:
        raise
    except weights_mod.WeightsError as exc:
        raise _fail(path, str(exc)) from None
    except Exception as exc:  # a damaged archive raises many types (zlib.error, NotImplementedError, ...)
        raise _fail(path, f"corrupt NEFF archive ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    try:
        pj = json.loads(data["program.json"])
        if constants is None:
            import torch  # only here: a NEFF's header and program are read without it (tools/capture.py)

            constants = torch.load(io.BytesIO(data["constants.pt"]), weights_only=True)
        elif sorted(constants) != pj.get("constant_names"):
            raise _fail(path, "its weights are not the ones given")
        program = Program.from_json(pj, constants)
        scalars = json.loads(data["schedule.json"])
        schedules = {}
        for p, s in scalars.items():
            _check_scalars(path, p, s)
            table = pa.ipc.open_file(pa.py_buffer(data[f"schedule/{p}.arrow"])).read_all()
            known = {f.name for f in fields(PartitionSchedule)} - {"table", "records"}
            prefix = f"schedule/{p}."
            records = RecordTables(path, lazy[p]) if p in lazy else {
                m[len(prefix):-len(".arrow")]: pa.ipc.open_file(pa.py_buffer(data[m])).read_all()
                for m in data if m.startswith(prefix) and m.endswith(".arrow") and m != f"{prefix}arrow"}
            schedules[int(p)] = PartitionSchedule(table=table, records=records,
                                                  **{k: v for k, v in s.items() if k in known})
        _check_program(path, program, schedules)
        source_files = json.loads(data["source_files.json"])
        log = data["compile.log"].decode()
    except NeffError:
        raise
    except Exception as exc:  # a member that passed its checksum but does not parse: written by a bug
        raise _fail(path, f"unreadable NEFF member ({type(exc).__name__})") from None
    return Neff(header=header, program=program, schedules=schedules, source_files=source_files, log=log)
