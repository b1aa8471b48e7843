"""DDP on ``neuron`` tensors: a process group whose collectives take device tensors.

``import neuron_stack`` (or ``import torch``) registers it as the ``neuron`` torch.distributed backend, so
under ``torchrun``::

    torch.distributed.init_process_group("neuron")    # binds this rank to one NeuronCore, as runtime init()
    ddp = DistributedDataParallel(model.to("neuron"))  # no process_group: the default group is this one

(or, after ``neuron_stack.runtime.distributed.init()``, pass ``process_group=process_group()``). Each
all-reduce moves the real data with gloo over the tensors' values and records what the same all-reduce
costs on the simulated cores (NeuronLink within a node, EFA between nodes), starting when the slowest rank
arrives, exactly as ``all_reduce_gradients`` does for compiled training.

>>> NeuronProcessGroup.__mro__[1].__name__
'ProcessGroup'
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future

from neuron_stack.device import clock
from neuron_stack.eager.dispatch import NeuronTensor
from neuron_stack.runtime.collectives import plan as plan_collective
from neuron_stack.runtime.collectives import record_collective
from neuron_stack.runtime.distributed import World, world
from neuron_stack.runtime.session import Session


def _finished(result) -> dist.Work:
    fut = Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


def _value(t: torch.Tensor) -> torch.Tensor:
    return t.elem if isinstance(t, NeuronTensor) else t


class NeuronProcessGroup(dist.ProcessGroup):
    """The collectives DDP calls (all-reduce, broadcast, all-gather, barrier) over ``neuron`` tensors."""

    def __init__(self, w: World, cpu_group):
        super().__init__(w.rank, w.world_size)
        self.world = w
        self.cpu = cpu_group

    def getBackendName(self) -> str:
        return "neuron"

    def allreduce(self, tensors, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        for t in tensors:
            arrival = clock.now_ns()
            clocks = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world.world_size)]
            self.cpu.allgather([clocks], [torch.tensor([arrival], dtype=torch.int64)]).wait()
            reduce = dist.AllreduceOptions()
            reduce.reduceOp = op
            self.cpu.allreduce([_value(t)], reduce).wait()
            self._record(t, arrival, max(int(c) for c in clocks))
        return _finished(tensors)

    def _record(self, t: torch.Tensor, arrival: int, start: int) -> None:
        w = self.world
        session = Session.get(w.target)
        p = plan_collective("all_reduce", t.numel(), str(t.dtype).removeprefix("torch."), w.group, session.profile)
        record_collective(session, p, [w.core], [arrival], start, tag=f"rank{w.rank}")
        clock.advance(real_ns=clock.now_ns() - (start + p.dur_ns), simulated_ns=0)   # all ranks leave together

    def broadcast(self, tensors, opts):
        self.cpu.broadcast([_value(t) for t in tensors], opts).wait()
        return _finished(tensors)

    def allgather(self, outputs, inputs, opts=None):
        self.cpu.allgather([[_value(o) for o in outs] for outs in outputs], [_value(t) for t in inputs],
                           opts or dist.AllgatherOptions()).wait()
        return _finished(outputs)

    def barrier(self, opts=None):
        self.cpu.barrier(opts or dist.BarrierOptions()).wait()
        return _finished(None)


def create_backend(store, rank: int, size: int, timeout) -> NeuronProcessGroup:
    """The ``neuron`` backend's creator (``torch.distributed.Backend.register_backend``): a gloo group over
    ``store`` moves the values; this rank is bound to one NeuronCore (``runtime.distributed.join``) with
    the target ``NEURON_CC_FLAGS`` names. Example: ``torch.distributed.init_process_group("neuron")``."""
    from neuron_stack.frontend.flags import parse_flags
    from neuron_stack.runtime.distributed import join

    gloo = dist.ProcessGroupGloo(store, rank, size, timeout)

    def gather(pair):
        outs = [torch.zeros(2, dtype=torch.int64) for _ in range(size)]
        gloo.allgather([outs], [torch.tensor(pair, dtype=torch.int64)]).wait()
        return [tuple(int(v) for v in o) for o in outs]

    w = join(rank, size, parse_flags()["target"], timeout.total_seconds(), gather)
    return NeuronProcessGroup(w, gloo)


def process_group() -> NeuronProcessGroup:
    """The process group for ``DistributedDataParallel(model, process_group=...)`` on ``neuron`` tensors.

    Call ``neuron_stack.runtime.distributed.init()`` first (it joins the torchrun job and binds a core).
    Example: ``DistributedDataParallel(model.to("neuron"), process_group=process_group())``.
    """
    w = world()
    if not dist.is_initialized():     # a one-rank world without torchrun: a local gloo group of one
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return NeuronProcessGroup(w, dist.group.WORLD)
