"""DDP on ``neuron`` tensors: a process group whose collectives take device tensors.

``process_group()`` wraps the gloo group ``neuron_stack.runtime.distributed.init()`` joined (under
``torchrun``). Each all-reduce moves the real data with gloo over the tensors' values and records what the
same ring all-reduce costs on the simulated cores (NeuronLink within a node, EFA between nodes), starting
when the slowest rank arrives, exactly as ``all_reduce_gradients`` does for compiled training.

    world = neuron_stack.runtime.distributed.init()
    ddp = DistributedDataParallel(model.to("neuron"), process_group=process_group())

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
            dist.all_gather(clocks, torch.tensor([arrival], dtype=torch.int64), group=self.cpu)
            dist.all_reduce(_value(t), op=op, group=self.cpu)
            self._record(t, arrival, max(int(c) for c in clocks))
        return _finished(tensors)

    def _record(self, t: torch.Tensor, arrival: int, start: int) -> None:
        w = self.world
        session = Session.get(w.target)
        p = plan_collective("all_reduce", t.numel(), str(t.dtype).removeprefix("torch."), w.group, session.profile)
        record_collective(session, p, [w.core], [arrival], start, tag=f"rank{w.rank}")
        clock.advance(real_ns=clock.now_ns() - (start + p.dur_ns), simulated_ns=0)   # all ranks leave together

    def broadcast(self, tensors, opts):
        for t in tensors:
            dist.broadcast(_value(t), src=opts.rootRank, group=self.cpu)
        return _finished(tensors)

    def allgather(self, outputs, inputs, opts=None):
        for outs, t in zip(outputs, inputs):
            dist.all_gather([_value(o) for o in outs], _value(t), group=self.cpu)
        return _finished(outputs)

    def barrier(self, opts=None):
        dist.barrier(group=self.cpu)
        return _finished(None)


def process_group() -> NeuronProcessGroup:
    """The process group for ``DistributedDataParallel(model, process_group=...)`` on ``neuron`` tensors.

    Call ``neuron_stack.runtime.distributed.init()`` first (it joins the torchrun job and binds a core).
    Example: ``DistributedDataParallel(model.to("neuron"), process_group=process_group())``.
    """
    w = world()
    if not dist.is_initialized():     # a one-rank world without torchrun: a local gloo group of one
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return NeuronProcessGroup(w, dist.group.WORLD)
