"""The cost formulas of reference §5.4 on hand-computed small cases (constants from the profiles)."""
import pytest

from neuron_stack.device import cost
from neuron_stack.device.profiles import get_profile

TRN1, TRN2 = get_profile("trn1"), get_profile("trn2")


def test_matmul_initiation_interval():
    # max(min(64, N_stationary), N_moving) TensorE cycles at 2.8 GHz
    assert cost.matmul_ns(TRN1, 512, 128, "bfloat16") == pytest.approx(512 / 2.8)
    assert cost.matmul_ns(TRN1, 10, 128, "bfloat16") == pytest.approx(64 / 2.8)      # 64-cycle floor
    assert cost.matmul_ns(TRN1, 10, 16, "bfloat16") == pytest.approx(16 / 2.8)       # small stationary
    assert cost.matmul_ns(TRN1, 512, 128, "float32") == pytest.approx(4 * 512 / 2.8)  # FP32 is 4x
    assert cost.matmul_ns(TRN2, 512, 128, "bfloat16") == pytest.approx(512 / 2.4)


def test_ldweights_is_up_to_4x_faster():
    assert cost.ldweights_ns(TRN1, 128, "bfloat16") == pytest.approx(128 / 4 / 2.8)
    assert cost.ldweights_ns(TRN1, 8, "bfloat16") == pytest.approx(64 / 4 / 2.8)


def test_vector_formulas():
    c = TRN1.vector_clock_ghz
    assert cost.vector_ns(TRN1, "TENSOR_SCALAR", 1000) == pytest.approx(1000 / c)
    assert cost.vector_ns(TRN1, "TENSOR_SCALAR", 10) == pytest.approx(64 / c)          # MIN_II
    assert cost.vector_ns(TRN1, "TENSOR_TENSOR", 1000, 2) == pytest.approx(2000 / c)    # two inputs: 2N
    assert cost.vector_ns(TRN1, "TENSOR_TENSOR", 1000, 2, fast=True) == pytest.approx(1000 / c)
    assert cost.vector_ns(TRN1, "RECIPROCAL", 100) == pytest.approx(800 / c)            # 8N
    assert cost.vector_ns(TRN1, "BN_AGGR", 30) == pytest.approx(130 / c)                # 13N/3
    assert cost.vector_ns(TRN1, "REDUCE", 1000, dtype="bfloat16", alu="add") == pytest.approx(500 / c)
    # NC-v3 performance mode: bf16 copies 4x, other bf16 Vector work 2x
    c2 = TRN2.vector_clock_ghz
    assert cost.vector_ns(TRN2, "TENSOR_COPY", 1024, dtype="bfloat16") == pytest.approx(256 / c2)
    assert cost.vector_ns(TRN2, "TENSOR_TENSOR", 1024, 2, dtype="bfloat16") == pytest.approx(1024 / c2)


def test_scalar_gpsimd_and_overhead():
    assert cost.scalar_ns(TRN1, 512) == pytest.approx(512 / 1.4)
    assert cost.scalar_ns(TRN1, 512, accumulate=True) == pytest.approx(576 / 1.4)
    assert cost.gpsimd_ns(TRN1, 50) == pytest.approx(200 / 1.4)
    assert cost.dependent_overhead_ns(TRN1, "vector") == pytest.approx(100 / 1.12)


def test_dma_fixed_cost_and_descriptor_efficiency():
    # one transfer: 1.3 us fixed + (bytes + descriptors x overhead) at one engine's 17 B/ns
    assert cost.dma_ns(TRN1, 17_000, 1) == pytest.approx(1300 + (17_000 + 256) / 17)
    assert cost.dma_efficiency(TRN1, 64) < 0.3            # overhead-bound under 256 B per partition
    assert cost.dma_efficiency(TRN1, 256) <= 0.5
    assert cost.dma_efficiency(TRN1, 4096) > 0.9          # near peak from 4 KiB


def test_throttle_ramp_only_on_trn2():
    assert cost.throttle_factor(TRN1, 0) == 1.0
    assert cost.throttle_factor(TRN2, 0) == 0.5
    assert cost.throttle_factor(TRN2, TRN2.throttle_ramp_ns / 2) == pytest.approx(0.75)
    assert cost.throttle_factor(TRN2, 10 * TRN2.throttle_ramp_ns) == 1.0


def test_collective_cost_for_the_compiler():
    from neuron_stack.device.collective_cost import collective_ns
    assert collective_ns(TRN1, "all_reduce", 1 << 20, 1) == 0
    assert 0 < collective_ns(TRN1, "all_reduce", 1 << 20, 2) < collective_ns(TRN1, "all_reduce", 1 << 21, 2)
