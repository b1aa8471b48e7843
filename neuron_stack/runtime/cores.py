"""NeuronCore reservation: which simulated cores this process owns, exclusively across processes.

The simulated machine is one instance (``NEURON_STACK_INSTANCE_TYPE``, default: the target's
instance, e.g. ``trn1.32xlarge`` = 16 chips x 2 cores). A process reserves cores as the real
runtime does, from ``NEURON_RT_VISIBLE_CORES`` (``3``, ``0-2``, ``0,2,5``) or
``NEURON_RT_NUM_CORES``. Each core is one lock file under the runtime directory held with
``fcntl.flock``: the kernel drops the lock when the holder exits, even on SIGKILL, so a dead
process never keeps a core. Next to each lock a small JSON names the holder for ``neuron-ls``.

>>> from neuron_stack.device.profiles import get_profile
>>> lease = acquire(get_profile("trn1"))          # doctest: +SKIP
>>> lease.cores                                   # doctest: +SKIP
[0]
>>> parse_core_list("0-2,5", 32)
[0, 1, 2, 5]
"""
from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import re
import sys
import threading
import time
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import psutil

from neuron_stack.device.profiles import DeviceProfile, get_profile
from traces.ids import instance_id

NOT_AVAILABLE = "Virtual Neuron Core(s) not available - Requested:{requested} Available:{available}"

# instance type -> (device profile, chips, vCPUs, chip interconnect). Reference §5.1 and the
# AWS instance pages: trn1/trn2 chips form a 4x4 2D torus, inf2 chips a ring.
INSTANCE_TYPES: dict[str, tuple[str, int, int, str]] = {
    "trn1.2xlarge": ("trn1", 1, 8, "none"),
    "trn1.32xlarge": ("trn1", 16, 128, "torus"),
    "trn1n.32xlarge": ("trn1", 16, 128, "torus"),
    "inf2.xlarge": ("inf2", 1, 4, "none"),
    "inf2.8xlarge": ("inf2", 1, 32, "none"),
    "inf2.24xlarge": ("inf2", 6, 96, "ring"),
    "inf2.48xlarge": ("inf2", 12, 192, "ring"),
    "trn2.3xlarge": ("trn2", 1, 12, "none"),
    "trn2.48xlarge": ("trn2", 16, 192, "torus"),
    "trn2n.48xlarge": ("trn2", 16, 192, "torus"),
    "trn2u.48xlarge": ("trn2", 16, 192, "torus"),
}


class CoreAllocationError(RuntimeError):
    """A core request that cannot be met, or a malformed core setting; the message is one line."""


def runtime_version() -> str:
    """The version neuron-ls shows in RUNTIME VERSION (this package's version)."""
    try:
        return version("neuron-stack")
    except Exception:  # running from a source tree without metadata
        return "0.0.0"


@dataclass(frozen=True)
class Instance:
    """The simulated machine: its instance type, device profile, chips and their links.

    >>> inst = get_instance("trn1")
    >>> inst.instance_type, inst.num_cores, inst.neighbors(0)
    ('trn1.32xlarge', 32, [12, 3, 4, 1])
    """

    instance_type: str
    profile: DeviceProfile
    chips: int
    vcpus: int
    topology: str  # "torus" (4x4 2D torus), "ring" or "none"

    @property
    def cores_per_chip(self) -> int:
        return self.profile.cores_per_chip

    @property
    def num_cores(self) -> int:
        return self.chips * self.profile.cores_per_chip

    def chip_of(self, core: int) -> int:
        return core // self.cores_per_chip

    def cores_of(self, chip: int) -> list[int]:
        return list(range(chip * self.cores_per_chip, (chip + 1) * self.cores_per_chip))

    def neighbors(self, chip: int) -> list[int]:
        """Chips linked to ``chip`` by NeuronLink, in neuron-ls order (up, left, down, right)."""
        if self.topology == "torus":
            side = int(round(self.chips ** 0.5))
            r, c = divmod(chip, side)
            return [((r - 1) % side) * side + c, r * side + (c - 1) % side,
                    ((r + 1) % side) * side + c, r * side + (c + 1) % side]
        if self.topology == "ring" and self.chips > 1:
            return sorted({(chip + 1) % self.chips, (chip - 1) % self.chips})
        return []

    def hardware_info(self) -> dict:
        """neuron-monitor's ``neuron_hardware_info`` of this instance (its own chip count, e.g. 1 on trn1.2xlarge).

        >>> get_instance("inf2").hardware_info()["neuron_device_count"]
        12
        """
        return {**self.profile.hardware_info(), "neuron_device_count": self.chips}

    def numa_node(self, chip: int) -> int:
        return 0 if self.chips == 1 else int(chip >= self.chips / 2)

    def cpu_affinity(self, chip: int) -> str:
        """The vCPUs of the chip's NUMA node, as ``a-b,c-d`` (physical cores and their hyperthreads)."""
        if self.chips == 1:
            return f"0-{self.vcpus - 1}"
        quarter = self.vcpus // 4
        node = self.numa_node(chip)
        lo, hi = node * quarter, (node + 1) * quarter - 1
        return f"{lo}-{hi},{lo + 2 * quarter}-{hi + 2 * quarter}"

    def bdf(self, chip: int) -> str:
        """A stable PCI bus/device/function per chip (``cc:00.0`` style, as neuron-ls prints)."""
        return f"{(0x10 + chip * 0x0b) % 0xff:02x}:00.0"

    @property
    def instance_id(self) -> str:
        """This machine's EC2-style id, the same one neuron-monitor and neuron-top report."""
        return instance_id()


def get_instance(target: str | DeviceProfile | None = None) -> Instance:
    """The simulated instance: ``NEURON_STACK_INSTANCE_TYPE`` if set, else the target's default.

    ``target`` is a device profile or its name; without one (``neuron-ls``), the instance type decides, else
    ``NEURON_STACK_TARGET``, else the instance of the processes running now, else ``trn1``: the one identity
    every tool reports (:func:`traces.identity.machine`).
    Example: ``get_instance("inf2").instance_type == "inf2.48xlarge"``.
    """
    itype = os.environ.get("NEURON_STACK_INSTANCE_TYPE", "").strip()
    if isinstance(target, DeviceProfile):
        profile = target
    elif target is None and itype in INSTANCE_TYPES:  # the machine decides (neuron-ls, monitors)
        profile = get_profile(INSTANCE_TYPES[itype][0])
    elif target is None and not itype and not os.environ.get("NEURON_STACK_TARGET") and _running_instance():
        itype = _running_instance()
        profile = get_profile(INSTANCE_TYPES[itype][0])
    else:
        profile = get_profile(target or os.environ.get("NEURON_STACK_TARGET") or "trn1")
    itype = itype or profile.instance_type
    if itype not in INSTANCE_TYPES:
        raise CoreAllocationError(
            f"NEURON_STACK_INSTANCE_TYPE={itype!r} is not a simulated instance type: "
            f"use one of {', '.join(INSTANCE_TYPES)}")
    family, chips, vcpus, topology = INSTANCE_TYPES[itype]
    if family != profile.name:
        raise CoreAllocationError(
            f"NEURON_STACK_INSTANCE_TYPE={itype} has {family} chips but the model targets "
            f"{profile.name}: unset it or pick a {profile.name} instance type")
    return Instance(itype, profile, chips, vcpus, topology)


def _running_instance() -> str | None:
    """The instance type of the processes running now (``traces.identity.machine``), if any."""
    from traces.identity import machine
    from traces.live import read_all

    itype = machine(read_all(), env={})["instances"][:1]
    return itype[0] if itype and itype[0] in INSTANCE_TYPES else None


_ASCII_DIGITS = re.compile(r"[0-9]+")   # str.isdigit() accepts '٣' and '³'


def parse_core_list(text: str, num_cores: int, name: str = "NEURON_RT_VISIBLE_CORES") -> list[int]:
    """Parse an index (``3``), inclusive range (``0-2``) or comma list (``0,2,5``) of core ids.

    >>> parse_core_list("1-3", 8)
    [1, 2, 3]
    """
    cores: set[int] = set()
    hint = "use an index (3), an inclusive range (0-2) or a comma list (0,2,5)"
    if len(text) > 4096:   # a core list is short; do not scan megabytes of environment
        raise CoreAllocationError(f"{name} is {len(text)} characters long: {hint}")
    for part in text.replace(" ", "").split(","):
        lo, sep, hi = part.partition("-")
        if not _ASCII_DIGITS.fullmatch(lo) or (sep and not _ASCII_DIGITS.fullmatch(hi)):
            raise CoreAllocationError(f"{name}={text[:40]!r} is malformed: {hint} with ASCII digits")
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a:
            raise CoreAllocationError(
                f"{name}={text[:40]!r} has a decreasing range {part}: write it as {b}-{a}")
        if b >= num_cores:   # checked before expanding: 0-100000000 must not build a list first
            raise CoreAllocationError(
                f"{name}={text[:40]!r} names core {max(a, num_cores)} but this instance has cores "
                f"0-{num_cores - 1}: pick cores in that range (see neuron-ls)")
        cores.update(range(a, b + 1))
    return sorted(cores)


def runtime_dir(instance: Instance) -> Path:
    """Where the core lock files live: ``$NEURON_STACK_RUNTIME_DIR`` or ``/tmp/neuron_stack-<uid>/cores``."""
    base = os.environ.get("NEURON_STACK_RUNTIME_DIR") or f"/tmp/neuron_stack-{os.getuid()}/cores"
    return Path(base) / instance.instance_type


# -- holder records ---------------------------------------------------------------------------

def _proc_start(pid: int) -> float | None:
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return None
        return p.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def core_holders(instance: Instance) -> dict[int, dict]:
    """Live holders by core: ``{core: {"pid", "command", "tag", "runtime_version", ...}}``.

    Reads the holder records and drops those whose process is gone (or whose pid was reused),
    so it never takes a lock and never disturbs an allocation in progress.
    Example: ``core_holders(get_instance("trn1")).get(0, {}).get("pid")``.
    """
    holders: dict[int, dict] = {}
    d = runtime_dir(instance)
    if not d.is_dir():
        return holders
    for f in d.glob("nc*.json"):
        try:
            rec = json.loads(f.read_text())
            core = int(f.stem[2:])
        except (OSError, ValueError):
            continue  # being replaced right now, or not ours
        start = _proc_start(int(rec.get("pid", -1)))
        if start is not None and abs(start - float(rec.get("create_time", 0))) < 1.0:
            holders[core] = rec
    return holders


def free_cores(instance: Instance) -> list[int]:
    """Cores no live process holds. Example: ``len(free_cores(get_instance("trn1")))``."""
    held = core_holders(instance)
    return [c for c in range(instance.num_cores) if c not in held]


# -- this process's reservation -----------------------------------------------------------------

_lock = threading.Lock()
_held: dict[Path, list] = {}  # lock path -> [fd, refcount]


def _after_fork_in_child() -> None:
    # A forked child shares the parent's lock (one open file description). Drop our copies so
    # the parent stays the only owner and the child starts with no cores, like a new process.
    for fd, _ in _held.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _record(core: int) -> dict:
    me = psutil.Process()
    return {"core": core, "pid": os.getpid(), "create_time": me.create_time(),
            "command": " ".join(" ".join(me.cmdline()).split()) or sys.executable,  # one line
            "tag": os.environ.get("NEURON_PROCESS_TAG") or str(os.getpid()),
            "runtime_version": runtime_version(), "since": time.time()}


def _try_take(d: Path, core: int) -> bool:
    """Take one more reference on ``core`` for this process; False if another process holds it."""
    path = d / f"nc{core}.lock"
    if path in _held:
        _held[path][1] += 1
        return True
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    _held[path] = [fd, 1]
    tmp = d / f".nc{core}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(_record(core)))
    os.replace(tmp, d / f"nc{core}.json")  # atomic: readers see the old record or the new one
    return True


def _drop(d: Path, core: int) -> None:
    path = d / f"nc{core}.lock"
    entry = _held.get(path)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] > 0:
        return
    del _held[path]
    with contextlib.suppress(OSError, ValueError):
        rec = json.loads((d / f"nc{core}.json").read_text())
        if rec.get("pid") == os.getpid():
            (d / f"nc{core}.json").unlink()
    os.close(entry[0])  # closing the only descriptor releases the flock


def held_cores(instance: Instance) -> list[int]:
    """Cores this process currently holds on ``instance``."""
    d = runtime_dir(instance)
    return sorted(int(p.stem[2:]) for p in _held if p.parent == d)


@contextlib.contextmanager
def _allocation_lock(d: Path):
    # One allocation at a time on the machine, so two multi-core requests never each grab half
    # of what they need and both fail. Held for microseconds; released by the kernel on death.
    d.mkdir(parents=True, exist_ok=True)
    fd = os.open(d / "allocate.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class CoreLease:
    """NeuronCores reserved for this process; released by ``release()``, at exit, or on death.

    ``cores`` are absolute core ids (the ids neuron-ls shows). Usable as a context manager.
    Example: ``with acquire(get_profile("trn1"), 2) as lease: print(lease.cores)``.
    """

    def __init__(self, instance: Instance, cores: list[int], reserved: list[int]):
        self.instance = instance
        self.cores = list(cores)
        self._reserved = list(reserved)  # what this lease holds a reference on (>= cores)
        self._dir = runtime_dir(instance)
        atexit.register(self.release)

    def release(self) -> None:
        """Give the cores back (idempotent)."""
        with _lock:
            for c in self._reserved:
                _drop(self._dir, c)
            self._reserved = []

    @property
    def released(self) -> bool:
        return not self._reserved

    def __enter__(self) -> "CoreLease":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"CoreLease({self.instance.instance_type}, cores={self.cores})"


def _not_available(requested: int, available: int, inst: Instance, wanted: list[int]) -> CoreAllocationError:
    holders = core_holders(inst)
    busy = sorted({(h["pid"], h["command"]) for c, h in holders.items() if c in wanted})
    who = "; ".join(f"pid {pid} ({cmd[:60]})" for pid, cmd in busy[:3])
    fix = (f"held by {who}: wait for it, stop it, or pick other cores with NEURON_RT_VISIBLE_CORES"
           if who else f"{inst.instance_type} has {inst.num_cores} cores: request fewer")
    return CoreAllocationError(
        NOT_AVAILABLE.format(requested=requested, available=available) + f" Virtual Core size 1 ({fix}; see neuron-ls)")


def _available(inst: Instance, among: list[int]) -> int:
    """How many of ``among`` this process could have: free, or already its own."""
    others = {c for c, h in core_holders(inst).items() if h.get("pid") != os.getpid()}
    return sum(1 for c in among if c not in others)


def _env_num_cores() -> int | None:
    raw = os.environ.get("NEURON_RT_NUM_CORES", "").strip()
    if not raw:
        return None
    if not _ASCII_DIGITS.fullmatch(raw) or len(raw) > 9:   # '²'.isdigit() is True but int('²') fails
        raise CoreAllocationError(f"NEURON_RT_NUM_CORES={raw[:40]!r} is not a core count: set one such as 2 "
                                  "(0 = all)")
    return int(raw)


def acquire(profile: DeviceProfile | str | None = None, num_cores: int | None = None, *,
            cores: list[int] | None = None) -> CoreLease:
    """Reserve NeuronCores for this process, as the Neuron runtime does at model load.

    - ``NEURON_RT_VISIBLE_CORES`` (index, ``0-2``, ``0,2,5``) takes precedence: all those cores
      are reserved and the lease lists them (or their first ``num_cores``).
    - else ``num_cores`` (from the caller) or ``NEURON_RT_NUM_CORES`` free cores, lowest first;
      ``NEURON_RT_NUM_CORES=0`` means every free core. With neither set a plain process gets
      **one** core (the real runtime takes all; one lets many processes share the simulator).
    - ``cores``: explicit core ids (relative to the visible cores when they are set), as
      ``DataParallel(device_ids=...)`` asks.
    Cores this process already holds are shared, not taken twice: loading a second model in
    the same process reuses its reservation. Raises :class:`CoreAllocationError` with the real
    message ``Virtual Neuron Core(s) not available - Requested:N Available:M``.

    >>> lease = acquire("trn1", 2)        # doctest: +SKIP
    >>> lease.cores, lease.release()      # doctest: +SKIP
    ([0, 1], None)
    """
    inst = get_instance(profile)
    d = runtime_dir(inst)
    raw_visible = os.environ.get("NEURON_RT_VISIBLE_CORES", "").strip()
    visible = parse_core_list(raw_visible, inst.num_cores) if raw_visible else None
    env_num = _env_num_cores()
    if num_cores is not None and num_cores < 0:
        raise CoreAllocationError(f"num_cores={num_cores} is negative: ask for 1 or more cores")

    with _lock, _allocation_lock(d):
        if cores is not None:
            space = visible if visible is not None else list(range(inst.num_cores))
            bad = [c for c in cores if not 0 <= c < len(space)]
            if bad:
                where = f"NEURON_RT_VISIBLE_CORES={raw_visible} gives {len(space)}" if visible else \
                    f"{inst.instance_type} has {len(space)}"
                raise CoreAllocationError(f"core {bad[0]} is out of range: {where} cores (ids 0-{len(space) - 1})")
            wanted = [space[c] for c in cores]
            return _take_all(inst, d, wanted, wanted)
        if visible is not None:
            n = num_cores or len(visible)
            if n > len(visible):
                raise _not_available(n, _available(inst, visible), inst, visible)
            return _take_all(inst, d, visible, visible[:n])
        n = num_cores if num_cores is not None else env_num
        mine = held_cores(inst)
        if n is None:
            n = len(mine) or 1
        elif n == 0:  # "all": everything free now, plus what we hold
            n = max(len(mine) + len(free_cores(inst)), 1)
        if n > inst.num_cores:
            raise _not_available(n, len(mine) + len(free_cores(inst)), inst, list(range(inst.num_cores)))
        take = list(mine[:n])
        for c in range(inst.num_cores):
            if len(take) == n:
                break
            if c not in take and _try_take(d, c):
                take.append(c)
                continue
        if len(take) < n:
            for c in take:
                if c not in mine:
                    _drop(d, c)
            raise _not_available(n, len(take), inst, list(range(inst.num_cores)))
        for c in take:  # one reference per lease on cores we already held, too
            if c in mine:
                _try_take(d, c)
        return CoreLease(inst, sorted(take), sorted(take))


def _take_all(inst: Instance, d: Path, reserve: list[int], lease_cores: list[int]) -> CoreLease:
    got = []
    for c in reserve:
        if not _try_take(d, c):
            for g in got:
                _drop(d, g)
            raise _not_available(len(reserve), _available(inst, reserve), inst, reserve)
        got.append(c)
    return CoreLease(inst, lease_cores, reserve)
