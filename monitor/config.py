"""neuron-monitor's config file, exactly the real format (reference §1.2).

``period`` may sit at the root, in a ``neuron_runtimes[]`` entry or in a metric-group object; the
most specific wins, the default is 5 s. Durations are Go-style strings ("1s", "500ms", "2m", "1m30s");
a plain JSON number is read as seconds, at most :data:`MAX_PERIOD`. ``tag_filter`` is a regex searched
in each process's tag with RE2 (``google-re2``), linear-time like the real tool's Go ``regexp``: a
pattern such as ``^(a+)+$`` cannot backtrack catastrophically; backreferences and lookaround, which
RE2 (and Go) do not have, are refused with one line.

>>> cfg = load_config(None)                       # no file: every group, every 5 s
>>> [g.type for g in cfg.system]
['vcpu_usage', 'memory_info', 'neuron_hw_counters']
>>> parse_duration("1m30s"), parse_duration("500ms")
(90.0, 0.5)
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import re2

from monitor import triggers
from traces.attach import MAX_SECONDS
from traces.safeio import InputFileError, read_small_text

DEFAULT_PERIOD = 5.0
MIN_PERIOD = 0.05  # below this the monitor would spend its life reporting
MAX_PERIOD = 86400.0  # one day: a longer period never reports (and NaN, Infinity, 1e308 are not durations)

RUNTIME_GROUPS = ("neuroncore_counters", "execution_stats", "memory_used", "neuron_runtime_vcpu_usage",
                  "neuron_stack")   # the last one is ours (docs/CONTRACTS.md), opt-in in a config file
SYSTEM_GROUPS = ("vcpu_usage", "memory_info", "neuron_hw_counters", "neuron_k8s_info")
DEFAULT_SYSTEM_GROUPS = ("vcpu_usage", "memory_info", "neuron_hw_counters")  # k8s info is off by default

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


class ConfigError(ValueError):
    """A config problem; the message is one line naming the file, the key and the fix."""


@dataclass(frozen=True)
class Group:
    """One metric group to report and how often (seconds)."""

    type: str
    period: float


@dataclass(frozen=True)
class RuntimeSelector:
    """A ``neuron_runtimes[]`` entry: which processes (by tag) and which runtime groups."""

    tag_filter: object   # a compiled RE2 pattern (see tag_regex)
    metrics: tuple[Group, ...]

    def matches(self, tag: str) -> bool:
        return self.tag_filter.search(tag) is not None


@dataclass(frozen=True)
class Config:
    """A parsed config: runtime selectors and system groups, each group with its period."""

    period: float
    runtimes: tuple[RuntimeSelector, ...]
    system: tuple[Group, ...]
    path: str | None = None
    triggers: tuple = ()   # monitor.triggers.Trigger: attach to a process by itself when a figure crosses a bound

    def selector_for(self, tag: str) -> tuple[int, RuntimeSelector] | None:
        """The first ``neuron_runtimes[]`` entry whose ``tag_filter`` matches ``tag``.

        >>> load_config(None).selector_for("1234")[0]
        0
        """
        for i, sel in enumerate(self.runtimes):
            if sel.matches(tag):
                return i, sel
        return None

    def groups(self):
        """Every scheduled group as ``(key, Group)``; key is ("runtime", i, type) or ("system", type)."""
        for i, sel in enumerate(self.runtimes):
            for g in sel.metrics:
                yield ("runtime", i, g.type), g
        for g in self.system:
            yield ("system", g.type), g


def parse_duration(value, where: str = "period") -> float:
    """Seconds in a Go-style duration string ("1s", "250ms", "1m30s") or a JSON number of seconds.

    >>> parse_duration("2s"), parse_duration(0.5)
    (2.0, 0.5)
    """
    if isinstance(value, bool):
        raise ConfigError(f"{where}: {value!r} is not a duration: write it like \"1s\" or \"500ms\"")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        text = value.strip()
        parts = _DURATION_PART.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            raise ConfigError(f"{where}: {value!r} is not a duration: write it like \"1s\", \"500ms\" or \"2m\"")
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    else:
        raise ConfigError(f"{where}: {value!r} is not a duration: write it like \"1s\" or \"500ms\"")
    if not math.isfinite(seconds):
        raise ConfigError(f"{where}: {value!r} is not a duration: write it like \"1s\" or \"500ms\"")
    if seconds < MIN_PERIOD:
        raise ConfigError(f"{where}: {value!r} is too short: use at least {int(MIN_PERIOD * 1000)}ms")
    if seconds > MAX_PERIOD:
        raise ConfigError(f"{where}: {value!r} is too long: use at most {MAX_PERIOD / 3600:g}h")
    return seconds


def tag_regex(pattern: str, where: str = "tag_filter"):
    """``pattern`` compiled with RE2 (linear-time search), else :class:`ConfigError` naming ``where``.

    ``^(a+)+$`` against 100 000 ``a`` and a ``b`` takes well under a millisecond (Python's ``re``: hangs).

    >>> tag_regex("^train").search("training-7") is not None
    True
    >>> tag_regex("(?=a)b")
    Traceback (most recent call last):
    ...
    monitor.config.ConfigError: tag_filter: bad regex '(?=a)b' (invalid perl operator: (?=): RE2 syntax, ...
    >>> try:
    ...     tag_regex("a(" + chr(10) + "b")
    ... except ConfigError as e:
    ...     print(len(str(e).splitlines()))
    1
    """
    options = re2.Options()
    options.log_errors = False   # RE2 would also log the error to stderr: the one line is ours
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        detail = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        # RE2 quotes the pattern raw: a newline in it would cut the one-line message
        detail = "".join(c if c.isprintable() else repr(c)[1:-1] for c in detail)
        raise ConfigError(f"{where}: bad regex {pattern!r} ({detail}): RE2 syntax, as the real neuron-monitor's "
                          "Go regexp: no backreferences or lookaround") from None


def _group(obj, allowed: tuple[str, ...], inherited: float, where: str) -> Group:
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: expected an object like {{\"type\": \"{allowed[0]}\"}}")
    _no_unknown_keys(obj, ("type", "period"), where)
    kind = obj.get("type")
    if kind not in allowed:
        raise ConfigError(f"{where}.type: unknown metric type {kind!r}: use one of {', '.join(allowed)}")
    period = parse_duration(obj["period"], f"{where}.period") if "period" in obj else inherited
    return Group(kind, period)


def _no_unknown_keys(obj: dict, allowed: tuple[str, ...], where: str) -> None:
    for key in obj:
        if key not in allowed:
            raise ConfigError(f"{where or 'config'}: unknown key {key!r}: allowed keys are {', '.join(allowed)}")


def parse_config(data, path: str | None = None) -> Config:
    """A :class:`Config` from an already-parsed JSON value (see :func:`load_config`).

    >>> cfg = parse_config({"period": "1s", "neuron_runtimes": [{"tag_filter": "^train",
    ...     "metrics": [{"type": "execution_stats", "period": "2s"}]}]})
    >>> cfg.runtimes[0].metrics[0].period, cfg.system
    (2.0, ())
    """
    if not isinstance(data, dict):
        raise ConfigError("the config must be a JSON object like {\"period\": \"1s\", \"neuron_runtimes\": [...]}")
    _no_unknown_keys(data, ("period", "neuron_runtimes", "system_metrics", "triggers"), "")
    root = parse_duration(data["period"], "period") if "period" in data else DEFAULT_PERIOD
    runtimes = []
    entries = data.get("neuron_runtimes", [])
    if not isinstance(entries, list):
        raise ConfigError("neuron_runtimes: expected a list of {\"tag_filter\": ..., \"metrics\": [...]}")
    for i, entry in enumerate(entries):
        where = f"neuron_runtimes[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: expected an object with \"tag_filter\" and \"metrics\"")
        _no_unknown_keys(entry, ("tag_filter", "metrics", "period"), where)
        period = parse_duration(entry["period"], f"{where}.period") if "period" in entry else root
        pattern = entry.get("tag_filter", ".*")
        if not isinstance(pattern, str):
            raise ConfigError(f"{where}.tag_filter: expected a regex string like \".*\"")
        regex = tag_regex(pattern, f"{where}.tag_filter")
        metrics = entry.get("metrics", [])
        if not isinstance(metrics, list):
            raise ConfigError(f"{where}.metrics: expected a list like [{{\"type\": \"execution_stats\"}}]")
        groups = tuple(_group(m, RUNTIME_GROUPS, period, f"{where}.metrics[{j}]") for j, m in enumerate(metrics))
        runtimes.append(RuntimeSelector(regex, groups))
    system = data.get("system_metrics", [])
    if not isinstance(system, list):
        raise ConfigError("system_metrics: expected a list like [{\"type\": \"vcpu_usage\"}]")
    sys_groups = tuple(_group(m, SYSTEM_GROUPS, root, f"system_metrics[{j}]") for j, m in enumerate(system))
    triggers_ = parse_triggers(data.get("triggers", []), {g.type for sel in runtimes for g in sel.metrics})
    return Config(root, tuple(runtimes), sys_groups, path, triggers_)


def parse_triggers(items, groups: set[str] | None = None) -> tuple:
    """The ``triggers`` list of a config; ``groups`` (the runtime groups the config reports) is checked against
    what each trigger reads. Raises ``ConfigError`` with one line naming the key and the fix.

    >>> [(t.type, t.threshold, t.duration) for t in parse_triggers([{"type": "fallback_burst", "threshold": 3}])]
    [('fallback_burst', 3.0, 10.0)]
    """
    if not isinstance(items, list):
        raise ConfigError('triggers: expected a list like [{"type": "recompile_storm"}]')
    out = []
    for i, t in enumerate(items):
        where = f"triggers[{i}]"
        if not isinstance(t, dict):
            raise ConfigError(f'{where}: expected an object like {{"type": "recompile_storm"}}')
        _no_unknown_keys(t, ("type", "threshold", "duration", "cooldown", "window", "output_dir", "tag_filter"),
                         where)
        kind = t.get("type")
        if kind not in triggers.TYPES:
            raise ConfigError(f"{where}.type: unknown trigger {kind!r}: use one of {', '.join(triggers.TYPES)}")
        threshold = t.get("threshold", triggers.TYPES[kind])
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold < 1e12:
            raise ConfigError(f"{where}.threshold: {threshold!r} is not a positive number")
        duration = parse_duration(t.get("duration", triggers.DEFAULT_DURATION), f"{where}.duration")
        if duration > MAX_SECONDS:
            raise ConfigError(f"{where}.duration: at most {MAX_SECONDS:g}s per capture")
        cooldown = parse_duration(t.get("cooldown", triggers.DEFAULT_COOLDOWN), f"{where}.cooldown")
        window = parse_duration(t.get("window", triggers.DEFAULT_WINDOW), f"{where}.window")
        output = t.get("output_dir", triggers.DEFAULT_OUTPUT)
        if not isinstance(output, str) or not output.strip():
            raise ConfigError(f'{where}.output_dir: expected a directory like "{triggers.DEFAULT_OUTPUT}"')
        missing = [g for g in triggers.NEEDS.get(kind, ("neuron_stack",)) if groups is not None and g not in groups]
        if missing:
            raise ConfigError(f"{where}: {kind} reads the {missing[0]} metric group, which the config does not "
                              f'report: add {{"type": "{missing[0]}"}} to neuron_runtimes[].metrics')
        out.append(triggers.Trigger(kind, float(threshold), duration, cooldown, output,
                           tag_regex(str(t.get("tag_filter", ".*")), f"{where}.tag_filter"), window))
    return tuple(out)


def default_config() -> Config:
    """Every runtime group (ours included) for every process, every system group, every 5 s."""
    every = tuple(Group(t, DEFAULT_PERIOD) for t in RUNTIME_GROUPS)
    return Config(DEFAULT_PERIOD, (RuntimeSelector(tag_regex(".*"), every),),
                  tuple(Group(t, DEFAULT_PERIOD) for t in DEFAULT_SYSTEM_GROUPS))


def load_config(path: str | Path | None) -> Config:
    """The config in the JSON file ``path``, or :func:`default_config` when ``path`` is None.

    Raises :class:`ConfigError` with one line naming the file, the key and the fix.

    >>> load_config(None).period
    5.0
    """
    if path is None:
        return default_config()
    p = Path(path)
    try:   # bounded, non-blocking, regular files only: /dev/zero or a FIFO as -c must not hang or grow
        text = read_small_text(p, what="config file")
    except InputFileError as exc:
        raise ConfigError(f"{exc} (the path given to -c)") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise ConfigError(f"config file {str(p)!r} is nested too deeply: a neuron-monitor config is an object "
                          "of lists of objects, a few levels deep") from None
    except ValueError as exc:
        raise ConfigError(f"config file {str(p)!r} is not valid JSON (line {getattr(exc, 'lineno', '?')}: "
                          f"{getattr(exc, 'msg', exc)})") from None
    try:
        config = parse_config(data, str(p))
    except ConfigError as exc:
        raise ConfigError(f"config file {str(p)!r}: {exc}") from None
    if not any(True for _ in config.groups()):
        # The real guide defines every group for no file at all, nothing for a file that lists none; a
        # monitor printing empty documents forever looks like a monitor that sees no workload.
        raise ConfigError(f"config file {str(p)!r} selects no metric group, so every document would be empty: "
                          "list groups in neuron_runtimes[].metrics or system_metrics (docs/monitor.md), "
                          "or leave out -c to report every group")
    return config
