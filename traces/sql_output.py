"""How ``neuron-explorer sql`` writes a result: a table that stays readable at any width, CSV, JSON, Arrow.

Nested values (``VARCHAR[]``, structs, maps: ``SystemProfileEvents.flow_id``) are JSON text in CSV and
in the table, so every format takes every column. A table wider than the terminal is not squeezed into
one-character columns: a single row is printed transposed (one line per column, as DuckDB's
``.mode line`` and psql's expanded display), several rows keep the columns that fit from both ends and
say how many were left out (as DuckDB's own table output), and ``--expanded`` prints every row as a
column/value block.

>>> import pyarrow as pa
>>> t = pa.table({"flow_id": pa.array([["7", "8"], None], pa.list_(pa.string())), "n": [1, 2]})
>>> print(to_csv_bytes(t).decode(), end="")
"flow_id","n"
"[""7"", ""8""]",1
,2
"""
from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.types as pat

#: A column is given at most this many characters when deciding whether a table fits (longer cells fold).
FIT_CELL_CHARS = 24
#: Rich spends this many characters per column on borders and padding.
COLUMN_CHROME = 3


def _nested(typ: pa.DataType) -> bool:
    return pat.is_nested(typ) or pat.is_dictionary(typ) and pat.is_nested(typ.value_type)


def _json(value) -> str | None:
    return None if value is None else json.dumps(value, default=str, ensure_ascii=False)


def flat(table: pa.Table) -> pa.Table:
    """``table`` with every list, struct or map column as JSON text (other columns unchanged).

    >>> flat(pa.table({"m": pa.array([{"a": 1}])})).column("m").to_pylist()
    ['{"a": 1}']
    """
    for i, field in enumerate(table.schema):
        if _nested(field.type):
            text = pa.array([_json(v) for v in table.column(i).to_pylist()], pa.string())
            table = table.set_column(i, pa.field(field.name, pa.string()), text)
    return table


def to_csv_bytes(table: pa.Table) -> bytes:
    """The CSV text of ``table`` (header row first, nested values as JSON). Example above."""
    import pyarrow.csv as pacsv

    sink = io.BytesIO()
    pacsv.write_csv(flat(table), sink)
    return sink.getvalue()


def write(result: pa.Table, fmt: str, output: Path | None, *, max_rows: int = 100, expanded: bool = False) -> None:
    """Write ``result`` as ``fmt`` (``table``, ``csv``, ``json``, ``arrow``) to ``output`` or stdout.

    Example: ``write(p.sql("SELECT * FROM Summary"), "table", None)``.
    """
    if fmt == "table":
        print_table(result, max_rows, output, expanded=expanded)
    elif fmt == "arrow":
        import pyarrow.ipc as ipc

        with ipc.new_file(str(output) if output else sys.stdout.buffer, result.schema) as writer:
            writer.write_table(result)
    elif fmt == "csv":
        if output:
            import pyarrow.csv as pacsv

            pacsv.write_csv(flat(result), str(output))
        else:
            sys.stdout.buffer.write(to_csv_bytes(result))
            sys.stdout.buffer.flush()
    else:
        text = json.dumps(result.to_pylist(), indent=1, default=str, ensure_ascii=False)
        if output:
            output.write_text(text + "\n", encoding="utf-8")
        else:
            print(text)


def cell(value) -> str:
    """A value as a table cell: nested values as JSON, cut at ``MAX_CELL_BYTES`` characters (rich
    folds a 500 MB string into millions of lines; ``--format csv`` writes it whole).

    >>> cell(None), cell(["7"]), cell("x" * 5000)[-43:]
    ('NULL', '["7"]', 'x… (5,000 characters; --format csv for all)')
    """
    from traces.console import MAX_CELL_BYTES

    text = "NULL" if value is None else _json(value) if isinstance(value, (list, dict, tuple)) else str(value)
    if len(text) <= MAX_CELL_BYTES:
        return text
    return f"{text[:MAX_CELL_BYTES]}… ({len(text):,} characters; --format csv for all)"


def _width(name: str, cells: list[str]) -> int:
    """The characters a column needs to be readable: its name and its cells, each up to FIT_CELL_CHARS."""
    return min(max([len(name), *map(len, cells)]), FIT_CELL_CHARS) + COLUMN_CHROME


def fitting_columns(widths: list[int], room: int) -> list[int]:
    """Indices of the columns to show in ``room`` characters: all when they fit, else alternately from
    the left and the right end (as DuckDB's table output), leaving room for one "…" column.

    >>> fitting_columns([10, 10, 10], 40), fitting_columns([10] * 6, 40)
    ([0, 1, 2], [0, 1, 5])
    """
    if sum(widths) <= room:
        return list(range(len(widths)))
    room -= 1 + COLUMN_CHROME
    left, right, used = [], [], 0
    lo, hi = 0, len(widths) - 1
    while lo <= hi:
        take_left = len(left) <= len(right)
        i = lo if take_left else hi
        if used + widths[i] > room:
            break
        used += widths[i]
        if take_left:
            left.append(i)
            lo += 1
        else:
            right.append(i)
            hi -= 1
    return left + right[::-1] or [0]


def print_table(result: pa.Table, max_rows: int, output: Path | None, *, expanded: bool = False) -> None:
    """Print ``result`` as a rich table readable at the terminal's width (see the module docstring)."""
    from rich.console import Console

    console = Console(file=open(output, "w", encoding="utf-8"), width=200) if output else Console(soft_wrap=False)
    try:
        shown = result.slice(0, max(0, max_rows))
        rows = [[cell(v) for v in r.values()] for r in shown.to_pylist()]
        names = result.schema.names
        widths = [_width(n, [r[i] for r in rows]) for i, n in enumerate(names)]
        caption = f"{result.num_rows:,} row{'s' if result.num_rows != 1 else ''}"
        if shown.num_rows < result.num_rows:
            caption += f" (first {shown.num_rows:,} shown: --max-rows N, or --format csv for all)"
        if expanded or (shown.num_rows == 1 and sum(widths) > console.width):
            for n, row in enumerate(rows):
                console.print(_record(result.schema, row, f"row {n + 1}" if len(rows) > 1 else None))
            console.print(caption, soft_wrap=True, highlight=False)
            return
        keep = fitting_columns(widths, console.width)
        if len(keep) < len(names):
            caption += (f"; {len(names) - len(keep)} of {len(names)} columns left out (…): select fewer columns, "
                        "--expanded for one block per row, or --format csv for all")
        console.print(_grid(result.schema, rows, keep, widths))
        console.print(caption, soft_wrap=True, highlight=False)
    finally:
        if output:
            console.file.close()


def _grid(schema: pa.Schema, rows: list[list[str]], keep: list[int], widths: list[int]):
    from rich.table import Table
    from rich.text import Text

    table = Table(show_header=True, header_style="bold")
    cols = list(keep)
    if len(keep) < len(schema):
        split = next((k for k, i in enumerate(keep) if k and i != keep[k - 1] + 1), len(keep))
        cols.insert(split, None)   # the "…" column where columns were left out
    for i in cols:
        if i is None:
            table.add_column("…", justify="center", no_wrap=True)
            continue
        f = schema.field(i)
        numeric = pat.is_integer(f.type) or pat.is_floating(f.type) or pat.is_decimal(f.type)
        table.add_column(f"{f.name}\n[dim]{_type(f.type)}[/]", justify="right" if numeric else "left",
                         overflow="fold", min_width=widths[i] - COLUMN_CHROME)
    for row in rows:
        # Text, not markup: a value like "s[s > 0]" must print as it is
        table.add_row(*(Text("…") if i is None else Text(row[i]) for i in cols))
    return table


def _record(schema: pa.Schema, row: list[str], title: str | None):
    """One row as a column / type / value table (the transposed view of a wide row)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(show_header=True, header_style="bold", title=title, title_justify="left")
    table.add_column("column", no_wrap=True)
    table.add_column("type", style="dim", no_wrap=True)
    table.add_column("value", overflow="fold")
    for f, value in zip(schema, row):
        table.add_row(Text(f.name), Text(_type(f.type)), Text(value))
    return table


def _type(typ: pa.DataType) -> str:
    return "list<" + _type(typ.value_type) + ">" if pat.is_list(typ) or pat.is_large_list(typ) else str(typ)
