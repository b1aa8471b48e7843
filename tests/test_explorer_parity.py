"""docs/explorer.md's parity table against the real Neuron Explorer is generated from docs/explorer_parity.toml:
every feature of the reference comparison has a row, each row a valid verdict and a reason, and the table and its
counts in the document are what the data says. ``python tests/test_explorer_parity.py --write`` rewrites the table.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import parity_doc  # noqa: E402

#: The reference comparison (the project's shared notes, outside the repository): checked when it is there.
REFERENCE = Path(os.environ.get("NEURON_STACK_PARITY_REFERENCE",
                                "/work/shared/reference/neuron_explorer_parity.md"))


def test_every_feature_has_a_verdict_and_a_reason():
    rows = parity_doc.features()
    assert len(rows) == 64   # the reference's count of real features
    keys = [(r["ref"], r.get("part", 1)) for r in rows]
    assert len(set(keys)) == len(keys), "two entries for one feature"
    for r in rows:
        assert r["verdict"] in parity_doc.VERDICTS, r
        assert r["real"] and r["here"], r
        if r["verdict"] in ("differs", "missing"):
            assert r.get("cause") in ("model", "gap") and r["why"], f"a {r['verdict']} feature needs why: {r}"


def test_the_document_shows_the_table_of_the_data():
    assert parity_doc.shown() == parity_doc.render(), \
        "docs/explorer.md's parity table is stale: python tests/test_explorer_parity.py --write"
    total = parity_doc.counts(parity_doc.features())["total"]
    assert f"{total['same']} the same, {total['differs']} different" in parity_doc.shown()


@pytest.mark.skipif(not REFERENCE.exists(), reason=f"the reference comparison is not here ({REFERENCE})")
def test_every_feature_of_the_reference_has_a_row():
    ref = parity_doc.reference_rows(REFERENCE.read_text())
    assert sum(parts for _, parts in ref) == 64
    rows = parity_doc.features()
    for first, parts in ref:
        mine = [r for r in rows if first.startswith(r["ref"])]
        assert sorted(r.get("part", 1) for r in mine) == list(range(1, parts + 1)), (first, parts, mine)
    assert len(rows) == sum(parts for _, parts in ref)


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        parity_doc.rewrite()
        print(f"wrote the parity table into {parity_doc.DOC}")
    else:
        sys.exit(pytest.main([__file__, "-q"]))
