"""Accelerator types as users type them -> JAX's topology names, chips and HBM (no libtpu needed)."""
import pytest

from vt import VtError
from vt.plan import topology


@pytest.mark.parametrize("name, jax_name, chips, hbm_gb", [
    ("v5p-8", "v5p:2x2x1", 4, 95), ("v5p-16", "v5p:2x2x2", 8, 95), ("v5p-256", "v5p:4x4x8", 128, 95),
    ("v6e-8", "v6e:2x4", 8, 32), ("v6e-256", "v6e:16x16", 256, 32), ("v5e-8", "v5e:2x4", 8, 16),
    ("v5litepod-16", "v5e:4x4", 16, 16), ("v4-8", "v4:2x2x1", 4, 32), ("V5P-64", "v5p:2x4x4", 32, 95)])
def test_parse(name, jax_name, chips, hbm_gb):
    t = topology.parse(name)
    assert (t.jax_name, t.chips, t.hbm_bytes) == (jax_name, chips, hbm_gb * 10 ** 9)


@pytest.mark.parametrize("name", ["v5p-7", "v5p-6", "v6e-3", "h100-12", "h100-0", "a100-8", "v5p", "v5p-x", ""])
def test_unknown(name):
    with pytest.raises(VtError, match="unknown topology"):
        topology.parse(name)


def test_hbm_per_device():
    """v4's topology lists a device per TensorCore (8 for 4 chips): each gets half a chip's HBM."""
    assert topology.hbm_per_device(topology.parse("v4-8"), 8) == 16 * 10 ** 9
    assert topology.hbm_per_device(topology.parse("v5p-8"), 4) == 95 * 10 ** 9


@pytest.mark.parametrize("name, jax_name, chips, single_host", [
    ("h100-8", "1x1x8", 8, True), ("h100-1", "1x1x1", 1, True), ("H100-16", "1x2x8", 16, False)])
def test_parse_gpu(name, jax_name, chips, single_host):
    """NVIDIA H100s by count: the jax-cuda plugin's <partitions>x<hosts>x<devices per host>, 80 GB each."""
    t = topology.parse(name)
    assert (t.jax_name, t.chips, t.single_host, t.platform, t.hbm_bytes) == (jax_name, chips, single_host, "cuda",
                                                                            80 * 10 ** 9)
