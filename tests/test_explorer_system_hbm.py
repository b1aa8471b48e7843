"""The System Trace's HBM rows by category (issue 39): kept apart from the browser tests, whose shared server
holds the Explorer's registry this test replaces."""
from __future__ import annotations


def test_hbm_in_use_by_category(recorded_samples):
    """The System Trace's HBM rows: in use by category (tensors, constants, model code, ...), which add up to the
    total at every change, each its own line under the tracks."""
    import traces
    from explorer import data
    from explorer.app import create_app
    from explorer.pages import system as page

    path = recorded_samples.get("bert_encoder")["bert_encoder"]
    with traces.open(path) as p:
        s = p.host_series()
    level, total = {}, dict(zip(s["hbm"]["ts_ns"].to_pylist(), s["hbm"]["hbm_bytes"].to_pylist()))
    for r in sorted(s["hbm_category"].to_pylist(), key=lambda r: r["ts_ns"]):
        level[r["category"]] = r["hbm_bytes"]
        assert r["ts_ns"] in total
    assert {"tensors", "constants", "model_code"} <= set(level) and sum(level.values()) == total[max(total)]
    create_app([path])
    try:
        fig, *_ = page.render(data.registry().keys()[0])
        names = {t.get("name") for t in fig["data"]}
        assert {"HBM in use GB", "HBM tensors GB", "HBM constants GB", "HBM model_code GB"} <= names
    finally:
        data.registry().close()
