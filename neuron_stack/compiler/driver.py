"""The compiler driver (the ``neuronx-cc compile`` analogue): runs the passes in order and emits a NEFF.

legalize -> partition -> fuse -> lower+schedule (``neuron_stack.compiler.schedule.build_schedule``, or the
roofline model of :mod:`neuron_stack.compiler.roofline`, loudly, when lowering a partition fails) -> emit.

>>> import torch
>>> from neuron_stack.frontend.export import capture
>>> from neuron_stack.frontend.flags import parse_flags
>>> prog = capture(torch.nn.Linear(4, 2), (torch.randn(3, 4),))
>>> neff = compile_program(prog, parse_flags(env=""))
>>> neff.header["target"], sorted(neff.schedules)
('trn1', [0])
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import threading
import time
import uuid as uuidlib
import weakref

import torch
import xxhash

from neuron_stack.compiler import hooks, schedule
from neuron_stack.compiler.fuse import fuse
from neuron_stack.compiler.legalize import legalize, nbytes
from neuron_stack.compiler.partition import partition, refs
from neuron_stack.compiler.roofline import build_roofline
from neuron_stack.compiler.support import describe_support, support_counts
from neuron_stack.compiler.version import compiler_version
from neuron_stack.device.profiles import get_profile
from neuron_stack.frontend.export import file_texts, sources_in
from neuron_stack.frontend.flags import command_line, compiler_flags, flags_hash
from neuron_stack.ir import Program, paused_gc
from neuron_stack.isa.neff import Neff, PartitionSchedule
from traces.vocab import FALLBACK_PLACEMENT

#: Bytes of device instruction memory per instruction ("model_code" in the memory accounting).
INSTRUCTION_BYTES = 64
#: Fixed runtime reservation per core ("runtime_memory"): queues, semaphores, DMA rings.
RUNTIME_MEMORY_BYTES = 64 * 2**20


def graph_hash(program: Program, salt: str = "") -> str:
    """A hash of what determines the compiled artifact: ops, arguments, shapes, sources and weights.

    Source lines are part of it because the NEFF carries them into the profile; weights because
    the NEFF inlines them (a model with other weights must not hit the cache).
    """
    h = hashlib.sha256(salt.encode())
    d = program.to_json()
    for k in ("log", "flags", "partitions", "stats"):
        d.pop(k, None)
    for n in d["nodes"]:
        n.pop("kernel", None)     # filled by the lowering; the kernel's source hash is in the op name
    h.update(json.dumps(d, sort_keys=True, default=str).encode())
    for name in sorted(program.constants):
        t = program.constants[name]
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}:".encode())
        if t.device.type != "meta":   # projection mode: shapes only, there are no weights to hash
            h.update(tensor_digest(t))
    return str(int(h.hexdigest()[:15], 16))


#: Weight digests already computed in this process: id(tensor) -> (data address, version counter, digest).
#: An entry goes when its tensor does (weakref.finalize), so an id is never reused while it is here.
_DIGESTS: dict[int, tuple[int, int, bytes]] = {}


def tensor_digest(t: torch.Tensor) -> bytes:
    """xxHash3-128 of a tensor's bytes, remembered per tensor object and version counter in this process.

    The front end hands out one detached tensor per parameter (``frontend.export.detached``), so a
    second trace of the same model (a warm compile) hashes nothing. In-place updates bump the version
    counter (``p.copy_``, optimizer steps, ``load_state_dict``) and are re-hashed. xxHash3, not sha256:
    a new process hashes every weight before its cache hit (BERT-base: 0.04 s instead of 0.37 s);
    128 bits keep an accidental collision out of reach (the key is not a defence against forgery). A write that bypasses
    it (``p.data.mul_()``) can leave a stale digest; a cache hit is still right, because it runs the
    captured tensors, never the cached copy of the weights (``compile_cached``).

    >>> tensor_digest(torch.zeros(2)) == tensor_digest(torch.zeros(2).clone())
    True
    """
    key = id(t)
    hit = _DIGESTS.get(key)
    if hit is not None and hit[0] == t.data_ptr() and hit[1] == t._version:
        return hit[2]
    c = t.detach().contiguous()
    digest = xxhash.xxh3_128(c.view(-1).view(torch.uint8).numpy().data if c.numel() else b"").digest()
    if hit is None:
        weakref.finalize(t, _DIGESTS.pop, key, None)
    _DIGESTS[key] = (t.data_ptr(), t._version, digest)
    return digest


def digest_in_background(model: torch.nn.Module) -> threading.Thread:
    """Start hashing ``model``'s weights (:func:`tensor_digest` of the tensors the capture will hand out) on a
    thread, to overlap the capture: xxHash releases the GIL and ``torch.export`` never reads weight values, so
    a new process's cache hit pays for its capture, not for its capture and then 0.4 GB of hashing (BERT-base).
    :func:`graph_hash` finds the digests made; join the thread first. A failure here only means that
    :func:`graph_hash` hashes that tensor itself.

    >>> digest_in_background(torch.nn.Linear(2, 2)).join()
    """
    from neuron_stack.frontend.export import detached

    tensors = [detached(t) for t in model.state_dict(keep_vars=True).values()
               if isinstance(t, torch.Tensor) and t.device.type == "cpu"]

    def run():
        for t in tensors:
            try:
                tensor_digest(t)
            except Exception:   # graph_hash hashes it again, and reports what is wrong
                pass
    thread = threading.Thread(target=run, name="neuron-weight-digests", daemon=True)
    thread.start()
    return thread


def _schedule(program: Program, part: int, profile, flags: dict, detail: bool = True) -> tuple[object, str]:
    """Partition ``part``'s instruction schedule, or the roofline estimate if lowering fails.

    The fallback is a safety net, never a normal path: it is loud (compile log and stderr)."""
    try:
        # looked up on the module at call time: a test replaces it to exercise the fallback
        return schedule.build_schedule(program, part, profile, flags, detail=detail), "instruction"
    except Exception as exc:  # numbers do not depend on timing: a lowering gap must not fail the compile
        msg = (f"warning: instruction-level lowering failed on partition #{part} "
               f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
               "timed with the roofline model instead")
        program.log.append(f"schedule: {msg}")
        print(f"neuron_stack: {msg}", file=sys.stderr)
        return build_roofline(program, part, profile, flags), "roofline"


def memory_plan(program: Program) -> dict:
    """Device bytes by category for one loaded copy (the runtime adds them per core).

    tensors = peak of live inputs, activations and outputs over the op order (views are free);
    constants = weights; model_code = instructions x INSTRUCTION_BYTES; model_shared_scratchpad =
    the largest single activation (the staging buffer for SBUF spills); io_tensors = the part of tensors that is
    the graph's inputs and outputs (not a category of its own: SystemProfileHbmUsage's io_bytes).
    """
    last_use: dict[str, int] = {}
    for i, n in enumerate(program.nodes):
        for r in refs([n.args, n.kwargs]):
            last_use[r] = i
    dies_at: dict[int, list[str]] = {}      # node index -> the values last read there
    for r, j in last_use.items():
        dies_at.setdefault(j, []).append(r)
    live = peak = largest = 0
    sizes: dict[str, int] = {}
    for i, n in enumerate(program.nodes):
        if n.target == "placeholder" or (n.is_compute and n.op_class != "view" and n.placement == "device"):
            sizes[n.name] = sum(nbytes(s) for s in n.outputs)
            live += sizes[n.name]
            largest = max(largest, sizes[n.name])
        peak = max(peak, live)
        for r in dies_at.get(i, ()):
            live -= sizes.pop(r, 0)
    constants = sum(t.numel() * t.element_size() for t in program.constants.values())
    outputs = set(_names(program.output_names))
    io = {n.name: sum(nbytes(s) for s in n.outputs) for n in program.nodes
          if n.target == "placeholder" or n.name in outputs}
    return {"tensors": peak, "constants": constants, "model_shared_scratchpad": largest,
            "runtime_memory": RUNTIME_MEMORY_BYTES, "io_tensors": min(peak, sum(io.values()))}


def _names(value) -> list[str]:
    """The node names in ``Program.output_names`` (a name, or nested lists of them, or references)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _names(v)]
    return list(refs(value))


@contextlib.contextmanager
def _timed(passes: dict[str, float], name: str):
    """Add the wall time of the block to ``passes[name]`` (a pass run per partition adds up)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        passes[name] = passes.get(name, 0.0) + time.perf_counter() - t0


def compile_program(program: Program, flags: dict, *, partitioner_config=None,
                    graph_hash_value: str | None = None, detail: bool = True) -> Neff:
    """Run every pass on ``program`` (annotated in place) and return the in-memory :class:`Neff`.

    ``flags`` comes from :func:`neuron_stack.frontend.flags.parse_flags`. ``detail=False``: the timings
    only, for a caller that reads nothing else (a projection): no record tables, no operand text (nearly
    half of a 10,000-token prefill's compile), so the NEFF cannot run. Example in the module docstring.
    """
    with paused_gc():
        return _compile_program(program, flags, partitioner_config, graph_hash_value, detail)


def _compile_program(program: Program, flags: dict, partitioner_config, graph_hash_value: str | None,
                     detail: bool = True) -> Neff:
    t0 = time.perf_counter()
    profile = get_profile(flags["target"], flags.get("lnc"))
    program.flags = compiler_flags(flags)
    ghash = graph_hash_value or graph_hash(program)
    recorder = hooks.active_recorder()
    extract = recorder is not None
    if extract:  # e.g. neuron_parallel_compile's collect run: record the graph, skip the costly lowering
        recorder.record(program, flags, partitioner_config, ghash)
    program.log.append(f"neuronx-cc compile {command_line(flags)} -- {program.name}: "
                       f"{sum(n.is_compute for n in program.nodes)} ops")
    natural = None
    if getattr(partitioner_config, "ops_to_partition", None):
        mark = len(program.log)
        legalize(program)            # placement without forcing: the support share analyze reports
        natural = support_counts(program)
        del program.log[mark:]
    passes: dict[str, float] = {}   # pass -> seconds, in the log and in program.stats["pass_s"]
    with _timed(passes, "legalize"):
        legalize(program, partitioner_config)
        natural = natural or support_counts(program)
    with _timed(passes, "partition"):
        partition(program)
    if partitioner_config is not None:  # the limits are applied by trace (on cache hits too)
        program.log.append(f"partitioner: {describe_support(natural)[1]}; {len(program.partitions)} subgraphs")
    with _timed(passes, "fuse"):
        fuse(program)
    schedules: dict[int, PartitionSchedule] = {}
    timings: set[str] = set()
    instructions = 0
    for p in program.partitions:
        if p.kind != "device":
            continue
        with _timed(passes, "lower+schedule"):
            if extract:
                s, timing = build_roofline(program, p.index, profile, flags), "roofline"
            else:
                s, timing = _schedule(program, p.index, profile, flags, detail)
        timings.add(timing)
        schedules[p.index] = PartitionSchedule(
            table=s.table, busy_ns={k: int(v) for k, v in s.busy_ns.items()}, device_ns=int(s.device_ns),
            hbm_read_bytes=int(s.hbm_read_bytes), hbm_write_bytes=int(s.hbm_write_bytes),
            spill_save_bytes=int(s.spill_save_bytes), spill_reload_bytes=int(s.spill_reload_bytes),
            flops=int(s.flops), records=s.records)
        instructions += s.table.num_rows
        program.log.append(f"schedule: partition #{p.index}: {s.table.num_rows} instructions, "
                           f"{s.device_ns / 1e3:.1f} us on the device ({timing} timing)")
    # one roofline-timed partition makes the whole graph's timing an estimate: say so
    timing = "roofline" if "roofline" in timings else "instruction"
    with _timed(passes, "memory_plan"):
        memory = memory_plan(program)
    memory["model_code"] = instructions * INSTRUCTION_BYTES
    fallbacks = [n for n in program.nodes if n.placement == FALLBACK_PLACEMENT and n.is_compute]
    # weights on the meta device (a model built from its config alone): projection mode, numbers=none
    numbers = "none" if any(getattr(t, "is_meta", False) for t in program.constants.values()) else "cpu"
    program.stats = {"memory": memory, "timing_model": timing, "numbers": numbers, "num_instructions": instructions,
                     "support": natural,
                     "num_ops": sum(n.is_compute for n in program.nodes),
                     "num_device_ops": sum(n.is_compute and n.placement == "device" for n in program.nodes),
                     "num_fallbacks": len(fallbacks), "compile_s": time.perf_counter() - t0,
                     "pass_s": {k: round(v, 6) for k, v in passes.items()}}
    program.log.append("pass times: " + ", ".join(f"{k} {v:.3f} s" for k, v in passes.items()))
    program.log.append(f"Compiler status PASS ({len(program.partitions)} partitions, {len(fallbacks)} ops on the "
                       f"host CPU, {instructions} instructions)")
    header = {"name": program.name, "uuid": uuidlib.uuid4().hex, "hash": ghash, "flags_hash": flags_hash(flags),
              "target": flags["target"], "compiler_version": compiler_version(), "core_count": 1,
              "flags": compiler_flags(flags), "timing_model": timing}
    files = file_texts([s.file for s in sources_in(program)])
    return Neff(header=header, program=program, schedules=schedules, source_files=files,
                log="\n".join(program.log) + "\n")
