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
            if name.lower() not in ("summary", "metadata", "schemafields"):   # ours keep those names in main
                # main's copy selects from this one: the same columns of the same types
                assert (con.execute(f'DESCRIBE main."{name}"').fetchall()
                        == con.execute(f'DESCRIBE {profile_schema.SCHEMA}."{name}"').fetchall()), name
        fields = dict(con.execute("SELECT table_name, count(*) FROM SchemaFields GROUP BY 1").fetchall())
        # the sizes of the real tables: Instruction 55, Summary 101, Metadata 38 fields (schema 7.4.0), plus the
        # columns of ours a view keeps beside them
        ours = [r[0] for r in con.execute("SELECT column_name FROM information_schema.columns WHERE table_schema = "
                                          "'main' AND table_name = 'summary' ORDER BY ordinal_position").fetchall()]
        extras = {"Summary": len(profile_schema.summary_extras(ours))}   # our summary columns beside the real ones
        assert extras["Summary"] > 0
        assert {n: fields[n] for n in profile_schema.TABLES} == {
            n: len(t.fields) + len(t.extra) + extras.get(n, 0) for n, t in profile_schema.TABLES.items()}
        assert fields["Instruction"] == 55 + 2 and fields["Summary"] == 101 + extras["Summary"] \
            and fields["Metadata"] == 38
        assert con.execute("SELECT pcore_idx, sum(duration_ns) FROM Instruction GROUP BY 1").fetchall() == []


def test_missing_fields_say_why():
    for table in profile_schema.TABLES.values():
        for f in table.fields:
            assert f.ours is not None or f.why, f"{table.name}.{f.name}: a NULL column needs its reason"


def _described(path) -> None:
    """Every column of every table and view of the profile at ``path`` has its SchemaFields row, with a
    meaning, and SchemaFields describes nothing else."""
    with duckdb.connect(str(path), read_only=True) as con:
        catalogue = con.execute("SELECT table_schema, table_name, column_name, data_type "
                                "FROM information_schema.columns WHERE table_schema IN ('main', ?)",
                                [profile_schema.SCHEMA]).fetchall()
        rows = {(t, f): (d, typ) for t, f, d, typ in con.execute(
            "SELECT table_name, field_name, field_description, field_type FROM SchemaFields").fetchall()}
    tables = {t for _, t, _, _ in catalogue}
    assert {"Flow", "SemaphoreUpdate", "TensorInfo", "SbufAllocation", "instructions", "summary_per_core",
            "lod_busy", "Instruction", "SystemProfileEvents"} <= tables
    missing = sorted({f"{t}.{c}" for _, t, c, _ in catalogue if (t, c) not in rows})
    assert not missing, f"columns SchemaFields does not describe (document them in docs/trace_schema.md and run " \
                        f"python -m traces.table_docs docs/trace_schema.md): {missing}"
    vague = sorted(f"{t}.{c}" for (t, c), (d, _) in rows.items() if not d or d == "(not documented)")
    assert not vague, f"columns without a meaning in docs/trace_schema.md: {vague}"
    stale = sorted(f"{t}.{c}" for t, c in rows if t not in tables or (t, c) not in {(t, c) for _, t, c, _ in catalogue})
    assert not stale, f"SchemaFields rows for columns no table has: {stale}"
    for _, t, c, typ in catalogue:   # the type SchemaFields gives is the column's
        if t not in profile_schema.TABLES:
            assert rows[(t, c)][1] == profile_schema.openapi_type(typ)[0], (t, c, typ)


def test_schema_fields_describes_every_table_and_view_of_a_profile(tmp_path):
    """Issue 36: SchemaFields omitted Flow, SemaphoreUpdate, TensorInfo and SbufAllocation. Now it is built from
    the profile's own catalogue, so a table or column added without a meaning fails here."""
    from traces import synthetic

    traces.Writer(tmp_path / "empty", run={"run_id": "r"}).close()
    _described(traces.finalize(tmp_path / "empty"))
    synthetic.write_run(tmp_path / "run", executions=2, instructions=200, cores=(0, 1))
    _described(traces.finalize(tmp_path / "run"))


def test_the_column_meanings_are_the_docs():
    from traces import table_docs

    doc = (ROOT / "docs" / "trace_schema.md").read_text()
    assert table_docs.parse(doc) == table_docs.TABLES, "run python -m traces.table_docs docs/trace_schema.md"


def test_show_profile_schema_lists_every_table():
    import subprocess
    import sys

    import yaml

    exe = str(Path(sys.executable).parent / "neuron-explorer")
    r = subprocess.run([exe, "--show-profile-schema"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    schemas = yaml.safe_load(r.stdout)["components"]["schemas"]
    for name in ("Instruction", "Flow", "SemaphoreUpdate", "TensorInfo", "SbufAllocation", "instructions",
                 "summary", "lod_busy"):
        assert name in schemas, name
    assert schemas["Flow"]["properties"]["dependency_type"]["description"].startswith("FLOW_DEPENDENCE")
    assert schemas["Instruction"]["properties"]["nc_idx"]["type"] == "integer"
