"""The host's memory per target (jaxmem.hardware.hostmem): every TPU generation and GPU part names
the machine that carries it and where its RAM is published, or why none is; a device's share is
the host's RAM over the devices it carries; host bytes are judged against that share alone."""

import pytest

from jaxmem.hardware import hostmem
from jaxmem.hardware.gpu import GPU_SPECS
from jaxmem.hardware.targets import get_target
from jaxmem.hardware.tpu import TPU_GENERATIONS


@pytest.mark.parametrize("spec", [*TPU_GENERATIONS.values(), *GPU_SPECS.values()], ids=lambda s: s.name)
def test_every_target_spec_has_a_host_with_its_source_or_the_reason_it_has_none(spec):
  host = spec.host
  assert host is not None and host.accelerators >= 1
  if host.ram_bytes is None:
    assert host.why
  else:
    assert host.machine and host.source.startswith("https://")


def test_a_hosts_share_is_its_ram_over_the_devices_it_carries():
  # v5p: 448 GB over a VM's 4 chips; v7x: 960 GB over 4 chips of two devices each; H100: 1872 GB over 8.
  assert get_target("tpu:v5p-8").host_capacity_bytes == 448 * 10**9 // 4
  assert get_target("tpu:v7x-8").host_capacity_bytes == 960 * 10**9 // 8
  h100 = get_target("gpu:h100x16")  # two hosts of 8: the same share
  assert h100.host_capacity_bytes == 1872 * 10**9 // 8 == get_target("gpu:h100").host_capacity_bytes
  assert "a3-highgpu-8g" in h100.host_capacity_note


def test_a_target_without_a_published_host_ram_has_null_and_the_reason():
  for name in ("gpu:a800x8", "tpu:v4-8", "cpu"):
    t = get_target(name)
    assert t.host_capacity_bytes is None
    assert t.host_capacity_note.startswith("host_capacity_bytes: unknown: ")
  with pytest.raises(ValueError, match="either a RAM figure or the reason"):
    hostmem.HostSpec(machine="m", accelerators=8, ram_bytes=None, source=None)


def test_host_verdict_only_where_something_is_held_on_a_known_host():
  assert hostmem.judge_host(10, 10) == hostmem.HostVerdict(host_capacity_bytes=10, host_fits=True, host_verdict="yes")
  assert hostmem.judge_host(11, 10).host_verdict == "NO"
  assert hostmem.judge_host(0, 10) == hostmem.HostVerdict() == hostmem.judge_host(None, 10)
  assert hostmem.judge_host(11, None) == hostmem.HostVerdict()  # unknown capacity: the row's note says why
