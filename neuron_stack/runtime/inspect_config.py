"""What a capture records, as the real runtime's ``NEURON_RT_INSPECT_*`` variables say (SDK
``tools/neuron-explorer/environment-variables.rst``; Profiler 2.0 guide) or a ``NeuronConfig`` sets.

Real defaults: with ``NEURON_RT_INSPECT_ENABLE=1`` the system profile is on (``_SYSTEM_PROFILE=1``) and
the device profile off (``_DEVICE_PROFILE=0``); ``_SYS_TRACE_MAX_EVENTS_PER_NC`` keeps the newest
1,000,000 system events per NeuronCore (a ring buffer); ``_EVENT_FILTER_TYPE`` keeps named events,
the groups ``hardware`` / ``software``, minus ``^name`` exclusions. The docs give no default for
``_CPU_UTIL`` / ``_HOST_MEMORY``; here they follow the system profile. ``neuron-explorer inspect``
turns the device profile on (``session``) unless the variable is set.

>>> c = InspectConfig.from_env({"NEURON_RT_INSPECT_EVENT_FILTER_TYPE": "hardware,^cc_running"})
>>> c.device_profile, c.wants("nc_exec_running"), c.wants("cc_running"), c.wants("nrt_execute")
('off', True, False, False)
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

#: The real runtime's ``hardware`` event group; every other event type is ``software``.
HARDWARE_EVENTS = frozenset({"nc_exec_running", "cc_running", "cc_exec_barrier", "numerical_err",
                             "nrt_model_switch", "timestamp_sync_point", "hw_notify"})
#: The real default ring-buffer size per NeuronCore.
MAX_EVENTS_PER_NC = 1_000_000
_DEVICE_MODES = {"0": "off", "1": "model", "model": "model", "session": "session"}


class InspectConfigError(ValueError):
    """A profiling variable or NeuronConfig value is malformed; the message is one line with the fix."""


@dataclass(frozen=True)
class InspectConfig:
    """What to record: device rows (``off``/``model``/``session``), system events, host samples."""
    device_profile: str = "off"
    system_profile: bool = True
    cpu_util: bool = True
    host_memory: bool = True
    max_events_per_nc: int = MAX_EVENTS_PER_NC
    include_types: frozenset[str] = frozenset()   # names and groups; empty = all
    exclude_types: frozenset[str] = frozenset()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, device_default: str = "0") -> "InspectConfig":
        """Read the ``NEURON_RT_INSPECT_*`` variables (``os.environ`` by default); a bad value raises
        :class:`InspectConfigError` naming the variable, the value and what it accepts. ``device_default``
        is the device mode when ``NEURON_RT_INSPECT_DEVICE_PROFILE`` is unset (the real runtime's: ``0``)."""
        env = os.environ if env is None else env
        system = _flag(env, "NEURON_RT_INSPECT_SYSTEM_PROFILE", True)
        return cls(device_profile=device_mode(env.get("NEURON_RT_INSPECT_DEVICE_PROFILE", "") or device_default,
                                              "NEURON_RT_INSPECT_DEVICE_PROFILE"),
                   system_profile=system,
                   cpu_util=_flag(env, "NEURON_RT_INSPECT_CPU_UTIL", system),
                   host_memory=_flag(env, "NEURON_RT_INSPECT_HOST_MEMORY", system),
                   max_events_per_nc=max_events(env.get("NEURON_RT_INSPECT_SYS_TRACE_MAX_EVENTS_PER_NC", ""),
                                                "NEURON_RT_INSPECT_SYS_TRACE_MAX_EVENTS_PER_NC"),
                   **event_filter(env.get("NEURON_RT_INSPECT_EVENT_FILTER_TYPE", "")))

    def wants(self, name: str) -> bool:
        """Whether a system event called ``name`` is recorded (``NEURON_RT_INSPECT_EVENT_FILTER_TYPE``)."""
        if not self.system_profile:
            return False
        if any(name == x or name.startswith(x + "_") for x in self.exclude_types):
            return False
        if not self.include_types:
            return True
        group = "hardware" if name in HARDWARE_EVENTS else "software"
        return name in self.include_types or group in self.include_types


def device_mode(raw: str, name: str = "NEURON_RT_INSPECT_DEVICE_PROFILE") -> str:
    """``0``/``1``/``model``/``session`` → ``off``/``model``/``session`` (empty: the real default, off)."""
    value = raw.strip().lower() or "0"
    if value not in _DEVICE_MODES:
        raise InspectConfigError(f"{name}={raw.strip()[:40]!r} is not one of 0, 1, model, session")
    return _DEVICE_MODES[value]


def max_events(raw, name: str = "NEURON_RT_INSPECT_SYS_TRACE_MAX_EVENTS_PER_NC") -> int:
    """A positive event cap (empty: the real default, 1,000,000)."""
    text = str(raw).strip()
    if not text:
        return MAX_EVENTS_PER_NC
    if not re.fullmatch(r"[0-9]{1,10}", text) or int(text) == 0:
        raise InspectConfigError(f"{name}={text[:40]!r} is not a positive whole number of events per NeuronCore "
                                 f"(default {MAX_EVENTS_PER_NC:,})")
    return int(text)


def event_filter(raw: str, name: str = "NEURON_RT_INSPECT_EVENT_FILTER_TYPE") -> dict[str, frozenset[str]]:
    """``hardware,^cc_exec`` → include/exclude sets. Names are lower-case words; ``^`` excludes."""
    include, exclude = set(), set()
    for token in (t.strip() for t in raw.split(",") if t.strip()):
        word = token.removeprefix("^")
        if not re.fullmatch(r"[a-z][a-z0-9_]{0,63}", word):
            raise InspectConfigError(f"{name}: {token[:40]!r} is not an event type: use names such as "
                                     "nrt_execute, the groups hardware or software, and ^name to exclude")
        (exclude if token.startswith("^") else include).add(word)
    return {"include_types": frozenset(include), "exclude_types": frozenset(exclude)}


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw not in ("0", "1"):
        raise InspectConfigError(f"{name}={raw[:40]!r} is not 0 or 1")
    return raw == "1"
