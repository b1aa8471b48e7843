"""docs/walkthrough.md as data: its steps (``<!-- step: NAME -->`` bash blocks), the output each shows, and
how a run's output is compared with it and written back into it (``python tests/test_walkthrough.py --write``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "walkthrough.md"

_BLOCK = re.compile(r"^<!-- step: ([\w-]+)(?: (server|tui))? -->\n```bash\n(.*?)\n```", re.S | re.M)


@dataclass
class Step:
    name: str
    kind: str          # "shell", "server" or "tui"
    code: str


def read_steps(text: str | None = None) -> list[Step]:
    """The document's bash blocks in order; each must carry a ``<!-- step: NAME -->`` comment.

    >>> [s.name for s in read_steps("<!-- step: a -->\\n```bash\\necho hi\\n```\\n")]
    ['a']
    """
    text = DOC.read_text() if text is None else text
    steps = [Step(m[1], m[2] or "shell", m[3]) for m in _BLOCK.finditer(text)]
    fences = len(re.findall(r"^```bash$", text, re.M))
    assert len(steps) == fences, "every ```bash block needs a <!-- step: NAME --> line above it"
    return steps


def shown_outputs(text: str | None = None) -> dict[str, str]:
    """Each step's output as the document shows it: the first ```text block after the step, before the next step."""
    text = DOC.read_text() if text is None else text
    shown = {}
    for m in _BLOCK.finditer(text):
        rest = text[m.end():]
        nxt = rest.find("<!-- step:")
        found = re.search(r"^```text\n(.*?)\n```", rest[:nxt if nxt >= 0 else None], re.S | re.M)
        if found:
            shown[m[1]] = found[1]
    return shown


_BOX = re.compile(r"^[\s┏┓┗┛┳┻╇╈┡┩┃│━─┼├┤└┘┌┐┬┴═╞╡╪]*$")


def stable_lines(shown: str) -> list[str]:
    """The lines of a shown output every run must print: all but the trimming marks and table borders."""
    return [ln for ln in shown.splitlines() if ln.strip() and "…" not in ln and not _BOX.match(ln)]


# A number with its unit: times, sizes, ids and dates differ from run to run (host time is measured).
_NUMBER = re.compile(r"[-+]?\d[\d.,]*(?:e[-+]?\d+)?\s*(?:ns|µs|ms|s|KiB|MiB|kB|MB|B|%)?(?![A-Za-z\d])")


def normalize(text: str) -> str:
    """Numbers become ``#`` and whitespace goes (wrapping and table padding follow the numbers' widths).

    >>> normalize("  total_time   494.653 µs │") == normalize("total_time 1.2 ms │")
    True
    """
    return re.sub(r"\s+", "", _NUMBER.sub("#", text))


def _key(lines: list[str]) -> str:
    """What must match between a shown run of lines and a printed one: words and numbers' places."""
    return re.sub(r"[┏┓┗┛┳┻╇╈┡┩┃│━─┼├┤└┘┌┐┬┴═╞╡╪]", "", normalize("\n".join(lines)))


def _find_run(printed: list[str], shown: list[str], start: int) -> tuple[int, int] | None:
    """``(i, j)``: the first ``printed[i:j]`` from ``start`` that is ``shown`` with other numbers and wrapping
    (table borders and blank lines at either end matched one for one)."""
    lead = next((n for n, ln in enumerate(shown) if _key([ln])), len(shown))
    trail = next((n for n, ln in enumerate(reversed(shown)) if _key([ln])), 0)
    core = _key(shown[lead:len(shown) - trail])
    for i in range(start + lead, len(printed)):
        if not _key([printed[i]]) or not core.startswith(_key([printed[i]])):
            continue
        for j in range(i + 1, len(printed) + 1):
            got = _key(printed[i:j])
            if got == core and _key([printed[j - 1]]):
                if i - lead >= start and j + trail <= len(printed) and \
                        not _key(printed[i - lead:i]) and not _key(printed[j:j + trail]):
                    return i - lead, j + trail
                break
            if not core.startswith(got):
                break
    return None


def refreshed_block(shown: str, printed: str) -> str | None:
    r"""The document's output block ``shown`` with this run's lines: each stretch between the trimming marks
    (lines with ``…``, kept as written) is replaced by the printed lines it stands for; None when a
    stretch was not printed.

    >>> refreshed_block("total 1.5 µs\n…\nend 3", "x\ntotal 2.25 µs\ny\nend 4")
    'total 2.25 µs\n…\nend 4'
    """
    lines = [ln.rstrip() for ln in printed.splitlines()]
    out, stretch, at = [], [], 0

    def flush():
        nonlocal at
        if stretch and not _key(stretch):   # only borders between two trims: nothing to match
            out.extend(stretch)
            stretch.clear()
        if stretch:
            found = _find_run(lines, stretch, at)
            if found is None:
                return False
            out.extend(lines[found[0]:found[1]])
            at = found[1]
            stretch.clear()
        return True

    for ln in shown.splitlines():
        if "…" in ln:
            if not flush():
                return None
            out.append(ln)
        else:
            stretch.append(ln)
    return "\n".join(out) if flush() else None


def rewrite_document(outputs: dict[str, str], text: str | None = None) -> tuple[str, list[str]]:
    """The document with every step's output block refreshed from ``outputs``; and the steps whose block
    could not be (their shown lines were not printed: edit those by hand)."""
    text = DOC.read_text() if text is None else text
    stale, parts, pos = [], [], 0
    for m in _BLOCK.finditer(text):
        rest_at = m.end()
        nxt = text.find("<!-- step:", rest_at)
        found = re.compile(r"^```text\n(.*?)\n```", re.S | re.M).search(text, rest_at, nxt if nxt >= 0 else len(text))
        if not found or m[1] not in outputs:
            continue
        new = refreshed_block(found[1], outputs[m[1]])
        if new is None:
            stale.append(m[1])
            continue
        parts += [text[pos:found.start(1)], new]
        pos = found.end(1)
    return "".join(parts) + text[pos:], stale
