"""The building blocks of the real Neuron Explorer tables: a field (name, type, unit, required, the real
description, the SQL over our tables that fills it) and a table (its fields over a FROM clause).
:mod:`traces.profile_schema` and :mod:`traces.profile_tables` define the tables with them.

>>> f = F("duration_ns", "int64", "nanoseconds", True, "Duration.", "i.dur_ns")
>>> f.sql
'CAST(i.dur_ns AS BIGINT) AS duration_ns'
"""
from __future__ import annotations

from dataclasses import dataclass

#: Our short type names → (OpenAPI type, OpenAPI format, DuckDB type).
_TYPES = {
    "int64": ("integer", "int64", "BIGINT"), "int32": ("integer", "int32", "INTEGER"),
    "float": ("number", "float", "DOUBLE"), "string": ("string", None, "VARCHAR"),
    "bool": ("boolean", None, "BOOLEAN"), "string[]": ("array", "string", "VARCHAR[]"),
    "int64[]": ("array", "integer", "BIGINT[]"),
}

_PCORE = ("Index of the physical NeuronCore within a Logical NeuronCore (LNC). For LNC2 this field can have a "
          "value of either 0 or 1.")
_NO_LNC = "per-execution rows are the logical core's; physical core 0 stands for it"


@dataclass(frozen=True)
class Field:
    """One field of a real table: its schema entry and the SQL expression that fills it here."""
    name: str
    type: str
    unit: str | None
    required: bool
    description: str
    ours: str | None
    why: str = ""

    @property
    def sql(self) -> str:
        """The view's column, of the real type: our expression, or NULL for a field we do not record."""
        return f"CAST({self.ours if self.ours is not None else 'NULL'} AS {_TYPES[self.type][2]}) AS {self.name}"


@dataclass(frozen=True)
class Table:
    """A real table: name, description, the FROM clause over our tables, and its fields."""
    name: str
    description: str
    source: str
    fields: tuple[Field, ...]
    extra: tuple[str, ...] = ()   # our columns kept beside the real ones (``expr AS name``)

    def field(self, name: str) -> Field:
        """The field called ``name``. Example: ``TABLES["CcOp"].field("operation")``."""
        return next(f for f in self.fields if f.name == name)

    def view_sql(self, schema: str = "main") -> str:
        """``CREATE VIEW`` text of this table over our tables."""
        cols = ",\n    ".join([f.sql for f in self.fields] + list(self.extra))
        return f'CREATE OR REPLACE VIEW {schema}."{self.name}" AS SELECT\n    {cols}\nFROM {self.source}'


def F(name, typ, unit, required, description, ours, why=""):   # noqa: N802 - reads as a table row
    return Field(name, typ, unit, required, description, ours, why)


#: An instruction's HBM bytes read and written: the compiler's count per instruction (instructions.hbm_read_bytes,
#: schema 1.7); before it, a DMA's bytes (on engines bytes_read / bytes_written are SBUF/PSUM traffic).
HBM_READ = "coalesce(i.hbm_read_bytes, CASE WHEN i.engine = 'dma' THEN i.bytes_read ELSE 0 END)"
HBM_WRITE = "coalesce(i.hbm_write_bytes, CASE WHEN i.engine = 'dma' THEN i.bytes_written ELSE 0 END)"

_NS = "nanoseconds"
_B = "bytes"
