"""The ``neuron`` tensor: a wrapper tensor whose device is ``neuron:i`` and whose value is a CPU tensor
(the simulated HBM), plus device memory accounting against the core's HBM.

Every ATen op on it reaches :meth:`NeuronTensor.__torch_dispatch__`, which hands it to
:mod:`neuron_stack.eager.dispatch` (compile the op once into a NEFF, run it on the simulated core).
Autograd sits above the dispatch, so ``backward()`` runs the same way, op by op.

>>> import torch, neuron_stack.eager as eager
>>> eager.register()
>>> x = torch.ones(2, device="neuron")
>>> type(x).__name__, str(x.device), x.cpu().tolist()
('NeuronTensor', 'neuron:0', [1.0, 1.0])
"""
from __future__ import annotations

import threading
import weakref

import torch

from neuron_stack.runtime.errors import OutOfDeviceMemory


class NeuronTensor(torch.Tensor):
    """A tensor on a simulated NeuronCore. ``elem`` holds its value (a CPU tensor standing for HBM)."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor, index: int = 0):
        return torch.Tensor._make_wrapper_subclass(
            cls, elem.size(), strides=elem.stride(), storage_offset=elem.storage_offset(), dtype=elem.dtype,
            layout=elem.layout, device=torch.device("neuron", index), requires_grad=elem.requires_grad)

    def __init__(self, elem: torch.Tensor, index: int = 0):
        self.elem = elem
        MEMORY.track(self, index)

    def __repr__(self, *, tensor_contents=None) -> str:
        body = repr(self.elem).removeprefix("tensor(").rstrip(")")
        return f"tensor({body}, device='{self.device}')"

    # traceable wrapper subclass: dynamo and aot_autograd trace through it to graphs on ``elem``
    def __tensor_flatten__(self):
        return ["elem"], self.device.index or 0

    @staticmethod
    def __tensor_unflatten__(inner, index, outer_size, outer_stride):
        return NeuronTensor(inner["elem"], index)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        from neuron_stack.eager.dispatch import dispatch
        return dispatch(func, args, kwargs or {})


def wrap(elem: torch.Tensor, index: int) -> NeuronTensor:
    """A device tensor holding ``elem``. Example: ``wrap(torch.zeros(2), 0).device`` -> ``neuron:0``."""
    return NeuronTensor(elem, index)


class DeviceMemory:
    """Bytes of device tensors alive per device index, checked against the core's HBM.

    Views share their base's storage and are counted once; memory is given back when the last tensor
    using a storage dies. What compiled NEFFs hold (weights, code, scratchpad) is already charged by
    the runtime per core, so a tensor fits only in what they leave free.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self.storages: dict[int, list] = {}       # storage data_ptr -> [nbytes, users, index]
        self.allocated: dict[int, int] = {}
        self.peak: dict[int, int] = {}
        self.session_of = None                    # index -> (Session, core); set by register()

    def track(self, t: NeuronTensor, index: int) -> None:
        if type(t.elem) is not torch.Tensor:      # a fake or functional value while tracing: no memory
            return
        storage = t.elem.untyped_storage()
        key = storage.data_ptr()
        nbytes = storage.nbytes()
        with self._lock:
            entry = self.storages.get(key)
            if entry is None:
                if nbytes:
                    self._charge(index, nbytes, t)
                entry = self.storages[key] = [nbytes, 0, index]
            entry[1] += 1
        # on the value, not the wrapper: Module.to swaps wrappers (torch.utils.swap_tensors refuses weakrefs)
        weakref.finalize(t.elem, self._release, key)

    def _charge(self, index: int, nbytes: int, t: NeuronTensor) -> None:
        session, core = self.session_of(index)
        used = session.device_memory[core]
        free = session.profile.hbm_bytes_per_core - sum(used.values())
        if nbytes > free:
            from neuron_stack.eager.dispatch import where_text
            session.live.count_error("runtime")
            raise OutOfDeviceMemory(
                f"out of device memory on neuron:{index} (NeuronCore {core}) allocating a "
                f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')} tensor of {nbytes / 2**20:.1f} MiB"
                f"{where_text()}: {max(free, 0) / 2**20:.1f} MiB of {session.profile.hbm_bytes_per_core / 2**30:.0f}"
                f" GiB HBM is free; free tensors you no longer need (del, or .cpu()), use a smaller batch, or "
                f"spread the model over more cores")
        used["tensors"] += nbytes
        session.live.set_device_memory(core, "tensors", used["tensors"])
        self.allocated[index] = self.allocated.get(index, 0) + nbytes
        self.peak[index] = max(self.peak.get(index, 0), self.allocated[index])

    def _release(self, key: int) -> None:
        with self._lock:
            entry = self.storages.get(key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] > 0:
                return
            del self.storages[key]
            nbytes, _, index = entry
            if not nbytes:
                return
            self.allocated[index] -= nbytes
            try:
                session, core = self.session_of(index)
                used = session.device_memory[core]
                used["tensors"] -= nbytes
                session.live.set_device_memory(core, "tensors", used["tensors"])
            except Exception:   # interpreter shutdown: the session is gone, nothing to give back
                pass


#: The process's device tensor memory (``torch.neuron.memory_allocated()`` reads it).
MEMORY = DeviceMemory()
