"""Device profiles: the numbers of reference §5.1 and the real profiler's Metadata field names."""
import pytest

from neuron_stack.device.profiles import PROFILES, get_profile


def test_published_peaks_and_sizes():
    trn1, trn2, inf2 = get_profile("trn1"), get_profile("trn2"), get_profile("inf2")
    assert trn1.tensor_peak_flops("bfloat16") / 1e12 == pytest.approx(91.75, abs=0.1)
    assert trn1.tensor_peak_flops("float32") / 1e12 == pytest.approx(22.9, abs=0.1)
    assert trn2.tensor_peak_flops("bfloat16") / 1e12 == pytest.approx(78.6, abs=0.1)
    assert trn1.sbuf_bytes_per_partition * trn1.partitions == 24 * 2**20
    assert trn2.sbuf_bytes_per_partition * trn2.partitions == 28 * 2**20
    assert trn1.psum_bytes_per_partition * trn1.partitions == 2 * 2**20
    assert trn1.dma_bytes_per_ns == 272 and trn2.dma_bytes_per_ns == 368
    assert trn1.hbm_bytes_per_core == 16 * 2**30 and trn2.hbm_bytes_per_core == 24 * 2**30
    assert inf2.cores_per_chip == 2 and trn2.cores_per_chip == 4
    assert trn2.throttle and not trn1.throttle


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_metadata_uses_profiler_names(name):
    md = get_profile(name).metadata()
    assert md["is_simulation"] == "true"
    for key in ("dma_ddr_bandwidth", "num_dma_engines_per_neuroncore", "hbm_ddr_bandwidth",
                "tensor_engine_num_rows", "tensor_engine_num_cols", "tensor_engine_clock_freq",
                "vector_engine_clock_freq", "scalar_engine_clock_freq", "gpsimd_engine_clock_freq",
                "neuroncore_clock_freq", "instance_type", "num_physical_cores", "vnc_enabled"):
        assert key in md, key
    assert all(isinstance(v, str) for v in md.values())
    assert get_profile(name).sources, "every profile names its sources"


def test_unknown_profile_is_one_clear_error():
    with pytest.raises(ValueError, match="choose one of trn1, inf2, trn2"):
        get_profile("trn9")
