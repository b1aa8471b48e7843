"""LLM serving figures (tables ``serving_requests`` and ``serving_steps``, written by
``neuron_stack.inference``), each computed once here:

- per request: queue time (arrival → scheduled), TTFT (arrival → first token), TPOT ((finish − first
  token) / (output tokens − 1)), E2E (arrival → finish); times on the projected clock;
- their P50/P90/P99 over finished requests, output tokens per second over the serving span;
- bucket use: steps, tokens and device time per (phase, bucket), and request time beside it (device time
  plus each call's runtime launch and copies over the host link: ``serving_steps.request_ns``, schema 1.6.0;
  null for a profile written before it);
- request time against device time per phase (``request_time``): what the page and ``traces.cli serving``
  show.

A profile without the tables (written before schema 1.2.0, or with no serving) has no requests.

>>> import tempfile, traces, traces.synthetic
>>> d = tempfile.mkdtemp()
>>> _ = traces.synthetic.write_run(d, executions=2, instructions=50)
>>> with traces.open(d) as p:
...     p.serving_summary()["requests"]
0
"""

from __future__ import annotations

import pyarrow as pa

PERCENTILES = (50, 90, 99)

_REQUESTS = """
SELECT request_id, model, slot, prompt_tokens, output_tokens, cte_bucket, finish_reason,
       arrival_ns, scheduled_ns, first_token_ns, finish_ns,
       scheduled_ns - arrival_ns AS queue_ns,
       first_token_ns - arrival_ns AS ttft_ns,
       CASE WHEN output_tokens > 1 THEN (finish_ns - first_token_ns) / (output_tokens - 1) END AS tpot_ns,
       finish_ns - arrival_ns AS e2e_ns
FROM serving_requests ORDER BY arrival_ns, request_id
"""


def _has(p) -> bool:
    return "serving_requests" in p.tables()


def requests(p) -> pa.Table:
    """One row per finished request with its queue, TTFT, TPOT and E2E (ns, projected clock)."""
    if not _has(p):
        return pa.table({})
    return p.sql(_REQUESTS)


def steps(p) -> pa.Table:
    """The engine's steps in order: phase (prefill/decode), bucket, slots, tokens, waiting, device time."""
    if not _has(p):
        return pa.table({})
    return p.sql("SELECT * FROM serving_steps ORDER BY start_ns, step")


def _request_col(p) -> str:
    """``request_ns``, or a typed null for a profile written before schema 1.6.0."""
    cols = p.sql("SELECT column_name FROM information_schema.columns WHERE table_name = 'serving_steps' "
                 "AND column_name = 'request_ns'")
    return "request_ns" if cols.num_rows else "NULL::BIGINT"


def bucket_use(p) -> pa.Table:
    """Per (phase, bucket): steps, tokens, device time, request time (device time plus each call's launch and
    host-link copies; null before schema 1.6.0) and mean active rows per step."""
    if not _has(p):
        return pa.table({})
    return p.sql(
        "SELECT phase, bucket, count(*) AS steps, sum(tokens)::BIGINT AS tokens, "
        f"sum(device_ns)::BIGINT AS device_ns, sum({_request_col(p)})::BIGINT AS request_ns, "
        "avg(active) AS mean_active, max(batch_size) AS batch_size FROM serving_steps "
        "GROUP BY phase, bucket ORDER BY phase DESC, bucket"
    )


def request_time(p) -> list[dict]:
    """Per phase (prefill, decode): steps, device time and request time per step (ns, means) and what the
    request adds (``added_ns``); request figures are None for a profile written before schema 1.6.0.
    Device time and request time are never mixed: both are shown, the second never replaces the first."""
    if not _has(p):
        return []
    rows = p.sql(
        f"SELECT phase, count(*) AS steps, avg(device_ns) AS device_ns, avg({_request_col(p)}) AS request_ns "
        "FROM serving_steps GROUP BY phase ORDER BY phase DESC"
    ).to_pylist()
    for r in rows:
        r["added_ns"] = None if r["request_ns"] is None else r["request_ns"] - r["device_ns"]
    return rows


def summary(p) -> dict:
    """Requests, tokens, output tokens/s and P50/P90/P99 of TTFT, TPOT, E2E and queue time (ns)."""
    out = {
        "requests": 0,
        "prompt_tokens": 0,
        "output_tokens": 0,
        "output_tokens_per_s": 0.0,
        "span_ns": 0,
        "steps": 0,
        "prefill_steps": 0,
        "decode_steps": 0,
    }
    if not _has(p):
        return out
    row = p.sql(
        "SELECT count(*) AS n, coalesce(sum(prompt_tokens), 0)::BIGINT AS pt, "
        "coalesce(sum(output_tokens), 0)::BIGINT AS ot, "
        "coalesce(max(finish_ns) - min(arrival_ns), 0)::BIGINT AS span FROM serving_requests"
    ).to_pylist()[0]
    out.update(requests=row["n"], prompt_tokens=row["pt"], output_tokens=row["ot"], span_ns=row["span"])
    if row["span"]:
        out["output_tokens_per_s"] = row["ot"] / (row["span"] / 1e9)
    st = p.sql(
        "SELECT count(*) AS n, count(*) FILTER (WHERE phase = 'prefill') AS pre, "
        "count(*) FILTER (WHERE phase = 'decode') AS dec FROM serving_steps"
    ).to_pylist()[0]
    out.update(steps=st["n"], prefill_steps=st["pre"], decode_steps=st["dec"])
    quant = ", ".join(f"quantile_cont({{m}}, {q / 100}) AS p{q}" for q in PERCENTILES)
    for metric in ("ttft_ns", "tpot_ns", "e2e_ns", "queue_ns"):
        r = p.sql(f"SELECT {quant.format(m=metric)} FROM ({_REQUESTS})").to_pylist()[0]
        for q in PERCENTILES:
            out[f"{metric.removesuffix('_ns')}_p{q}_ns"] = r[f"p{q}"]
    return out
