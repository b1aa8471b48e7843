"""Where ``neuron`` tensors live: the runtime session and NeuronCore behind ``neuron:i``, the user line an
op or allocation comes from, and device memory accounting against the core's HBM.

>>> MEMORY.allocated.get(0, 0) >= 0
True
"""
from __future__ import annotations

import collections
import linecache
import os
import sys
import threading
import weakref

import torch

from neuron_stack.frontend.export import backward_source, is_user_file
from neuron_stack.frontend.flags import parse_flags
from neuron_stack.ir import Source
from neuron_stack.runtime.errors import OutOfDeviceMemory
from neuron_stack.runtime.session import Session

#: the current device index, the session, the last user line seen
_state: dict = {"index": 0, "session": None, "source": None}


def session() -> Session:
    """The runtime session eager ops run in (target from ``NEURON_CC_FLAGS --target``, default trn1)."""
    s = _state["session"]
    if s is None or s.closed:
        s = _state["session"] = Session.get(parse_flags()["target"])
    return s


def core_of(index: int) -> tuple[Session, int]:
    """The session and NeuronCore behind ``neuron:index`` (the process's visible cores, in order)."""
    s = session()
    if not 0 <= index < len(s.cores):
        raise RuntimeError(f"neuron:{index} does not exist: this process sees {len(s.cores)} NeuronCore(s); set "
                           "NEURON_RT_NUM_CORES or NEURON_RT_VISIBLE_CORES to see more")
    return s, s.cores[index]


def where() -> Source | None:
    """The innermost frame of the current stack in user code: the line an eager op comes from.

    Backward ops run on autograd's device thread, whose stack holds no user code: they get the
    ``loss.backward()`` that started them (found on the thread waiting in autograd's engine).
    """
    f = sys._getframe(1)
    while f is not None:
        path = f.f_code.co_filename
        if is_user_file(path):
            src = Source(os.path.abspath(path), f.f_lineno, f.f_code.co_name,
                         linecache.getline(path, f.f_lineno).strip())
            _state["source"] = src
            return src
        f = f.f_back
    return backward_source() or _state.get("source")


def where_text() -> str:
    """`` at file.py:12`` for the current user line, or an empty string."""
    src = where()
    return f" at {os.path.basename(src.file)}:{src.line}" if src is not None else ""


class DeviceMemory:
    """Bytes of device tensors alive per device index, checked against the core's HBM.

    Views share their base's storage and are counted once; memory is given back when the last tensor
    using a storage dies. What compiled NEFFs hold (weights, code, scratchpad) is already charged by
    the runtime per core, so a tensor fits only in what they leave free.
    """

    def __init__(self):
        self._lock = threading.Lock()
        # A dying tensor's finalizer only queues its storage: finalizers run wherever the garbage collector
        # happens to run, inside any lock on any thread (the live publisher's, mid-snapshot, deadlocked on it)
        self._released: collections.deque[int] = collections.deque()
        self._refs: dict[int, tuple] = {}   # id -> (weakref, storage data_ptr), alive until its value dies
        self._on_release = self._release            # bound once: the callback of every tensor's weakref
        self.storages: dict[int, list] = {}       # storage data_ptr -> [nbytes, users, index]
        self.allocated: dict[int, int] = {}
        self.peak: dict[int, int] = {}
        self.session_of = core_of                 # index -> (Session, core)

    def track(self, t: torch.Tensor, index: int) -> None:
        elem = t.elem
        if type(elem) is not torch.Tensor:      # a fake or functional value while tracing: no memory
            return
        storage = elem.untyped_storage()
        key = storage.data_ptr()
        if self._released:
            self.drain()   # a freed storage's address may be this one's
        with self._lock:
            entry = self.storages.get(key)
            if entry is None:
                nbytes = storage.nbytes()
                if nbytes:
                    self._charge(index, nbytes, t)
                entry = self.storages[key] = [nbytes, 0, index]
            entry[1] += 1
        # on the value, not the wrapper: Module.to swaps wrappers (torch.utils.swap_tensors refuses weakrefs).
        # A bare weakref (held until it fires, with its storage): weakref.finalize costs microseconds per tensor
        ref = weakref.ref(elem, self._on_release)
        self._refs[id(ref)] = ref, key   # by id: two live weakrefs of one tensor compare its values

    def _charge(self, index: int, nbytes: int, t: torch.Tensor) -> None:
        session, core = self.session_of(index)
        used = session.device_memory[core]
        free = session.profile.hbm_bytes_per_core - sum(used.values())
        if nbytes > free:
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

    def _release(self, ref) -> None:
        entry = self._refs.pop(id(ref), None)
        if entry is not None:
            self._released.append(entry[1])

    def drain(self) -> None:
        """Give back the memory of tensors that died since the last call (their finalizers queued them)."""
        while self._released:
            key = self._released.popleft()
            with self._lock:
                entry = self.storages.get(key)
                if entry is None:
                    continue
                entry[1] -= 1
                if entry[1] > 0:
                    continue
                del self.storages[key]
                nbytes, _, index = entry
                if not nbytes:
                    continue
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
