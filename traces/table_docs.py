"""What each column of our own tables means, for ``SchemaFields``: read from docs/trace_schema.md, kept here.

docs/trace_schema.md is where a column is documented (raw tables, the compiler's records, derived
tables); :func:`parse` reads its ``### table — description`` sections and their column tables, and
:data:`TABLES` is that result, written into ``traces/table_columns.py`` by ``python -m traces.table_docs`` (the
package does not ship the docs). ``tests/test_profile_schema.py`` checks that :data:`TABLES` is what the page
says and that every column of every table and view of a finalised profile is described, so the page,
this file and the profiles cannot drift apart.

>>> parse("## Raw tables\\n### runs — one row per run\\n| column | type | meaning |\\n|---|---|---|\\n"
...       "| rank, node | INTEGER | `torch.distributed` rank and node |\\n")
{'runs': ('One row per run.', {'rank': 'torch.distributed rank and node', 'node': 'torch.distributed rank and node'})}
"""
from __future__ import annotations

import re

from traces.table_columns import TABLES

#: The sections of docs/trace_schema.md that document our tables (the real tool's tables come from
#: :mod:`traces.profile_schema`).
SECTIONS = ("## Raw tables", "## The compiler's records", "## Derived tables")

#: Tables documented as "the same columns as" another, with the columns they add.
SAME_AS = {"summary_per_core": ("summary", {"run_id": "process run of the row", "core": "NeuronCore of the row"})}


def _names(cell: str, braces: list[str]) -> list[str]:
    """``rank, node`` → two names; ``{tensor,vector}_x`` → ``tensor_x, vector_x``; ``{…}_y`` reuses the last set."""
    out = []
    for part in re.split(r",\s*(?![^{]*})", cell.replace("`", "")):
        part = part.strip()
        m = re.fullmatch(r"\{([^}]*)\}(\w+)", part)
        if m:
            if m.group(1) not in ("…", "..."):
                braces[:] = [b.strip() for b in m.group(1).split(",")]
            out += [b + m.group(2) for b in braces]
        elif re.fullmatch(r"\w+", part):
            out.append(part)
    return out


def parse(markdown: str) -> dict[str, tuple[str, dict[str, str]]]:
    """``{table: (description, {column: meaning})}`` from the column tables of docs/trace_schema.md."""
    out: dict[str, tuple[str, dict[str, str]]] = {}
    on, table, braces = False, None, []
    for line in markdown.splitlines():
        if line.startswith("## "):
            on, table = line.startswith(SECTIONS), None
        elif on and line.startswith("### "):
            m = re.match(r"### `?(\w+)`? — (.*)", line)
            table = m.group(1) if m else None
            if table:
                text = m.group(2).replace("`", "").strip()
                out[table] = (text[:1].upper() + text[1:].rstrip(".") + ".", {})
        elif table and line.startswith("|") and not line.startswith(("| column", "|---")):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            meaning = cells[-1].replace("`", "").replace("\\|", "|").strip()
            for name in _names(cells[0], braces):
                out[table][1][name] = meaning or name.replace("_", " ")
    return out


def describe(table: str) -> tuple[str, dict[str, str]] | None:
    """The description and column meanings of one of our tables (``None`` if undocumented).

    >>> describe("summary_per_core")[1]["core"]
    'NeuronCore of the row'
    """
    if table in SAME_AS:
        base, extra = SAME_AS[table]
        desc, cols = TABLES.get(base, ("", {}))
        return f"{desc.rstrip('.')}, per run and NeuronCore.", {**extra, **cols}
    return TABLES.get(table)


if __name__ == "__main__":   # regenerate traces/table_columns.py from the page
    import pprint
    import sys
    from pathlib import Path

    out = Path(__file__).with_name("table_columns.py")
    head = out.read_text().partition("TABLES: dict[str, tuple[str, dict[str, str]]] = ")[0]
    body = pprint.pformat(parse(Path(sys.argv[1]).read_text()), width=116, sort_dicts=False)
    out.write_text(f"{head}TABLES: dict[str, tuple[str, dict[str, str]]] = {body}\n")
