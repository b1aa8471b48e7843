"""The real Neuron Explorer schema is defined once (traces.profile_schema): views, SchemaFields,
--show-profile-schema and docs/trace_schema.md all come from it and agree."""
from pathlib import Path

import duckdb

import traces
from traces import profile_schema

ROOT = Path(__file__).resolve().parents[1]


def test_the_doc_mapping_is_the_definition():
    doc = (ROOT / "docs" / "trace_schema.md").read_text()
    assert profile_schema.mapping_markdown() in doc, "regenerate docs/trace_schema.md's mapping from the definition"


def test_every_real_table_is_queryable_in_an_empty_profile_with_its_real_columns(tmp_path):
    traces.Writer(tmp_path, run={"run_id": "r"}).close()
    path = str(traces.finalize(tmp_path))
    with duckdb.connect(path, read_only=True) as con:
        for name, table in profile_schema.TABLES.items():
            cols = [r[0] for r in con.execute(f'DESCRIBE {profile_schema.SCHEMA}."{name}"').fetchall()]
            assert cols[:len(table.fields)] == [f.name for f in table.fields], name
        fields = con.execute("SELECT table_name, count(*) FROM SchemaFields GROUP BY 1").fetchall()
        # the sizes of the real tables: Instruction 55, Summary 101, Metadata 38 fields (schema 7.4.0)
        assert dict(fields) == {n: len(t.fields) for n, t in profile_schema.TABLES.items()}
        assert dict(fields)["Instruction"] == 55 and dict(fields)["Summary"] == 101 and dict(fields)["Metadata"] == 38
        assert con.execute("SELECT pcore_idx, sum(duration_ns) FROM Instruction GROUP BY 1").fetchall() == []


def test_missing_fields_say_why():
    for table in profile_schema.TABLES.values():
        for f in table.fields:
            assert f.ours is not None or f.why, f"{table.name}.{f.name}: a NULL column needs its reason"
