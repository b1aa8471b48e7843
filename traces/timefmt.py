"""Times as people read them: one formatter for durations, instants, windows and axis ticks.

Every time label a reader shows (the Explorer's timeline axis, window titles and hovers) comes from
here, so a window never reads "2.14 s – 2.14 s": an instant is printed to the precision its window
needs, and a width always carries its unit.

>>> fmt_ns(96_400)
'96.4 µs'
>>> fmt_window(2_140_312_000, 2_140_408_400)
'2.140\u2009312 s … 2.140\u2009408 s (96.4 µs)'
>>> time_ticks(0, 100_000).labels[:3]
['0 µs', '20 µs', '40 µs']
"""
from __future__ import annotations

import math
from dataclasses import dataclass

#: Units from the largest down, with their size in ns.
UNITS = (("s", 1_000_000_000), ("ms", 1_000_000), ("µs", 1_000), ("ns", 1))
#: Digits after the decimal point are grouped in threes with a thin space, as in "2.140 312 s".
THIN_SPACE = "\u2009"
#: An axis aims at about this many ticks; the step is the 1-2-5 value nearest to width / TICKS.
TICKS = 6


def unit_for(ns: float) -> tuple[str, int]:
    """The largest unit in which ``ns`` is at least 1 (``ns`` for anything below a microsecond).

    >>> unit_for(2_500_000)
    ('ms', 1000000)
    """
    for name, scale in UNITS:
        if abs(ns) >= scale:
            return name, scale
    return UNITS[-1]


def fmt_ns(ns) -> str:
    """A duration in its own unit to three significant digits; a value that rounds up to 1,000 of its unit
    moves to the next (never ``1e+03 ms``).

    >>> fmt_ns(2_500_000), fmt_ns(999_999_900), fmt_ns(999.7)
    ('2.5 ms', '1 s', '1 µs')
    """
    ns = float(ns or 0)
    name, scale = unit_for(ns)
    if abs(float(f"{ns / scale:.3g}")) >= 1000:
        name, scale = unit_for(float(f"{ns:.3g}"))
    return f"{ns / scale:.3g} {name}"


def _decimals(resolution_ns: float, scale: int) -> int:
    """Digits after the point so the last one is no coarser than ``resolution_ns``."""
    if resolution_ns <= 0 or scale == 1:      # nanoseconds are whole on every clock here
        return 0
    return max(0, min(9, math.ceil(-math.log10(resolution_ns / scale) - 1e-9)))


def _group(text: str) -> str:
    """Thin spaces between groups of three digits after the decimal point."""
    whole, dot, frac = text.partition(".")
    if not dot or len(frac) <= 3:
        return text
    return whole + "." + THIN_SPACE.join(frac[i:i + 3] for i in range(0, len(frac), 3))


def fmt_at(ns: float, resolution_ns: float, unit: tuple[str, int] | None = None, trim: bool = False) -> str:
    """An instant to the precision ``resolution_ns`` asks for, in ``unit`` (default: the instant's own);
    ``trim`` drops trailing zeros (for a round instant such as an axis origin).

    >>> fmt_at(2_140_312_345, 1_000), fmt_at(2_002_000_000, 10_000, trim=True)
    ('2.140\u2009312 s', '2.002 s')
    """
    name, scale = unit or unit_for(ns)
    text = f"{ns / scale:.{_decimals(resolution_ns, scale)}f}"
    if trim and "." in text:
        text = text.rstrip("0").rstrip(".")
    return f"{_group(text)} {name}"


def fmt_window(start_ns: float, end_ns: float) -> str:
    """A window as its two ends (to about 1/50 of its width, in one unit) and its width.

    >>> fmt_window(0, 5_000_000)
    '0.0 ms … 5.0 ms (5 ms)'
    """
    width = end_ns - start_ns
    unit = unit_for(max(abs(start_ns), abs(end_ns), 1))
    resolution = width / 50 if width > 0 else 1
    return f"{fmt_at(start_ns, resolution, unit)} … {fmt_at(end_ns, resolution, unit)} ({fmt_ns(width)})"


@dataclass(frozen=True)
class Ticks:
    """Axis ticks for a window: positions (ns, same clock as the window), labels and the axis title.

    When the window is small against its distance from zero, labels are offsets ``+20 µs`` from
    ``origin_ns`` (the first tick, named in ``title``) so they stay short; otherwise times since zero.
    """

    origin_ns: int
    values_ns: list[int]
    labels: list[str]
    title: str


def _step(width_ns: float) -> int:
    """The 1-2-5 step (whole ns) that cuts ``width_ns`` into about ``TICKS`` parts."""
    raw = max(width_ns / TICKS, 1.0)
    power = 10 ** math.floor(math.log10(raw))
    return int(min((m * power for m in (1, 2, 5, 10)), key=lambda s: abs(s - raw)))


def time_ticks(start_ns: int, end_ns: int, zero_name: str = "profile start") -> Ticks:
    """Ticks with units for the window ``[start_ns, end_ns)`` (ns since ``zero_name``).

    The unit is chosen for the window's width (µs for a 96 µs window, s for a 2 s one) and the
    decimals for the step, so every label reads like ``20 µs`` or ``1.5 s``, never ``0.5M``.

    >>> t = time_ticks(2_140_312_000, 2_140_408_400)
    >>> t.labels[:2], t.title
    (['+0 µs', '+20 µs'], 'time since 2.140\u200932 s (µs)')
    """
    width = max(end_ns - start_ns, 1)
    step = _step(width)
    name, scale = unit_for(width)
    decimals = _decimals(step, scale)
    relative = start_ns > 10 * width
    origin = -(-start_ns // step) * step if relative else 0
    first = math.ceil((start_ns - origin) / step) * step + origin
    values = list(range(int(first), int(end_ns) + 1, step))
    sign = "+" if relative else ""
    labels = [f"{sign}{_group(f'{(v - origin) / scale:.{decimals}f}')} {name}" for v in values]
    title = (f"time since {fmt_at(origin, step, trim=True)} ({name})" if relative
             else f"time since {zero_name} ({name})")
    return Ticks(int(origin), values, labels, title)
