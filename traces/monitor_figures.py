"""The monitor's figures, one function each, shared by neuron-monitor's live documents
(:mod:`traces.live`), its replays of a profile (``monitor/replay.py``) and the Summary
(:mod:`traces.q_figures`): percentages of a span, engine shares, MFU and one target's block.
"""
from __future__ import annotations

from traces.vocab import MONITOR_ENGINES


def percent(ns: float, span_ns: float) -> float:
    """A monitor percentage: ``ns`` of ``span_ns``, capped at 100, two decimals (live and replay alike).

    >>> percent(1_500, 2_000), percent(3_000, 2_000)
    (75.0, 100.0)
    """
    return round(min(100.0, 100.0 * max(float(ns), 0.0) / span_ns), 2) if span_ns > 0 else 0.0


def engine_shares(active_ns: dict, span_ns: float) -> dict:
    """Each engine's active share of ``span_ns`` in percent (:func:`percent`): the monitor's engines,
    then any other engine ``active_ns`` names (the CC engine's collectives). neuron-monitor's live
    documents and its replays of a profile both compute the ``engines`` block with it.

    >>> engine_shares({"tensor": 500, "cc": 250}, 1_000)["cc"]
    25.0
    """
    names = list(MONITOR_ENGINES) + [e for e in active_ns if e not in MONITOR_ENGINES]
    return {e: percent(active_ns.get(e, 0), span_ns) for e in names}


def mfu_percent(model_flops: float, peak_flops: float, device_ns: float) -> float:
    """Model FLOPs over the Tensor Engine's BF16 peak for ``device_ns``, in percent (the Summary's
    ``mfu_estimated_percent`` formula). Example: ``mfu_percent(9.175e10, 9.175e13, 1e6)`` is 100.0."""
    return 100.0 * model_flops / (peak_flops * device_ns / 1e9) if peak_flops > 0 and device_ns > 0 else 0.0


def target_block(instance_type: str, cores, runtime_memory: dict, peak_flops: float, model_flops: float,
                 device_ns: float) -> dict:
    """One target's figures, as ``neuron_stack.targets[<target>]`` of a monitor document (live or replay)
    and :meth:`traces.query.Profile.targets` give them: a process with trn1 and inf2 sessions runs on
    two simulated instances, each with its own cores, runtime reservation per core and peak.

    >>> b = target_block("inf2.48xlarge", [0], {0: 64 * 2**20}, 9.175e13, 9.175e7, 1e6)
    >>> b["runtime_memory_bytes"], round(b["mfu_percent"], 3)
    ({'0': 67108864}, 0.1)
    """
    return {"instance_type": str(instance_type or ""), "cores": sorted({int(c) for c in cores}),
            "runtime_memory_bytes": {str(c): b for c, b in sorted((int(c), int(b)) for c, b in runtime_memory.items())},
            "peak_flops": float(peak_flops or 0.0), "model_flops": int(model_flops), "device_ns": int(device_ns),
            "mfu_percent": mfu_percent(model_flops, peak_flops or 0.0, device_ns)}
