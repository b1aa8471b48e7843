"""One projection, trusted (issue 24): ``neuron-llm project``, ``inference_demo run`` (projection mode),
``NeuronModelForCausalLM`` and the calibration bench read the same device times for the same settings,
to the nanosecond; context encoding costs its context bucket, not the cache; the KV-cache update writes
only the new rows; decode latency never falls as the cache, the batch or the prompt grows; a layer's
per-engine time never exceeds the layer's latency."""

import json
from pathlib import Path

import pytest
import transformers as T

ROOT = Path(__file__).resolve().parents[1]


def tiny_config(layers=2, hidden=64):
    return T.LlamaConfig(
        vocab_size=512,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
    )


@pytest.fixture(scope="module")
def cfgdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-llama")
    tiny_config().save_pretrained(d)
    return d


def test_cli_demo_optimum_and_bench_agree_to_the_nanosecond(cfgdir, tmp_path, capsys, monkeypatch):
    from neuron_stack.inference import demo
    from neuron_stack.inference.config import NeuronConfig
    from neuron_stack.inference.projection import project_serving
    from neuron_stack.llm import NeuronModelForCausalLM, cli

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import published

    # 16 tokens in, 48 out: a 64-token cache, token-generation buckets 32 and 64
    assert cli.main(["project", str(cfgdir), "--tp", "2", "--instance", "trn1.32xlarge", "--sequence-length",
                     "64", "--context-length", "16", "--tkg-buckets", "32", "64", "--json"]) == 0
    cli_graphs = json.loads(capsys.readouterr().out)["graphs"]
    graphs = {(g["name"], g["bucket"]): g["device_ns"] for g in cli_graphs}
    requests = {(g["name"], g["bucket"]): g["request_ns"] for g in cli_graphs}
    # what bounds a layer, as the report prints it (GraphProjection.bound_by), in the JSON too
    assert all(g["bound_by"].startswith("HBM-bound") == g["hbm_bound"] and g["layer_dma_queue_ns"] > 0
               for g in cli_graphs), cli_graphs
    cte = graphs[("context_encoding", 16)]
    steps = [32 if pos + 1 <= 32 else 64 for pos in range(16, 63)]
    tpot = sum(graphs[("token_generation", b)] for b in steps) / len(steps)
    tpot_request = sum(requests[("token_generation", b)] for b in steps) / len(steps)

    nc = NeuronConfig(tp_degree=2, seq_len=64, max_context_length=16, context_encoding_buckets=[16],
                      token_generation_buckets=[32, 64], torch_dtype="bfloat16", instance_type="trn1.32xlarge")
    serving = project_serving(str(cfgdir), nc, 16, 48)
    assert serving["ttft_ns"] == cte and serving["tpot_ns"] == tpot
    # request time: the same graphs plus their launch and copies, as the CLI's JSON gives them
    assert serving["ttft_request_ns"] == requests[("context_encoding", 16)] > cte
    assert serving["tpot_request_ns"] == tpot_request > tpot

    monkeypatch.setattr(published, "generate_buckets", lambda lo, hi: [32, 64])  # NxDI's from 128 up
    row = published.project_row((str(cfgdir), "trn1", 2, 1, 16, 48, 1.0, 1.0, ""))
    # a trn1 row ran transformers-neuronx on Neuron 2.18: projected with that runtime's collectives (rings),
    # the same graphs otherwise
    old = project_serving(str(cfgdir), nc, 16, 48, neuron_release="2.18")
    assert row["release"] == "2.18" and row["ttft_ns"] == old["ttft_ns"] and row["tpot_ns"] == old["tpot_ns"]
    assert old["ttft_ns"] - cte == old["ttft_collective_ns"] - serving["ttft_collective_ns"] > 0
    # the bench compares request time with the published figure, device time beside it
    assert row["ttft_proj"] == old["ttft_request_ms"] and row["tpot_proj"] == old["tpot_request_ms"]

    report = tmp_path / "benchmark_report.json"
    assert demo.main(["run", "--model-path", str(cfgdir), "--tp-degree", "2", "--seq-len", "64",
                      "--max-context-length", "16", "--context-encoding-buckets", "16",
                      "--token-generation-buckets", "32", "64", "--torch-dtype", "bfloat16",
                      "--instance-type", "trn1.32xlarge", "--benchmark", "--benchmark-report-path",
                      str(report)]) == 0
    bench = json.loads(report.read_text())
    assert bench["context_encoding_model"]["latency_ms_p50"] == cte / 1e6
    assert bench["token_generation_model"]["latency_ms_p50"] == tpot / 1e6

    m = NeuronModelForCausalLM.from_pretrained(tiny_config(), sequence_length=64, num_cores=2,
                                               instance_type="trn1.32xlarge")
    tkg = next(g for g in m.projection.graphs if g.name == "token_generation")
    assert tkg.bucket == 64 and tkg.device_ns == graphs[("token_generation", 64)]


def test_context_encoding_attends_over_its_bucket_not_the_cache():
    from neuron_stack.llm import project

    short, long = (project(tiny_config(), sequence_length=s, context_length=16) for s in (64, 1024))
    cte = [next(g for g in p.graphs if g.name == "context_encoding") for p in (short, long)]
    assert cte[0].bucket == cte[1].bucket == 16
    assert cte[0].device_ns == cte[1].device_ns
    # the cache still holds the whole sequence
    assert long.memory["kv_cache"] == 16 * short.memory["kv_cache"]


def test_kv_cache_update_writes_only_the_new_rows():
    from neuron_stack.frontend.flags import parse_flags
    from neuron_stack.llm.project import _compile_graph

    writes = []
    for bucket in (64, 1024):
        neff = _compile_graph(tiny_config(), 1, 1, 1, bucket, "bfloat16", parse_flags(None))
        t = next(iter(neff.schedules.values())).table.to_pydict()
        writes.append(sorted(w for op, node, w in zip(t["opcode"], t["node"], t["hbm_write_bytes"])
                             if op == "CUSTOM_OP" and node.startswith("index_put")))
    # one token's K and V row per KV head: 2 heads x 16 head dim x bf16, whatever the cache length
    assert writes[0] == writes[1] == [2 * 16 * 2] * 2


def _monotone(config, graphs):
    """Along ``graphs`` ((projection, graph) pairs of growing work): the graph's latency and per-layer
    latency never fall; the latency grows no faster than the FLOPs or the HBM bytes of its two-layer graph do;
    the layer extrapolation t1 + (L - 1) * (t2 - t1) has no negative term before project() bounds it."""
    import importlib

    from neuron_stack.frontend.flags import parse_flags

    P = importlib.import_module("neuron_stack.llm.graphs")
    flags = parse_flags(None, target="trn1")
    prev = None
    for p, g in graphs:
        # the figures project() read (cached, nothing compiled again)
        one, two = (P._figures(P.rank_config(config, 1), n, p.batch_size, g.active_tokens, g.bucket, p.dtype,
                               flags, None) for n in (1, 2))
        assert one.device_ns <= two.device_ns <= 2 * one.device_ns, (g.name, g.bucket, one, two)
        cur = (g.device_ns, g.layer_ns, two.flops, two.hbm_bytes)
        if prev:
            assert cur[0] >= prev[0] and cur[1] >= prev[1], (g.name, g.bucket, prev, cur)
            # within a tile or so on the critical path (test_cost_scaling.SLACK): batch 2 -> 4 costs 2.07x today
            assert cur[0] / prev[0] <= 1.1 * max(cur[2] / prev[2], cur[3] / prev[3]), (g.name, g.bucket, prev, cur)
        prev = cur


def test_decode_never_gets_faster_as_the_cache_grows_and_no_term_is_negative():
    from neuron_stack.llm import project

    config = tiny_config(layers=32)  # the extrapolation to 32 layers magnifies any per-layer cliff
    p = project(config, sequence_length=512, context_length=16, token_generation_buckets=[32, 128, 512])
    _monotone(config, [(p, g) for g in p.graphs if g.name == "token_generation"])
    for g in p.graphs:
        # an engine's layer time within the layer's
        assert g.base_ns >= 0 and g.layer_ns >= 0
        assert all(0 <= v <= g.layer_ns for v in g.layer_busy_ns.values()), g.layer_busy_ns


def test_prefill_never_gets_faster_as_the_prompt_or_batch_grows():
    from neuron_stack.llm import project

    config = tiny_config(layers=32)
    # a 64-token prompt used to cost more than a 128-token one, batch 2 more than batch 4: the NCHW row
    # layout of [b, h, 64, 64] scores (4 partitions) against softmax's 128-row tiles, and a heap too
    # small for the one-layer graph's values (resident.py, residency.py); then 64 more than 128 again: no flash
    # attention below one full query block, and two heads of a head-major [heads, tokens, d] value packed in
    # one 128-row block, so the rotary embedding moved rows across partitions by DMA (issue 38)
    prompts = [project(config, sequence_length=128, context_length=c) for c in (16, 32, 64, 128)]
    batches = [project(config, batch_size=b, sequence_length=64, context_length=16) for b in (1, 2, 4)]
    _monotone(config, [(p, p.graphs[0]) for p in prompts])
    _monotone(config, [(p, p.graphs[0]) for p in batches])


def test_decode_never_gets_faster_as_the_batch_grows():
    from neuron_stack.llm import project

    config = tiny_config(layers=32)
    batches = [project(config, batch_size=b, sequence_length=64, context_length=16) for b in (1, 2, 4)]
    _monotone(config, [(p, p.graphs[1]) for p in batches])


def test_int8_weights_match_the_fake_quantised_eager_model_and_halve_the_bytes():
    import torch

    import neuron_stack
    from neuron_stack.llm import project
    from neuron_stack.llm.quantize import quantize_decoder

    torch.manual_seed(0)
    model = T.LlamaForCausalLM(tiny_config(layers=1)).eval()
    fake = quantize_decoder(model, "int8")  # per-channel symmetric int8, dequantised in the forward
    assert isinstance(fake.model.layers[0].mlp.up_proj.weight, torch.Tensor)
    assert fake.model.layers[0].mlp.up_proj.weight.dtype == torch.int8
    ids = torch.randint(0, 512, (1, 8))
    ref = fake(input_ids=ids).logits
    got = neuron_stack.trace(lambda input_ids: fake(input_ids=input_ids).logits, (ids,))(ids)
    assert (got - ref).norm() / ref.norm() < 1e-4

    bf16, int8 = (project(tiny_config(), sequence_length=64, context_length=16, quantization_dtype=q)
                  for q in (None, "int8"))
    layer_params = sum(p.numel() for p in T.LlamaForCausalLM(tiny_config(layers=1)).model.layers.parameters()
                       if p.dim() == 2)
    scales = 64 + 32 + 32 + 64 + 128 + 128 + 64  # one per output channel: q k v o gate up down
    # two layers' matmul weights go from 2 bytes to 1, plus a bf16 scale per output channel
    assert bf16.memory["weights"] - int8.memory["weights"] == 2 * (layer_params - 2 * scales)
    assert "int8 decoder weights" in int8.report()
    for a, b in zip(bf16.graphs, int8.graphs):
        assert (a.name, a.bucket) == (b.name, b.bucket)
    with pytest.raises(Exception, match="fp8 weights need a trn2"):
        project(tiny_config(), sequence_length=64, quantization_dtype="fp8")


def test_int8_decode_scale_runs_across_the_lanes_after_bf16s_evacuation_and_matches_eager():
    """A decode step's quantized linear (``[1, hidden]`` out: channels along one PSUM row) evacuates PSUM as
    bf16 does (a ScalarE copy) and multiplies by its per-channel scale once the output is in the lane layout
    (``hidden / 128`` elements on each of the 128 partitions), not as a one-partition pass over ``hidden``
    elements; the numbers equal eager PyTorch."""
    import json

    import numpy as np
    import torch

    from neuron_stack.compiler.fuse import fuse
    from neuron_stack.compiler.legalize import legalize
    from neuron_stack.compiler.partition import partition
    from neuron_stack.compiler.schedule import build_schedules
    from neuron_stack.frontend.export import capture
    from neuron_stack.isa.interp import run_program
    from neuron_stack.llm.quantize import QuantizedLinear

    class Down(torch.nn.Module):     # the MLP's down projection and the residual add after it
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.lin = QuantizedLinear.from_linear(torch.nn.Linear(512, 2048, bias=False), "int8")

        def forward(self, x, res):
            return res + self.lin(x)

    model = Down().eval()
    x, res = torch.randn(1, 512), torch.randn(1, 2048)
    prog = fuse(partition(legalize(capture(model, (x, res)))))
    sched = build_schedules(prog, {"auto_cast": "none"})
    got = np.asarray(run_program(prog, dict(zip(prog.input_names, (x.numpy(), res.numpy()))), sched)[0],
                     dtype=np.float32)
    ref = model(x, res).detach().numpy()
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-5
    t = sched[0].table
    mul = [n.name for n in prog.nodes if n.target == "aten.mul.Tensor"]
    rows = [(e, json.loads(o)) for e, node, o in zip(t.column("engine").to_pylist(), t.column("node").to_pylist(),
                                                     t.column("operands").to_pylist()) if node in mul]
    muls = [o for e, o in rows if e == "vector" and o.get("op") == "multiply"]
    assert muls and all(o["dst"][0]["ap"][0][1] == 128 and o["src"][0]["m"] == "sbuf" for o in muls)


def test_decode_buckets_share_one_capture_and_project_as_if_each_were_captured(monkeypatch):
    import importlib

    from neuron_stack.llm import project

    P = importlib.import_module("neuron_stack.llm.graphs")
    for cache in (P._FIGURES, P._GRAPHS, P._TEMPLATES):
        cache.clear()
    captured, real = [], P._capture
    monkeypatch.setattr(P, "_capture", lambda *a: captured.append((a[1], a[4])) or real(*a))
    cfg = tiny_config()
    p = project(cfg, sequence_length=144, context_length=16, token_generation_buckets=[48, 80, 112, 144])
    # context encoding and the smallest and largest decode buckets, with one and two layers: no more
    assert sorted(captured) == [(1, 16), (1, 48), (1, 144), (2, 16), (2, 48), (2, 144)]
    # the one-layer family's captured smallest (the template's), against a capture of its own at 80
    small = next(t[0] for k, t in P._TEMPLATES.items() if k[1] == 1)
    mid = real(cfg, 1, 1, 1, 80, "bfloat16", None)
    assert P._same(P.rebucket(small, 48, 80), mid) and not P._same(small, mid)

    def forget_decode_figures():  # the decode graphs are compiled again; the context encoding's stay
        for key in [k for k in P._FIGURES if k[3] == 1]:   # _graph_key: (config, layers, batch, tokens, ...)
            del P._FIGURES[key]

    # 32 is also the K/V projection's width: substituting it would change that too, so the lengths between
    # are derived from the largest (144 is no other dimension), which substitutes back to the smallest exactly
    captured.clear()
    forget_decode_figures()
    q = project(cfg, sequence_length=144, context_length=16, token_generation_buckets=[32, 80, 144])
    assert sorted(captured) == [(1, 32), (1, 144), (2, 32), (2, 144)]
    # and where both ends are other dimensions too (32 the K/V width, 64 the hidden size), each is captured
    captured.clear()
    forget_decode_figures()
    project(cfg, sequence_length=64, context_length=16, token_generation_buckets=[32, 48, 64])
    assert sorted(captured) == [(1, 32), (1, 48), (1, 64), (2, 32), (2, 48), (2, 64)]
    # a derived bucket projects exactly as its own capture
    forget_decode_figures()
    P._TEMPLATES.clear()
    alone = project(cfg, sequence_length=144, context_length=16, token_generation_buckets=[80])
    for proj in (p, q):
        assert next(g for g in proj.graphs if g.bucket == 80).to_json() | {"compile_s": 0} == \
            next(g for g in alone.graphs if g.bucket == 80).to_json() | {"compile_s": 0}


def test_projection_keeps_figures_not_neffs_and_compiles_them_when_asked():
    import importlib

    from neuron_stack.frontend.flags import parse_flags
    from neuron_stack.llm import project

    P = importlib.import_module("neuron_stack.llm.graphs")
    for cache in (P._FIGURES, P._GRAPHS):
        cache.clear()
    p = project(tiny_config(layers=4), sequence_length=64, context_length=16)
    assert not P._GRAPHS  # no NEFF (a full-size prefill one takes gigabytes) outlives the projection
    g = p.graphs[1]
    one, two = g.neffs  # compiled now, complete: record tables, operands, meta weights (numbers=none)
    assert all(s.records and s.table.column("operands")[0].as_py() for n in (one, two) for s in n.schedules.values())
    assert all(t.is_meta for t in two.program.constants.values()) and two.program.stats["numbers"] == "none"
    t1, t2 = (sum(s.device_ns for s in n.schedules.values()) for n in (one, two))
    # one more layer: the period between the two layers' ends in the two-layer graph
    ends = P._layer_ends_ns(two)
    assert len(ends) == 2 and (g.base_ns + g.layer_ns, g.layer_ns) == (t1, ends[1] - ends[0]) and t1 < t2
    # the timings-only compile the projection ran schedules every instruction the same
    lean = P.compile_program(P._capture(tiny_config(layers=4), 2, 1, 1, 64, "bfloat16", None), parse_flags(None),
                             detail=False)
    for full, s in zip(two.schedules.values(), lean.schedules.values()):
        assert not s.records and s.device_ns == full.device_ns
        cols = ["engine", "queue", "opcode", "rel_start_ns", "dur_ns"]
        assert s.table.select(cols).equals(full.table.select(cols))


def test_bench_projects_what_serving_the_published_rows_projects(monkeypatch):
    import neuron_stack.llm
    from neuron_stack.inference.projection import project_serving

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import llm as bench_llm
    import published

    class Asked(Exception):
        pass

    def asked(model, **kw):
        raise Asked(model, kw)

    monkeypatch.setattr(neuron_stack.llm, "project", asked)
    for model, target, tp, n_in, n_out, _budget in bench_llm.CASES:
        row = next(r for r in published.ROWS if r[:3] == (model, target, tp) and r[4:6] == (n_in, n_out))
        preset, nc, _, _ = published.row_settings(row)
        with pytest.raises(Asked) as e:
            project_serving(preset, nc, n_in, n_out, quantization_dtype="int8" if "int8" in row[8] else None)
        kw = e.value.args[1]
        cmd = bench_llm.command(model, target, tp, n_in, n_out)
        value = lambda flag: cmd[cmd.index(flag) + 1]  # noqa: E731
        assert cmd[4] == preset and value("--instance") == kw["instance_type"] and int(value("--tp")) == tp
        assert int(value("--sequence-length")) == kw["sequence_length"]
        assert int(value("--context-length")) == kw["context_length"]
        buckets = cmd[cmd.index("--tkg-buckets") + 1:cmd.index("--json")]
        assert [int(b) for b in buckets] == kw["token_generation_buckets"]
        assert ("--quantization-dtype" in cmd) == (kw["quantization_dtype"] == "int8")
        assert ("--sequence-parallel-enabled" in cmd) == kw["sequence_parallel"] == (target == "trn2")
