"""Multi-process training under ``torchrun``: one NeuronCore per rank, gloo carries the real data.

``init()`` binds the rank to a core (``NEURON_RT_VISIBLE_CORES`` = ``LOCAL_RANK`` unless set),
starts ``torch.distributed`` with the gloo backend and a bounded timeout, and learns every
rank's (node, core). ``all_reduce_gradients(model)`` averages the gradients over the ranks with a
real gloo all-reduce and records what the same all-reduce costs on the simulated hardware: the
runtime's algorithm for its size over the ranks' cores (NeuronLink within a node, EFA between nodes,
see :mod:`neuron_stack.runtime.collectives`). Ranks exchange their projected clocks, so the collective
starts when the slowest rank arrives: the others' waits show up as ``sem_wait_ns`` on their
``cc`` instructions, which is how a straggler is found (docs/multicore.md).

Each rank's trace carries ``runs.rank`` and ``runs.node`` and all ranks write into the same
``NEURON_RT_INSPECT_OUTPUT_DIR``, so ``traces.finalize`` makes one profile of the whole job.

    torchrun --nproc-per-node 2 sample_workloads/ddp_train.py --small
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from neuron_stack.device import clock
from neuron_stack.runtime.collectives import Group, record_collective
from neuron_stack.runtime.collectives import plan as plan_collective
from neuron_stack.runtime.launch_env import DistributedError
from neuron_stack.runtime.launch_env import env_int as _env_int
from neuron_stack.runtime.session import Session

DEFAULT_TIMEOUT_S = 60


@dataclass
class World:
    """This rank's place in the job: rank, world size, node, and the (node, core) of every rank."""

    rank: int
    world_size: int
    local_rank: int
    node: int
    core: int
    ranks: list[tuple[int, int]]
    target: str
    timeout_s: float

    @property
    def group(self) -> Group:
        return Group(tuple(self.ranks))


_world: World | None = None


def _env_timeout() -> float:
    raw = os.environ.get("NEURON_STACK_DIST_TIMEOUT", "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw[:40])
    except ValueError:
        value = -1.0
    if not 0 < value < 1e6 or len(raw) > 40:   # inf, nan, negative or a page of digits
        raise DistributedError(f"NEURON_STACK_DIST_TIMEOUT={raw[:40]!r} is not a timeout: set seconds such "
                               "as 60") from None
    return value


def init(target: str = "trn1", timeout_s: float | None = None) -> World:
    """Join the job started by ``torchrun`` and bind this rank to one NeuronCore.

    Call it before compiling anything (the core is reserved when the runtime starts).
    ``timeout_s`` (default ``NEURON_STACK_DIST_TIMEOUT`` or 60 s) bounds every collective, so a
    dead peer makes the others fail instead of hanging. Without torchrun it is a 1-rank world.

    >>> world = init()          # doctest: +SKIP
    >>> world.rank, world.core   # doctest: +SKIP
    (0, 0)
    """
    rank, world_size = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    timeout_s = timeout_s or _env_timeout()

    def gather(pair):
        if not dist.is_initialized():
            try:
                dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
            except Exception as exc:   # bad MASTER_ADDR/port, or peers that never came
                raise DistributedError(f"rank {rank} could not join the gloo group ({_short(exc)}): launch with "
                                       f"torchrun --nproc-per-node N and check MASTER_ADDR/MASTER_PORT") from None
        gathered: list = [None] * world_size
        dist.all_gather_object(gathered, pair)
        return gathered

    return join(rank, world_size, target, timeout_s, gather)


def join(rank: int, world_size: int, target: str, timeout_s: float, gather) -> World:
    """Bind this rank to one NeuronCore and learn every rank's ``(node, core)`` through ``gather`` (called
    with this rank's pair when ``world_size > 1``, it returns the list of all ranks' pairs). :func:`init`
    gathers over gloo; the ``neuron`` torch.distributed backend over its own group.

    >>> join(0, 1, "trn1", 60.0, gather=None).ranks     # doctest: +SKIP
    [(0, 0)]
    """
    global _world
    local_rank, node = _env_int("LOCAL_RANK", rank), _env_int("GROUP_RANK", 0)
    os.environ.setdefault("NEURON_RT_VISIBLE_CORES", str(local_rank))   # one core per rank
    os.environ.setdefault("NEURON_PROCESS_TAG", f"rank{rank}")
    session = Session.get(target)
    core = session.cores[0]
    ranks = [tuple(r) for r in gather((node, core))] if world_size > 1 else [(node, core)]
    _world = World(rank, world_size, local_rank, node, core, ranks, target, timeout_s)
    return _world


def world() -> World:
    """The world :func:`init` joined (raises if it was not called)."""
    if _world is None:
        raise DistributedError("neuron_stack.runtime.distributed.init() was not called: call it before training")
    return _world


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:160] + ("..." if len(text) > 160 else "")


def all_reduce_gradients(model: torch.nn.Module, average: bool = True) -> int:
    """Average ``model``'s gradients over all ranks (real gloo all-reduce, one flat bucket) and
    record the simulated all-reduce on this rank's core. Returns the bucket's bytes.

    A peer that died or hangs past the timeout raises :class:`DistributedError` (one line).
    Example: ``loss.backward(); all_reduce_gradients(model); opt.step()``.
    """

    w = world()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return 0
    flat = torch.cat([g.reshape(-1) for g in grads])
    arrival = clock.now_ns()
    if w.world_size > 1:
        try:
            # projected clocks: the collective starts when the slowest rank arrives
            clocks = [torch.zeros(1, dtype=torch.int64) for _ in range(w.world_size)]
            dist.all_gather(clocks, torch.tensor([arrival], dtype=torch.int64))
            dist.all_reduce(flat)
        except Exception as exc:
            raise DistributedError(f"rank {w.rank} lost its peers during the gradient all-reduce ({_short(exc)}): "
                                   f"another rank died or stalled for more than {w.timeout_s:.0f} s "
                                   f"(NEURON_STACK_DIST_TIMEOUT); check the other ranks' output") from None
        start = max(int(c) for c in clocks)
    else:
        start = arrival
    if average and w.world_size > 1:
        flat /= w.world_size
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[offset: offset + n].view_as(g))
        offset += n
    p = plan_collective("all_reduce", flat.numel(), str(flat.dtype).removeprefix("torch."), w.group,
                        Session.get(w.target).profile)
    record_collective(Session.get(w.target), p, [w.core], [arrival], start, tag=f"rank{w.rank}")
    clock.advance(real_ns=clock.now_ns() - (start + p.dur_ns), simulated_ns=0)   # all ranks leave together
    return flat.numel() * flat.element_size()


def shutdown() -> None:
    """Leave the process group (call at the end of training)."""
    if dist.is_initialized():
        dist.destroy_process_group()
