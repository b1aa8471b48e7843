"""The parity table of docs/explorer.md as data: docs/explorer_parity.toml holds one entry per real Neuron Explorer
feature (verdict, what we have, why); this renders the table and its counts between the document's
``<!-- parity:begin -->`` and ``<!-- parity:end -->`` lines (``python tests/test_explorer_parity.py --write``).

>>> counts([{"section": "UI", "verdict": "same"}, {"section": "UI", "verdict": "missing"}])["total"]["missing"]
1
"""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "explorer_parity.toml"
DOC = ROOT / "docs" / "explorer.md"
VERDICTS = ("same", "differs", "missing", "beyond")
BEGIN, END = "<!-- parity:begin -->", "<!-- parity:end -->"
_BLOCK = re.compile(re.escape(BEGIN) + r"\n(.*?)" + re.escape(END), re.S)


def features() -> list[dict]:
    """The entries of docs/explorer_parity.toml, in order."""
    return tomllib.loads(DATA.read_text())["feature"]


def counts(rows: list[dict]) -> dict[str, dict[str, int]]:
    """Verdict counts per section (in order of first appearance) and in ``total``."""
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        for key in (r["section"], "total"):
            out.setdefault(key, dict.fromkeys(VERDICTS, 0))[r["verdict"]] += 1
    out["total"] = out.pop("total")
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").strip()


def render(rows: list[dict] | None = None) -> str:
    """The block between the markers: the counts, then one row per feature."""
    rows = features() if rows is None else rows
    c = counts(rows)
    t = c["total"]
    model = sum(r["verdict"] == "differs" and r.get("cause") == "model" for r in rows)
    out = [f"**{len(rows)} features: {t['same']} the same, {t['differs']} different ({model} of them because the "
           f"simulated device or compiler has no such thing: *model*), {t['missing']} missing, {t['beyond']} "
           "beyond the real tool.**", "",
           "| | same | differs | missing | beyond | total |", "|---|---|---|---|---|---|"]
    for name, n in c.items():
        label = "**total**" if name == "total" else name
        out.append(f"| {label} | " + " | ".join(str(n[v]) for v in VERDICTS) + f" | {sum(n.values())} |")
    out += ["", "| area | real | verdict | here | why |", "|---|---|---|---|---|"]
    for r in rows:
        verdict = r["verdict"] + (" (model)" if r.get("cause") == "model" else "")
        out.append(f"| {r['section']} | {_cell(r['real'])} | {verdict} | {_cell(r['here'])} | {_cell(r['why'])} |")
    return "\n".join(out) + "\n"


def shown(text: str | None = None) -> str:
    """The block the document shows now."""
    m = _BLOCK.search(DOC.read_text() if text is None else text)
    assert m, f"{DOC} has no {BEGIN} … {END} block"
    return m[1]


def rewrite() -> None:
    """Write the rendered table into the document."""
    text = DOC.read_text()
    shown(text)
    DOC.write_text(_BLOCK.sub(lambda _: f"{BEGIN}\n{render()}{END}", text))


def reference_rows(text: str) -> list[tuple[str, int]]:
    """(first cell, parts) of every feature row of the reference comparison's tables: a row whose latest verdict
    has two parts ("same / differs") is two features."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if (not line.startswith("|") or len(cells) < 5 or cells[0] in ("real", "") or set(cells[0]) <= set("-")
                or cells[1].strip("*").isdigit()):   # headers, rules and the counts table
            continue
        rows.append((cells[0], cells[3].count(" / ") + 1))
    return rows
