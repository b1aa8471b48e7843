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


def test_trn2_logical_cores_group_its_eight_physical_cores(monkeypatch):
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)
    two, one = get_profile("trn2"), get_profile("trn2", lnc=1)
    assert (two.lnc, two.cores_per_chip, two.dma_queues) == (2, 4, 32)
    assert (one.lnc, one.cores_per_chip, one.dma_queues) == (1, 8, 16)
    assert two.physical_cores_per_chip == one.physical_cores_per_chip == 8
    assert two.hbm_bytes_per_core == 2 * one.hbm_bytes_per_core
    assert two.tensor_peak_flops() == one.tensor_peak_flops()          # per physical core
    md2, md1 = two.metadata(), one.metadata()
    assert (md2["vnc_enabled"], md2["num_physical_cores"], md2["neuroncore_version"]) == ("true", "2", "v3d")
    assert (md1["vnc_enabled"], md1["num_physical_cores"], md1["neuroncore_version"]) == ("false", "1", "v3")
    assert float(md2["tensor_engine_peak_bf16_flops"]) == 2 * float(md1["tensor_engine_peak_bf16_flops"])
    assert get_profile("trn1").metadata()["vnc_enabled"] == "false"
    with pytest.raises(ValueError, match="config 2 is not supported on inf2: use 1"):
        get_profile("inf2", lnc=2)
