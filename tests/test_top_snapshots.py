"""Golden screens of neuron-top, kept as plain text (tests/top_snapshots/*.txt) rather than SVG, so a
layout change shows up as a readable diff and Textual upgrades do not churn pixels.

After an intended layout change, regenerate with
``NEURON_TOP_UPDATE_SNAPSHOTS=1 .venv/bin/python -m pytest tests/test_top_snapshots.py`` and review the diff.
"""
from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import pytest
from test_top_app import TWO_APPS, repeating

from top.app import NeuronTop, version

SNAPSHOTS = Path(__file__).parent / "top_snapshots"


def normalise(text: str) -> str:
    # The two things that legitimately change between runs: the package version and the clock.
    text = text.replace(f"neuron-top {version()} ", "neuron-top <version> ")
    return re.sub(r"refreshed \d\d:\d\d:\d\d", "refreshed <time>", text)


def screen(size, keys) -> str:
    async def main():
        app = NeuronTop(repeating(TWO_APPS, times=1), period=0.02)
        async with app.run_test(size=size) as pilot:
            for _ in range(400):   # bounded: the one document is shown and the source has ended
                if app.frames and "(end)" in app.status_text:
                    break
                await pilot.pause(0.01)
            for key in keys:
                await pilot.press(key)
            await pilot.pause()
            return app.screen_text()
    return normalise(asyncio.run(main()))


@pytest.mark.parametrize("name, size, keys", [
    ("main_80x24", (80, 24), ()),
    ("extras_80x24", (80, 24), ("e",)),
    ("tab2_flops_80x24", (80, 24), ("d", "f")),
    ("main_160x48", (160, 48), ()),
    ("tree_expanded_160x48", (160, 48), ("x",)),
    ("help_160x48", (160, 48), ("question_mark",)),
])
def test_golden_screen(name, size, keys):
    text = screen(size, keys)
    path = SNAPSHOTS / f"{name}.txt"
    if os.environ.get("NEURON_TOP_UPDATE_SNAPSHOTS") or not path.exists():
        SNAPSHOTS.mkdir(exist_ok=True)
        path.write_text(text)
        if not os.environ.get("NEURON_TOP_UPDATE_SNAPSHOTS"):
            pytest.fail(f"wrote the missing golden screen {path}: review it and commit it")
    assert text == path.read_text(), f"{name} differs from {path} (see the module docstring to update)"
