"""Lowering obeys the NeuronCore tiling rules and spills when a working set exceeds SBUF."""
import json

import torch

from neuron_stack.compiler.fuse import fuse
from neuron_stack.compiler.legalize import legalize
from neuron_stack.compiler.lower.tiles import boxes
from neuron_stack.compiler.partition import partition
from neuron_stack.compiler.schedule import build_schedule
from neuron_stack.device.profiles import get_profile
from neuron_stack.frontend.export import capture


def compile_(fn, *args, target="trn1", **flags):
    prog = fuse(partition(legalize(capture(fn, args))))  # capture wraps a plain function
    return prog, build_schedule(prog, 0, get_profile(target), flags)


def _operands(s):
    return [(op, json.loads(o)) for op, o in zip(s.table["opcode"].to_pylist(), s.table["operands"].to_pylist())]


def test_boxes_cover_the_index_space_within_limit():
    for shape, lim in [((300,), 128), ((2, 100), 128), ((4, 12, 130, 64), 128), ((7, 3000), 2048)]:
        bs = boxes(shape, lim)
        total = 0
        for b in bs:
            n = 1
            for _, ln in b:
                n *= ln
            assert n <= lim or len(shape) == 0
            total += n
        n_all = 1
        for d in shape:
            n_all *= d
        assert total == n_all


def test_matmul_tiles_respect_pe_array_and_psum_bank():
    _, s = compile_(lambda a, b: torch.relu(a @ b), torch.randn(300, 700), torch.randn(700, 1100),
                    auto_cast="matmult")
    prof = get_profile("trn1")
    n_mm = 0
    types = s.table["instruction_type"].to_pylist()
    for (op, o), typ in zip(_operands(s), types):
        for x in o["dst"] + o["src"]:
            if x["m"] in ("sbuf", "psum"):
                assert x["ap"][0][1] <= 128, (op, x)            # partitions
                free = 1
                for _, n in x["ap"][1:]:
                    free *= n
                if x["m"] == "psum":
                    assert free * 4 <= prof.psum_bytes_per_partition
        if op == "MATMUL":
            stat, mov = o["src"]
            assert stat["ap"][0][1] == mov["ap"][0][1] <= 128   # contraction on partitions
            assert stat["ap"][1][1] <= 128                      # stationary free <= 128
            assert mov["ap"][1][1] <= 512                       # moving free <= 512
            dst = o["dst"][0]
            assert dst["m"] == "psum" and dst["ap"][1][1] * 4 <= 2048   # one PSUM bank
            if typ == "REGULAR":
                assert mov["dt"] == stat["dt"] == "bfloat16"    # --auto-cast matmult
            n_mm += 1
    # 300x700x1100: ceil(300/128)=3 x ceil(700/128)=6 x ceil(1100/512)=3 regular matmuls
    regular = [t for op, t in zip(s.table["opcode"].to_pylist(), s.table["instruction_type"].to_pylist())
               if op == "MATMUL" and t == "REGULAR"]
    assert len(regular) == 3 * 6 * 3
    assert s.tensor_flops == 2 * 300 * 700 * 1100


def test_bn_stats_free_size_limit():
    _, s = compile_(lambda x: torch.nn.functional.layer_norm(x, (1500,)), torch.randn(4, 1500))
    for op, o in _operands(s):
        if op == "BN_STATS":
            assert o["src"][0]["ap"][-1][1] <= 512


def test_spill_when_row_exceeds_sbuf():
    # softmax over a 60k-element fp32 row: the exponentials do not fit beside the row in SBUF
    _, big = compile_(lambda x: torch.softmax(x, -1), torch.randn(2, 60_000))
    assert big.spill_save_bytes == 2 * 60_000 * 4 and big.spill_reload_bytes == big.spill_save_bytes
    queues = {q for q, b in zip(big.table["queue"].to_pylist(), big.table["spill_save_bytes"].to_pylist()) if b}
    assert queues and all(q.startswith("qSyncSpillReload") for q in queues)
    _, small = compile_(lambda x: torch.softmax(x, -1), torch.randn(2, 6_000))
    assert small.spill_save_bytes == 0 and small.spill_reload_bytes == 0


def test_sbuf_peak_within_capacity():
    _, s = compile_(lambda a, b: a @ b, torch.randn(512, 2048), torch.randn(2048, 2048))
    assert 0 < s.sbuf_peak_bytes <= get_profile("trn1").sbuf_bytes_per_partition


def test_fused_activation_is_an_epilogue_not_a_reload():
    prog, s = compile_(lambda a, b: torch.nn.functional.gelu(a @ b), torch.randn(128, 256), torch.randn(256, 512))
    gelu = [n for n in prog.nodes if n.target.startswith("aten.gelu")][0]
    assert gelu.fused_into
    rows = [(op, nd) for op, nd in zip(s.table["opcode"].to_pylist(), s.table["node"].to_pylist()) if nd == gelu.name]
    assert rows and {op for op, _ in rows} <= {"ACTIVATE", "DMA_DIRECT2D"}
    # the matmul result is not stored and reloaded: only gelu's output is written to HBM
    assert s.hbm_write_bytes == 128 * 512 * 4
