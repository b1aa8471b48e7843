"""Where neuron-top's documents come from: the live monitor collector, or a finished profile.

Both give ``next_document() -> dict | None`` (a whole neuron-monitor document, or ``None`` when a
replay is over) and ``status() -> str`` for the status line. They are built before the UI starts, so a
bad config or a missing profile is one error line, never a half-drawn screen.

>>> src = DocumentSource([{"neuron_runtime_data": []}])
>>> src.next_document(), src.next_document(), src.finished
({'neuron_runtime_data': []}, None, True)
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator


def _seconds(s: float) -> str:
    """``12.3s``, or ``3.725ms`` for the short runs a laptop profile often is."""
    return f"{s:.1f}s" if s >= 1 else f"{s * 1e3:.3f}ms"


class DocumentSource:
    """Documents from any iterable (tests, recorded ``neuron-monitor`` output)."""

    live = False

    def __init__(self, documents: Iterable[dict], label: str = "recorded documents"):
        self._documents: Iterator[dict] = iter(documents)
        self.label = label
        self.finished = False
        self.count = 0

    def next_document(self) -> dict | None:
        """The next document, or ``None`` (and ``finished``) when there are no more."""
        try:
            document = next(self._documents)
        except StopIteration:
            self.finished = True
            return None
        self.count += 1
        return document

    def status(self) -> str:
        return f"{self.label}: document {self.count}" + (" (end)" if self.finished else "")

    def close(self) -> None:
        """Release what the source holds (nothing for plain documents)."""


class LiveSource:
    """The real ``monitor.collect.Collector``: the same report neuron-monitor prints.

    Example: ``LiveSource("monitor.json").next_document()["instance_info"]``.
    """

    live = True
    finished = False

    def __init__(self, config_path: str | None = None):
        from monitor.collect import Collector
        from monitor.config import load_config

        self._collector = Collector(load_config(config_path))
        self.label = "live"

    def next_document(self) -> dict:
        return self._collector.collect()

    def status(self) -> str:
        return "live"

    def close(self) -> None:
        close = getattr(self._collector, "close", None)
        if close is not None:
            close()


class ReplaySource:
    """A finished profile played back by :class:`monitor.replay.Replay` at ``speed`` × real time.

    Each refresh (``period`` seconds of wall time) covers ``period * speed`` seconds of the profile.
    Example: ``ReplaySource("out/profile.duckdb", period=1.0, speed=10).next_document()``.
    """

    live = False

    def __init__(self, profile: str, period: float = 1.0, speed: float = 1.0):
        from monitor.replay import Replay

        self._replay = Replay(profile, window_s=period * speed)
        self._documents = iter(self._replay)
        self.speed = speed
        self.finished = False
        self.label = f"replay of {profile}"

    def next_document(self) -> dict | None:
        try:
            return next(self._documents)
        except StopIteration:
            self.finished = True
            return None

    def set_speed(self, speed: float) -> None:
        """Play on at ``speed`` (from the next refresh): each refresh covers ``period * speed``."""
        self._replay.window_ns = max(1, int(self._replay.window_ns * speed / self.speed))
        self.speed = speed

    def status(self) -> str:
        r = self._replay
        state = "finished" if self.finished else "playing"
        return (f"replay {state}: {_seconds(r.position_s)} / {_seconds(r.duration_s)} of profile time "
                f"at ×{self.speed:g}")

    def close(self) -> None:
        self._replay.close()
