"""Batch and sequence scaling of the projected device time is physical: over a grid of batch 1..16 and
sequence 32..512 on the sample encoder, latency never falls when the work grows and never grows by more
than the FLOP or HBM-byte ratio explains (issue 18: BERT-base used to jump 14x from batch 1 to 2, a
transposing copy costed one DMA descriptor per element); BERT-base width grows sub-linearly in batch
(weights are read once per inference, whatever the batch)."""

import sys
from pathlib import Path

import pytest
import torch

import neuron_stack

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sample_workloads"))
from models import BertEncoder  # noqa: E402

BATCHES = (1, 2, 4, 8, 16)
SEQS = (32, 64, 128, 256, 512)
#: scheduling granularity (a tile more or less on the critical path); the original cliff was 7x
SLACK = 1.1


def _project(model, batch: int, seq: int, vocab: int) -> tuple[int, int, int]:
    """(device ns, FLOPs, HBM bytes) of one inference, as a user gets them from a traced model."""
    ids = torch.randint(0, vocab, (batch, seq))
    nm = neuron_stack.trace(model, ids, compiler_args="--auto-cast matmult", target="trn1")
    m = nm.model
    return m.static_device_ns, m.flops, sum(m.hbm)


@pytest.fixture(scope="module")
def grid():
    torch.manual_seed(0)
    model = BertEncoder(vocab=100, hidden=64, layers=1, heads=2, seq=max(SEQS)).eval()
    return {(b, s): _project(model, b, s, 100) for b in BATCHES for s in SEQS}


def test_latency_is_monotone_and_explained_by_work(grid):
    bad = []
    for (b, s), (t, f, h) in grid.items():
        for nxt in ((2 * b, s), (b, 2 * s)):
            if nxt not in grid:
                continue
            t2, f2, h2 = grid[nxt]
            allowed = max(f2 / f, h2 / h)
            if t2 < t or t2 / t > SLACK * allowed:
                bad.append(
                    f"{(b, s)}->{nxt}: time x{t2 / t:.2f}, FLOPs x{f2 / f:.2f}, HBM bytes x{h2 / h:.2f}"
                )
    assert not bad, "\n".join(bad)


def test_bert_base_width_grows_sublinearly_in_batch():
    torch.manual_seed(0)
    # BERT-base layers (hidden 768, 12 heads, seq 128); two of them keep the test quick, and the
    # per-layer costs are what scale (docs/cost_model.md has the 12-layer figures)
    model = BertEncoder(vocab=30522, hidden=768, layers=2, heads=12, seq=128).eval()
    t = {b: _project(model, b, 128, 30522)[0] for b in (1, 2, 4, 8)}
    assert t[1] < t[2] < t[4] < t[8]
    for b in (2, 4, 8):
        assert t[b] < b * t[1], t  # weights are streamed once per inference, not once per sample
    assert t[8] < 0.9 * 8 * t[1], t


#: sequences between two tile boundaries: a ragged last tile (197 tokens = 128 + 69) costs its rows, not a cliff
PARTIAL_SEQS = (128, 129, 160, 197, 224, 255, 256)


@pytest.fixture(scope="module")
def partial_grid():
    torch.manual_seed(0)
    model = BertEncoder(vocab=100, hidden=128, layers=1, heads=2, seq=256).eval()
    return {(b, s): _project(model, b, s, 100)[0] for b in (1, 2, 3) for s in PARTIAL_SEQS}


def test_partial_tiles_cost_between_their_neighbours(partial_grid):
    """Issue 24: BERT-base at sequence 197 cost more than at 256 (heads of 197 rows straddled SBUF row blocks, so
    per-head tiles went through SBUF->SBUF DMAs or evicted the value). A ragged last tile costs more than none and
    197 tokens at batch 1 no more than 256, and at batch 2 no sequence under 256 more than 256 (a flattened
    [2 x 255, hidden] Linear output is grouped as the residual add views it); latency never falls as the batch
    grows. Not yet: sequences under 256 at batch 3 (docs/cost_model.md, "Partial tiles")."""
    for b in (1, 2, 3):
        assert all(partial_grid[(b, 128)] < partial_grid[(b, s)] for s in PARTIAL_SEQS[1:]), b
    assert partial_grid[(1, 197)] <= partial_grid[(1, 256)]
    assert max(partial_grid[(2, s)] for s in PARTIAL_SEQS) == partial_grid[(2, 256)]
    for s in PARTIAL_SEQS:
        t = [partial_grid[(b, s)] for b in (1, 2, 3)]
        assert t == sorted(t), (s, t)
