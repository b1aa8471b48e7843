"""Calibration report: every public figure in the references against the projection (issues 18, 24).

``bench/fidelity.py --published`` prints it. Three groups of figures:

1. The published Llama rows (reference llm_serving_and_nki.md §2.12: aws-neuron-sdk
   ``about-neuron/benchmarks/{inf2,trn1}/latency_data_decoder.csv`` (TNx, Neuron 2.18) and the NxDI
   ``llama70b/405b_perf_comparison.csv``): TTFT and TPOT per row, the projection, their ratio, the
   roofline bound of the row, and over all modelled values the geometric-mean ratio (bias) and error (either
   way) and Spearman's rank correlation. Every row is projected by the one projection function the CLI,
   ``inference_demo`` and ``NeuronModelForCausalLM`` use (:func:`neuron_stack.inference.projection.project_serving` over
   :func:`neuron_stack.llm.project`), with the row's settings as NxDI runs them: sequence = input +
   output, one context-encoding bucket of the input length, NxDI's token-generation buckets
   (``generate_buckets(128, seq)``: powers of two, then the sequence), each decode step at its
   first-fit bucket (TPOT = their mean).
2. The NKI guide's Tensor Engine curve (arch guide: II = max(N_moving, 64) cycles, peak at moving 512)
   and DMA statements (DMA guide: < 256 B per partition overhead-bound, >= 2 KiB near peak, >= 4 KiB
   saturated) against the lowered, scheduled instructions.
3. Encoder figures: none are public in the references (the held-out encoder table is not), so none
   are printed.

Nothing here is fitted: every constant is a device-profile field (device.py cites each), and a row
that disagrees is explained, not tuned.
"""

from __future__ import annotations

import math

import neuron_stack.compiler.lower  # noqa: F401  (registers the op lowerings)
from neuron_stack.compiler.lower.lowerer import Lowerer
from neuron_stack.compiler.lower.tiles import Lowered, Pool
from neuron_stack.compiler.schedule import schedule_lowered
from neuron_stack.device.cost import matmul_ns
from neuron_stack.device.profiles import get_profile
from neuron_stack.inference.config import NeuronConfig, generate_buckets
from neuron_stack.inference.projection import project_serving
from neuron_stack.ir import Program
from neuron_stack.llm.configs import load_config
from neuron_stack.llm.project import rank_config
from neuron_stack.runtime.collectives import Group, plan

#: the published model names -> the neuron-llm presets (their config.json architecture fields)
PRESET = {
    "Llama-3-8B": "llama-3-8b",
    "Llama-3-70B": "llama-3-70b",
    "Llama-3.3-70B": "llama-3.3-70b",
    "Llama-3.1-405B": "llama-3.1-405b",
}
#: the instance each row ran on (reference §2.12)
INSTANCE = {"inf2": "inf2.48xlarge", "trn1": "trn1.32xlarge", "trn2": "trn2.48xlarge"}

# §2.12 rows: model, target, TP, batch, input, output, TTFT ms, TPOT ms, note
ROWS = [
    ("Llama-3-8B", "inf2", 24, 1, 128, 8064, 29.47, 7.41, "int8 weights"),
    ("Llama-3-8B", "inf2", 24, 1, 4096, 4096, 209.37, 7.47, "int8 weights"),
    ("Llama-3-8B", "inf2", 24, 8, 128, 3968, 66.02, 10.45, "int8 weights"),
    ("Llama-3-70B", "inf2", 24, 1, 2048, 2048, 745.49, 34.67, ""),
    ("Llama-3-70B", "inf2", 24, 1, 128, 128, 77.81, 32.20, ""),
    ("Llama-3-8B", "trn1", 32, 1, 128, 3968, 14.75, 5.86, "int8 weights"),
    ("Llama-3-8B", "trn1", 32, 8, 128, 3968, 49.05, 7.65, "int8 weights"),
    ("Llama-3-70B", "trn1", 32, 1, 2048, 2048, 547.00, 26.20, ""),
    ("Llama-3-70B", "trn1", 32, 4, 128, 1024, 129.86, 28.38, ""),
    ("Llama-3.3-70B", "trn2", 64, 1, 10000, 1500, 814.2, 19.6, "NxDI, vLLM"),
    ("Llama-3.3-70B", "trn2", 64, 1, 10000, 1500, 870.1, 5.3, "fused speculation: not modelled"),
    ("Llama-3.1-405B", "trn2", 64, 1, 10000, 1500, 2442.0, 37.9, "NxDI, vLLM"),
    ("Llama-3.1-405B", "trn2", 64, 1, 10000, 1500, 2255.0, 8.27, "fused speculation: not modelled"),
]


def row_settings(row) -> tuple[str, NeuronConfig, int, int]:
    """(preset, NeuronConfig, input length, output length) of a §2.12 row, as a user would give them to
    ``inference_demo`` or ``neuron-llm project``: sequence = input + output, one context-encoding bucket
    of the input, NxDI's token-generation buckets (reference §2.4). The trn2 rows run sequence-parallel
    context encoding: the NxDI model card of the 70B trn2 configuration lists it (reference §2.12, the
    paragraph after the table: ``card_llama33_70b.yml``, "fused QKV, sequence parallel, kernels on"); the
    405B rows ran the same NxDI recipe on the same instance; the inf2/trn1 rows are TNx (no such option).

    >>> preset, nc, n_in, n_out = row_settings(ROWS[0])
    >>> preset, nc.context_encoding_buckets, nc.token_generation_buckets, nc.instance_type
    ('llama-3-8b', [128], [128, 256, 512, 1024, 2048, 4096, 8192], 'inf2.48xlarge')
    >>> nc.sequence_parallel_enabled, row_settings(ROWS[9])[1].sequence_parallel_enabled
    (False, True)
    """
    model, target, tp, batch, n_in, n_out = row[:6]
    seq = n_in + n_out
    nc = NeuronConfig(
        tp_degree=tp,
        batch_size=batch,
        seq_len=seq,
        max_context_length=n_in,
        context_encoding_buckets=[n_in],
        token_generation_buckets=generate_buckets(128, seq),
        torch_dtype="bfloat16",
        target=target,
        instance_type=INSTANCE[target],
        sequence_parallel_enabled=target == "trn2",
        # the NxDI card of the trn2 configuration samples on device ("on-device sampling do_sample/dynamic");
        # transformers-neuronx samples on the host: the logits go to it every step (request time)
        on_device_sampling_config={} if target == "trn2" else None,
    )
    return PRESET.get(model, model), nc, n_in, n_out


def neuron_release(row) -> str:
    """The Neuron runtime release whose collective algorithms a row ran with: reference §2.12's transformers-neuronx
    rows (trn1, inf2) are Neuron 2.18 (Ring: :mod:`neuron_stack.device.collective_cost`), its NxDI rows (trn2)
    a current release (the collectives pages' Mesh, RDH, KangaRing).

    >>> neuron_release(ROWS[0]), neuron_release(ROWS[9])
    ('2.18', 'latest')
    """
    return "latest" if row[1] == "trn2" else "2.18"


def roofline_ms(model: str, target: str, tp: int, batch: int, tokens: int, ctx: int, layer_weight_bytes=2) -> float:
    """max(TensorE time at peak, HBM time at the core's bandwidth share) per rank for ``tokens`` new
    tokens per sequence over a context of ``ctx``: weights read once (decoder layers at
    ``layer_weight_bytes`` per parameter: 1 for int8, the LM head bf16), KV read for attention."""
    p = get_profile(target)
    c = rank_config(load_config(PRESET.get(model, model)), tp)
    d, L, hd = c.hidden_size, c.num_hidden_layers, c.head_dim
    hq, hkv = c.num_attention_heads, c.num_key_value_heads
    params = d * hd * (2 * hq + 2 * hkv) + 3 * d * c.intermediate_size
    flops = L * (2 * params * batch * tokens + 4 * batch * hq * hd * tokens * ctx) + 2 * d * c.vocab_size * batch
    kv_bytes = 2 * L * batch * hkv * hd * ctx * 2 if tokens == 1 else 0
    nbytes = layer_weight_bytes * L * params + 2 * d * c.vocab_size + kv_bytes
    # a logical core: LNC physical cores' Tensor Engines (trn2: 2), its share of the chip's HBM
    t = max(flops / (p.lnc * p.tensor_peak_flops("bfloat16")), nbytes / (p.hbm_bytes_per_ns_per_core * 1e9))
    return t * 1e3


def project_row(row, cache: dict | None = None) -> dict:
    """One §2.12 row: published and projected TTFT/TPOT (ms), their roofline bounds and why they differ."""
    model, target, tp, batch, n_in, n_out, ttft, tpot, note = row
    preset, nc, _, _ = row_settings(row)
    release = neuron_release(row)
    key = (preset, target, tp, batch, n_in, n_out, "int8" in note, release)
    cache = {} if cache is None else cache
    if key not in cache:
        # the rows AWS ran with int8 weights are projected with int8 weight-only quantization
        cache[key] = project_serving(preset, nc, n_in, n_out, quantization_dtype="int8" if "int8" in note else None,
                                     neuron_release=release)
    s = cache[key]
    wb = 1 if "int8" in note else 2
    out = {
        "model": model,
        "target": target,
        "tp": tp,
        "batch": batch,
        "in": n_in,
        "out": n_out,
        "note": note,
        "release": release,
        "ttft_pub": ttft,
        "tpot_pub": tpot,
        # the compared figure: request time (device time + launch, copies, logits to the host: llm/request.py)
        "ttft_proj": s["ttft_request_ms"],
        "tpot_proj": s["tpot_request_ms"],
        "ttft_dev": s["ttft_ms"],
        "tpot_dev": s["tpot_ms"],
        "ttft_ns": s["ttft_ns"],
        "tpot_ns": s["tpot_ns"],
        "ttft_roof": roofline_ms(model, target, tp, batch, n_in, n_in, wb),
        "tpot_roof": roofline_ms(model, target, tp, batch, 1, n_in + n_out // 2, wb),
        "compile_s": s["compile_s"],
    }
    out["tpot_modelled"] = modelled(row)
    out["ttft_cc_share"] = s["ttft_collective_ns"] / max(1, s["ttft_ns"])
    out["ttft_layer_dma_share"] = s["ttft_layer_dma_share"]
    out["ttft_layer_cc_share"] = s["ttft_layer_cc_share"]
    out["sequence_parallel"] = nc.sequence_parallel_enabled
    out["tpot_cc_share"] = s["tpot_collective_ns"] / max(1, s["tpot_ns"])
    out["why"] = _why(out)
    return out


def collectives(r: dict, tokens: int = 1) -> str:
    """The all-reduces of a row's hidden state for ``tokens`` tokens per sequence, as the projection costs
    them (algorithm, steps, time: :func:`neuron_stack.runtime.collectives.plan`, which the projection calls).

    >>> collectives({"model": "Llama-3-70B", "target": "trn1", "tp": 32, "batch": 1})
    '2 all-reduces per layer of 16 KiB over 32 ranks, each a 4-step Mesh of 6.2 us'
    >>> collectives({"model": "Llama-3-70B", "target": "trn1", "tp": 32, "batch": 1, "release": "2.18"})
    '2 all-reduces per layer of 16 KiB over 32 ranks, each a 62-step Ring of 93.1 us'
    """
    c = load_config(PRESET.get(r["model"], r["model"]))
    p = plan("all_reduce", r["batch"] * tokens * c.hidden_size, "bfloat16", Group.on_cores(range(r["tp"])),
             get_profile(r["target"]), r.get("release", "latest"))
    size = f"{p.input_size // 1024} KiB" if p.input_size < 1 << 20 else f"{p.input_size / 2**20:.0f} MiB"
    return (f"2 all-reduces per layer of {size} over {r['tp']} ranks, each a {p.steps}-step {p.algorithm} of "
            f"{p.dur_ns / 1e3:.1f} us")


#: a prompt this short or shorter: its context encoding is a few decode steps' work (the "short-prompt" rows)
SHORT_PROMPT = 128


def prefill_over_decode_us(r: dict) -> tuple[float, float]:
    """What one decoder layer of the row's context encoding costs beyond a decode step, published and projected
    (request time), in us: ``(TTFT - TPOT) / layers``. On a short prompt both calls stream the same weights,
    so this is the prompt's own work per layer (its tokens' matmuls, attention, the larger all-reduces) plus
    whatever else a prefill call pays per layer; it shows whether a miss grows with the layers.

    >>> r = {"model": "Llama-3-8B", "ttft_pub": 29.47, "tpot_pub": 7.41, "ttft_proj": 6.91, "tpot_proj": 4.39}
    >>> [round(x) for x in prefill_over_decode_us(r)]
    [689, 79]
    """
    layers = load_config(PRESET.get(r["model"], r["model"])).num_hidden_layers
    return tuple((r[f"ttft_{k}"] - r[f"tpot_{k}"]) * 1e3 / layers for k in ("pub", "proj"))


def short_prompt_line(rows: list[dict]) -> str:
    """One line over the modelled short-prompt rows: :func:`prefill_over_decode_us`, published / projected."""
    cells = [f"{r['model']} {r['target']} TP{r['tp']} B{r['batch']} {p:.0f} / {q:.0f}"
             for r in rows if r["in"] <= SHORT_PROMPT and r["tpot_modelled"]
             for p, q in [prefill_over_decode_us(r)]]
    return ("per layer, a prefill of <= " f"{SHORT_PROMPT} tokens beyond a decode step (us, published / projected): "
            + "; ".join(cells)) if cells else ""


def _why(r: dict) -> str:
    """What the projection leaves out or adds, for a value more than 1.5x off (the report's "why")."""
    why = []
    for key in ("ttft", "tpot"):
        ratio = r[f"{key}_proj"] / r[f"{key}_pub"]
        if key == "tpot" and not r["tpot_modelled"] or 1 / 1.5 <= ratio <= 1.5:
            continue
        if ratio < 1 and key == "ttft" and r["in"] <= SHORT_PROMPT:
            pub, proj = prefill_over_decode_us(r)
            why.append(
                f"TTFT under published: per layer the published prefill costs {pub:.0f} us more than a decode "
                f"step, the projection {proj:.0f} us; request time holds the launch, the copies over the host "
                f"link, the logits to the host and the collectives of the row's runtime release "
                f"({'Neuron 2.18: rings' if r.get('release') == '2.18' else 'the collectives pages'}) at the "
                f"documented 1-2 us a hop ({collectives(r, r['in'])}); a TTFT holds no decode step "
                f"(transformers-neuronx's sampling loop emits the first token before its first decode call) and "
                f"the {r['in']}-token prompt runs in "
                f"the {r['in']}-token bucket (context buckets half the token buckets, first fit): the rest has "
                "no public cost and is not modelled"
            )
            continue
        if ratio < 1:
            why.append(
                f"{key.upper()} under published: request time holds the launch, the copies over the host link and "
                "the logits to the host; the host's own sampling, input preparation and the framework's per-step "
                "Python (transformers-neuronx, vLLM) have no published cost and are not modelled"
            )
            continue
        if key == "ttft" and r["in"] >= 2048:
            dma = r["ttft_layer_dma_share"]
            spills = "" if r.get("sequence_parallel") else \
                "each residual add and cast passes through HBM as spills (an RMSNorm is one fused pass), and "
            rest = (
                f"the rest is DMA-bound (a DMA queue is busy {100 * dma:.0f}% of a layer): the [tokens, hidden] "
                f"activations do not fit SBUF, so {spills}the projections reload an operand (x once per column "
                "pass; a weight too large to stay in SBUF beside x^T, as a 405B rank's 27 MB gate, once per "
                "128-row block), where NxDI's CTE kernels fuse the norm into the QKV and MLP matmuls' token tiles"
                if dma >= 0.5 else "the rest is not attributed yet"
            )
            cc = (f"sequence parallel: per layer 2 all-gathers and 2 reduce-scatters of the hidden state in the "
                  f"graph, the cc engine busy {100 * r['ttft_layer_cc_share']:.0f}% of a layer"
                  if r.get("sequence_parallel") else
                  f"{100 * r['ttft_cc_share']:.0f}% is collectives ({collectives(r, r['in'])})")
            why.append(
                f"TTFT: the {r['in']}-token prefill's attention is causal flash attention (scores stay on chip, "
                f"key blocks above the diagonal skipped); {cc}; {rest}"
            )
        elif key == "ttft":
            why.append("TTFT: not attributed yet (the weight DMAs are no longer descriptor-bound: weights are "
                       "K-tiled, >= 4 KiB per partition per DMA)")
        else:
            c = rank_config(load_config(PRESET.get(r["model"], r["model"])), r["tp"])
            rep = c.num_attention_heads // c.num_key_value_heads
            kv = (f"the {rep} query heads of a KV head read its cache once, as rows of one matmul; " if rep > 1 else "")
            why.append(
                f"TPOT is {ratio:.1f}x published ({r['tpot_proj'] / r['tpot_roof']:.0f}x its roofline): "
                f"{100 * r['tpot_cc_share']:.0f}% is collectives ({collectives(r)}); the [batch, hidden] "
                "activations run on all 128 partitions (the lane layout: norms, residual adds and casts; x^T read "
                f"in place by the projections), so what remains is attention over the KV cache: {kv}q @ K^T "
                "loads K in natural 128-row tiles (one DMA each) and transposes them on the Tensor Engine, and the "
                "softmax over the scores runs on batch x heads partitions, its steps through HBM"
            )
        if r["target"] == "trn2":
            why.append(
                "trn2 LNC=2 is scheduled on both physical cores' engines and 32 DMA queues over one SBUF of "
                "both cores' size (the real compiler shards over the two SBUFs; cross-core exchange is not "
                "costed)"
            )
    return "; ".join(dict.fromkeys(why))


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties).

    Example: ``spearman([1, 2, 3], [2, 4, 9]) == 1.0``.
    """

    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(v):
            j = i
            while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    rx, ry = ranks(x), ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    sy = math.sqrt(sum((b - my) ** 2 for b in ry))
    return cov / (sx * sy) if sx and sy else float("nan")


def modelled(row) -> bool:
    """Whether a §2.12 row's figures are modelled values (not a fused-speculation row: see :func:`summary`).

    >>> sum(map(modelled, ROWS)) * 2
    22
    """
    return "speculation" not in row[8]


def summary(rows: list[dict]) -> dict:
    """Geometric-mean ratio (projected / published: the bias), geometric-mean error (exp of the mean
    |log ratio|: how far off a value typically is, either way), Spearman and within-2x count over the modelled
    values: TTFT and TPOT of every row but the fused-speculation ones (22 of §2.12's 26 figures). NxDI's fused
    speculation compiles the draft model into the target's graphs, so its context encoding runs both models'
    prefill and its token generation checks draft tokens; the projection runs the target alone, so neither of
    those rows' figures is a modelled value (the table still shows their ratios)."""
    pub, proj = [], []
    for r in rows:
        if r["tpot_modelled"]:
            pub += [r["ttft_pub"], r["tpot_pub"]]
            proj += [r["ttft_proj"], r["tpot_proj"]]
    ratios = [b / a for a, b in zip(pub, proj)]
    return {
        "values": len(ratios),
        "geomean_ratio": math.exp(sum(map(math.log, ratios)) / len(ratios)),
        # the bias above lets rows under published offset rows over it; this is the typical miss either way
        "geomean_error": math.exp(sum(abs(math.log(r)) for r in ratios) / len(ratios)),
        "spearman": spearman(pub, proj),
        "within_2x": sum(0.5 <= r <= 2 for r in ratios),
    }


def llama_report(rows_to_run=None, log=print) -> tuple[list[dict], dict]:
    """Project every row (rows with the same settings are projected once) and summarise."""
    cache: dict = {}
    rows = []
    for r in rows_to_run or ROWS:
        rows.append(project_row(r, cache))
        x = rows[-1]
        log(f"   projected {r[0]} {r[1]} TP{r[2]} B{r[3]} {r[4]}/{r[5]} in {x['compile_s']:.0f} s: TTFT "
            f"{x['ttft_proj']:.2f} ms ({x['ttft_proj'] / x['ttft_pub']:.2f}x), TPOT {x['tpot_proj']:.2f} ms "
            f"({x['tpot_proj'] / x['tpot_pub']:.2f}x)")
    return rows, summary(rows)


def print_llama(rows: list[dict], s: dict) -> None:
    print(
        "\n== Published Llama figures (reference §2.12) vs projection: ms, ratio = projected / published =="
    )
    print(
        "   source: aws-neuron-sdk about-neuron/benchmarks/{inf2,trn1}/latency_data_decoder.csv "
        "(TNx 2.18, BF16 "
        "matmuls), nxd-inference tutorials llama70b/405b_perf_comparison.csv (NxDI, vLLM, P50)"
    )
    print(
        f"{'model':>15} {'target':>6} {'TP':>3} {'B':>2} {'in/out':>11} | "
        f"{'TTFT pub':>9} {'request':>8} {'ratio':>6} {'device':>8} "
        f"{'roof':>7} | {'TPOT pub':>9} {'request':>7} {'ratio':>6} {'device':>7} {'roof':>6} | note"
    )
    for r in rows:
        tp_ratio = f"{r['tpot_proj'] / r['tpot_pub']:6.2f}" if r["tpot_modelled"] else "     -"
        print(
            f"{r['model']:>15} {r['target']:>6} {r['tp']:>3} {r['batch']:>2} {r['in']:>5}/{r['out']:<5} | "
            f"{r['ttft_pub']:9.2f} {r['ttft_proj']:8.2f} {r['ttft_proj'] / r['ttft_pub']:6.2f} {r['ttft_dev']:8.2f} "
            f"{r['ttft_roof']:7.2f} | "
            f"{r['tpot_pub']:9.2f} {r['tpot_proj']:7.2f} {tp_ratio} {r['tpot_dev']:7.2f} {r['tpot_roof']:6.2f} | "
            f"{r['note']}"
        )
    for r in rows:
        if r["why"]:
            print(f"   why {r['model']} {r['target']} B{r['batch']} {r['in']}/{r['out']}: {r['why']}")
    print(
        f"   {s['values']} modelled values: geometric-mean ratio {s['geomean_ratio']:.2f} (bias), geometric-mean "
        f"error {s['geomean_error']:.2f} (either way), Spearman "
        f"{s['spearman']:.2f}, within 2x: {s['within_2x']}/{s['values']}"
    )
    if short_prompt_line(rows):
        print(f"   {short_prompt_line(rows)}")
    print(
        "   roof = max(FLOPs at TensorE bf16 peak, weights (int8 rows: int8 layers) + KV at the core's HBM share): "
        "a floor no real "
        "run beats; collectives excluded"
    )


#: the block of a docs page that :func:`write_docs` owns
DOCS_BEGIN = "<!-- begin: written by bench/fidelity.py --published --docs; do not edit by hand -->"
DOCS_END = "<!-- end: written by bench/fidelity.py --published --docs -->"


def markdown(rows: list[dict], s: dict, load: float) -> str:
    """The report's rows and summary as a markdown table (what ``--docs`` writes into a page)."""
    out = [
        f"Projected request time / published (P50), device time beside it; measured at load average {load:.1f}.",
        "",
        "| model | target | TP | B | in/out | TTFT pub | request | ratio | device | roof | TPOT pub | request | ratio "
        "| device | roof | why |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        tp_ratio = f"{r['tpot_proj'] / r['tpot_pub']:.2f}" if r["tpot_modelled"] else "not modelled"
        out.append(
            f"| {r['model']} | {r['target']} | {r['tp']} | {r['batch']} | {r['in']}/{r['out']} | "
            f"{r['ttft_pub']:.2f} | {r['ttft_proj']:.2f} | {r['ttft_proj'] / r['ttft_pub']:.2f} | "
            f"{r['ttft_dev']:.2f} | "
            f"{r['ttft_roof']:.2f} | {r['tpot_pub']:.2f} | {r['tpot_proj']:.2f} | {tp_ratio} | {r['tpot_dev']:.2f} | "
            f"{r['tpot_roof']:.2f} | {'; '.join(x for x in (r['note'], _why(r)) if x)} |"
        )
    out += [
        "",
        f"{s['values']} modelled values: geometric-mean ratio {s['geomean_ratio']:.2f} (bias), geometric-mean "
        f"error {s['geomean_error']:.2f} (either way), Spearman "
        f"{s['spearman']:.2f}, within 2x: {s['within_2x']}/{s['values']}.",
    ]
    if short_prompt_line(rows):
        out += ["", short_prompt_line(rows)[0].upper() + short_prompt_line(rows)[1:] + "."]
    return "\n".join(out)


def write_docs(path: str, text: str, begin: str = DOCS_BEGIN, end: str = DOCS_END) -> None:
    """Replace the block between ``begin`` and ``end`` (DOCS_BEGIN and DOCS_END) of ``path`` with ``text``."""
    with open(path) as f:
        page = f.read()
    head, sep, rest = page.partition(begin)
    _, sep2, tail = rest.partition(end)
    if not sep or not sep2:
        raise SystemExit(f"{path} has no {begin!r} ... {end!r} block to write the table into")
    with open(path, "w") as f:
        f.write(f"{head}{begin}\n{text}\n{end}{tail}")


# ----------------------------------------------------------------------------------------------
# The NKI guide's curves

IN_FLIGHT = 16  # SBUF slots the loads rotate through: one transfer in flight per DMA queue

#: DMA guide statements, as (bytes per partition, what it says, the bound that statement means)
DMA_CLAIMS = [
    (128, "below 256 B: severely overhead-bound", ("<", 0.5)),
    (256, "256 B: still overhead-bound", ("<", 0.7)),
    (2048, "2 KiB or more: approaches peak", (">=", 0.8)),
    (4096, "4 KiB or more: saturates", (">=", 0.9)),
    (8192, "4 KiB or more: saturates", (">=", 0.9)),
]


def scheduled_dma_efficiency(target: str, nbytes: int, transfers: int = 64) -> float:
    """Achieved / peak bandwidth of ``transfers`` HBM->SBUF loads of [128 partitions x nbytes], lowered
    and scheduled over the core's queues into IN_FLIGHT rotating slots (the guide's 16 x 8 shape).
    The guide's figures are one NeuronCore's: LNC=1."""
    p = get_profile(target, lnc=1)
    low = Lowerer(Program("dma", [], [], []), 0, p, {})
    F = max(1, nbytes // 4)
    pool = Pool(low, "t", "sbuf", 128, F, "float32", bufs=IN_FLIGHT)
    for k in range(transfers):
        low.dma(
            "load",
            pool.tile().op(),
            {"m": "hbm", "b": "x", "dt": "float32", "o": k * 128 * F, "ap": [[F, 128], [1, F]]},
        )
    s = schedule_lowered(Lowered(low.instrs, low.hbm, [], [], {}, 0), p)
    return transfers * 128 * F * 4 / (s.device_ns * p.dma_bytes_per_ns)


def matmul_curve(target: str) -> list[tuple[int, float, float]]:
    """(moving N, guide efficiency N / max(N, 64), scheduled steady-state efficiency) of back-to-back
    MATMULs with a 128 x 128 stationary (arch guide: II = max(N_moving, MM_INIT_LATENCY=64) cycles).
    Steady state: the marginal rate between 256 and 512 instructions, past trn2's throttle ramp
    (TensorE starts at 50% and ramps to 100% over ~3 us: overview-summary-page.rst). One NeuronCore: LNC=1."""
    p = get_profile(target, lnc=1)

    def span(n: int, count: int) -> int:
        low = Lowerer(Program("mm", [], [], []), 0, p, {})
        stat = Pool(low, "s", "sbuf", 128, 128, "bfloat16", bufs=1).tile()
        mov = Pool(low, "m", "sbuf", 128, n, "bfloat16", bufs=1).tile()
        acc = Pool(low, "a", "psum", 128, n, "float32", bufs=1).tile()
        for k in range(count):
            low.emit(
                "MATMUL",
                "mm",
                [acc.op()],
                [stat.op(), mov.op()],
                {"start": k == 0, "stop": k == count - 1},
                dur=matmul_ns(p, n, 128, "bfloat16"),
                flops=2 * 128 * 128 * n,
                small=False,
            )
        return schedule_lowered(Lowered(low.instrs, low.hbm, [], [], {}, 0), p).device_ns

    out = []
    for n in (16, 32, 64, 128, 256, 512):
        dt = span(n, 512) - span(n, 256)
        out.append(
            (
                n,
                n / max(n, p.mm_init_latency_cycles),
                256 * 2 * 128 * 128 * n / (dt * 1e-9) / p.tensor_peak_flops("bfloat16"),
            )
        )
    return out


def print_nki(targets: list[str]) -> int:
    """Print the guide's curves against the schedule; returns how many statements disagree."""
    print("\n== NKI guide: Tensor Engine initiation interval (nki arch guide, old nc_matmul docstring) ==")
    print("   steady-state efficiency of back-to-back MATMULs, stationary 128x128, vs moving free size N")
    bad = 0
    for t in targets:
        for n, guide, got in matmul_curve(t):
            ok = abs(got - guide) <= 0.02 * guide
            bad += not ok
            print(
                f"   {t:>5} N={n:>4}: guide {guide:5.2f}  scheduled {got:5.2f}  "
                f"{'agrees' if ok else 'DISAGREES'}"
            )
    print("\n== NKI DMA guide (nki-dma-bandwidth-guide.rst) vs scheduled loads (16 queues, 16 in flight) ==")
    for t in targets:
        for nbytes, claim, (op, bound) in DMA_CLAIMS:
            e = scheduled_dma_efficiency(t, nbytes)
            ok = e < bound if op == "<" else e >= bound
            bad += not ok
            print(
                f"   {t:>5} {nbytes:>5} B/partition: {e:5.2f} of peak; guide: {claim} ({op} {bound}) "
                f"{'agrees' if ok else 'DISAGREES'}"
            )
    print("\n== Encoder figures: the references publish none (the held-out encoder table is not in them) ==")
    return bad
