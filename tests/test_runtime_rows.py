"""The runtime's typed trace rows have exactly their table's columns, and the writer refuses any other."""
from __future__ import annotations

import dataclasses

import pytest

import traces
from neuron_stack.runtime.rows import ROW_TYPES, EventRow, ExecutionRow, GraphRow
from traces.schema import TABLES
from traces.writer import to_table

EXAMPLES = [
    GraphRow(graph_id=1, run_id="r", name="g", kind="trace", neff_hash="h", input_signature="(2,) float32",
             target="trn1", flags="{}"),
    ExecutionRow(exec_id=2, run_id="r", graph_id=1, core=0, iteration=0, wall_start_ns=1, wall_end_ns=2,
                 start_ns=3, end_ns=4, device_ns=1, warmup=True, flops=8, busy_ns={"tensor": 5, "cc": 1}),
    EventRow(ts_ns=1, wall_ns=1, run_id="r", kind="load", detail={"model": "g"}),
]


@pytest.mark.parametrize("row", EXAMPLES, ids=lambda r: type(r).__name__)
def test_row_columns_are_its_tables_columns(row):
    assert type(row) in ROW_TYPES
    assert set(row.columns()) == set(TABLES[row.TABLE].names)
    table = to_table(row.TABLE, row.columns())
    assert table.num_rows == 1


def test_execution_row_spreads_busy_time_and_keeps_host_time_out():
    cols = EXAMPLES[1].columns()
    assert cols["tensor_busy_ns"] == [5] and cols["cc_busy_ns"] == [1] and cols["vector_busy_ns"] == [0]
    bad = dataclasses.replace(EXAMPLES[1], busy_ns={"cpu": 7})
    with pytest.raises(ValueError, match="cpu_fallback_ns"):
        bad.columns()


def test_a_misspelt_field_fails_where_the_row_is_built_and_the_writer_refuses_unknown_columns():
    with pytest.raises(TypeError):
        EventRow(ts_ns=1, wall_ns=1, run_id="r", kind="load", graphid=3)   # the typo under test
    cols = EXAMPLES[2].columns() | {"graphid": [3]}
    with pytest.raises(traces.TraceError, match="no column 'graphid'"):
        to_table("events", cols)


def test_writer_refuses_an_unknown_run_key(tmp_path):
    with pytest.raises(traces.TraceError, match="no column 'rnak'"):
        traces.Writer(tmp_path, run={"run_id": "x", "rnak": 1})
