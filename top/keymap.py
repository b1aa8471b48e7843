"""The one table of neuron-top's keys: the app's bindings, the legend line and the help screen read it.

The first block is the real neuron-top's keys (reference §2.1); the rest is what this twin adds.

>>> [k.display for k in KEYMAP][:3]
['q', '↑/↓', '←/→']
>>> [(b.key, b.action) for b in bindings()][:2]
[('q', 'quit'), ('ctrl+c', 'quit')]
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KeyBinding:
    """One row of the keymap: the keys (Textual key names), the app action, and what it does.

    ``action`` may contain ``{key}``, replaced by the key pressed (``select_tab({key})`` for 1-9).
    """

    keys: tuple[str, ...]
    action: str
    display: str       # how the help screen and legend write the keys
    label: str         # short legend word
    description: str   # help screen sentence
    legend: bool = True


KEYMAP: tuple[KeyBinding, ...] = (
    KeyBinding(("q", "ctrl+c"), "quit", "q", "quit", "Quit neuron-top (ctrl+c too)"),
    KeyBinding(("up", "down"), "tree_{key}", "↑/↓", "move",
               "Move the selection in the Memory Usage Details tree"),
    KeyBinding(("left", "right"), "tree_{key}", "←/→", "fold",
               "Collapse (or go to the parent) / expand the selected tree node", legend=False),
    KeyBinding(("enter",), "tree_toggle", "enter", "expand",
               "Expand or collapse the selected tree node"),
    KeyBinding(("x",), "tree_toggle_all", "x", "expand all", "Expand or collapse the whole tree"),
    KeyBinding(("a",), "previous_tab", "a", "prev app", "Select the previous Neuron app tab"),
    KeyBinding(("d",), "next_tab", "d", "next app", "Select the next Neuron app tab"),
    KeyBinding(tuple("123456789"), "select_tab({key})", "1-9", "app",
               "Select Neuron app tab 1-9 (1 is 'all')", legend=False),
    KeyBinding(("f",), "toggle_flops", "f", "flops",
               "Toggle the utilization grid between percent and TFLOPS"),
    # Beyond the real tool.
    KeyBinding(("e",), "toggle_engines", "e", "engines",
               "Show or hide the engines, history and recompiles/fallbacks panels"),
    KeyBinding(("space",), "toggle_pause", "space", "pause",
               "Pause or resume the refresh (live or replay)", legend=False),
    KeyBinding(("plus", "minus"), "speed_{key}", "+/-", "speed",
               "Replay twice as fast / half as fast", legend=False),
    KeyBinding(("c",), "capture", "c", "capture",
               "Attach: the selected process records a bounded profile (state in its panel)"),
    KeyBinding(("question_mark", "h"), "help", "?/h", "help", "Show this help screen"),
)


@dataclass(frozen=True)
class Binding:
    """One concrete key → action pair, expanded from a :class:`KeyBinding` row."""

    key: str
    action: str
    description: str


def bindings(keymap: tuple[KeyBinding, ...] = KEYMAP) -> list[Binding]:
    """Every (key, action) pair of ``keymap``, with ``{key}`` filled in.

    >>> [b.action for b in bindings() if b.key == "3"]
    ['select_tab(3)']
    """
    return [Binding(key, row.action.format(key=key), row.description)
            for row in keymap for key in row.keys]


def legend(width: int = 1000, keymap: tuple[KeyBinding, ...] = KEYMAP) -> str:
    """The one-line key legend shown at the bottom of the screen, shortened to fit ``width``.

    >>> legend().startswith("q:quit")
    True
    >>> legend(60)
    'q ↑/↓ enter x a d f e c  ?/h:help'
    """
    rows = [row for row in keymap if row.legend]
    full = "  ".join(f"{row.display}:{row.label}" for row in rows)
    if len(full) <= width:
        return full
    # Too narrow: keys only, but the help key keeps its word so the rest can be found.
    *keys, last = rows
    return " ".join(row.display for row in keys) + f"  {last.display}:{last.label}"
