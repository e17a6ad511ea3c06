"""The TPU parts' step-time figures as the walk's machine carries them: each a device's share of its
chip's published figure, links from the chip's link count, and what is not published said so."""

import pytest

from jaxmem.hardware.machine import tpu_machine
from jaxmem.hardware.targets import get_target, target_machine, target_peaks
from jaxmem.hardware.tpu import TPU_GENERATIONS

V7X = TPU_GENERATIONS["v7x"]


def _machine(name: str, *, slices: int = 1, placed: bool = True):
  t = get_target(name, slices=slices)
  coords = [d.coords for d in t.devices] if placed else None
  machine, why = target_machine(t, coords)
  assert why is None
  return t, machine


def test_a_tpu7x_device_is_half_its_chip():
  """Two devices a chip, each with half of the chip's matrix rates, HBM bandwidth and DCN."""
  peaks, _ = target_peaks(get_target("tpu:v7x-128"))
  assert peaks.peak_flops * 2 == pytest.approx(V7X.peak_bf16_flops_per_chip)
  assert peaks.peak_8bit_ops * 2 == pytest.approx(V7X.peak_8bit_ops_per_chip)
  assert peaks.peak_8bit_ops == pytest.approx(2 * peaks.peak_flops)  # fp8 doubles bf16 on TPU7x
  assert peaks.hbm_bandwidth * 2 == pytest.approx(V7X.hbm_bandwidth_per_chip)
  _, machine = _machine("tpu:v7x-128", slices=2, placed=False)
  assert machine.slow is not None and machine.slow.bandwidth * 2 == pytest.approx(V7X.dcn_bandwidth_per_chip)


@pytest.mark.needs_tpu_compiler
def test_tpu7x_links_share_the_chips_ici_over_its_six_links_and_two_devices():
  t, machine = _machine("tpu7x-4x4x4")
  torus = machine.torus
  assert torus is not None and torus.dims == (4, 4, 4) and all(torus.wrap)
  # Every link, both directions, of every device of a chip adds up to the chip's bidirectional figure.
  assert torus.link_bandwidth * 2 * V7X.ici_links_per_chip * V7X.devices_per_chip == pytest.approx(
      V7X.ici_bandwidth_per_chip)
  # A ring over the whole slice drives both directions of each axis: all the chip's links.
  assert torus.links(list(range(t.num_devices))) == V7X.ici_links_per_chip
  # The two devices of a chip share its coordinates: a group of them drives no link between chips.
  pairs = {}
  for i, c in enumerate(torus.coords):
    pairs.setdefault(c, []).append(i)
  assert {len(p) for p in pairs.values()} == {V7X.devices_per_chip}
  assert torus.links(next(iter(pairs.values()))) == 0
  assert any("link between the 2 devices of a TPU v7x chip is not published" in n for n in machine.notes)


def test_the_link_count_is_the_parts_not_the_grids():
  """A part whose link count is not published gets no torus (its collectives at the chip's whole
  ICI figure) and a note saying so, whatever its grid."""
  import dataclasses

  gen = dataclasses.replace(TPU_GENERATIONS["v5p"], ici_links_per_chip=None)
  t = get_target("tpu:v5p-128")
  peaks, _ = target_peaks(t)
  coords = [(x, y, z) for z in range(4) for y in range(4) for x in range(4)]
  m = tpu_machine(gen, size=128, slices=1, num_devices=t.num_devices, peaks=peaks, coords=coords)
  assert m.torus is None and any("ICI links a chip are not published" in n for n in m.notes)
  m = tpu_machine(TPU_GENERATIONS["v5p"], size=128, slices=1, num_devices=t.num_devices, peaks=peaks, coords=coords)
  assert m.torus is not None and not any("ICI links" in n for n in m.notes)


def test_tpu7x_matmuls_round_to_its_matrix_unit():
  _, machine = _machine("tpu:v7x-8", placed=False)
  assert machine.tile is not None and machine.tile.columns == machine.tile.contracted == V7X.mxu_size
  assert not any("matrix unit size is not published" in n for n in machine.notes)


def test_what_is_not_published_is_none_with_a_reason():
  assert V7X.vector_ops_per_chip is None
  _, machine = _machine("tpu:v7x-8", placed=False)
  assert machine.vector_rate is None and any("no vector-unit rate is published for TPU v7x" in n for n in machine.notes)
  for gen in TPU_GENERATIONS.values():
    assert (gen.host_link_bandwidth_per_chip is None) <= bool(gen.host_link_note), gen.name
  assert V7X.host_link_bandwidth_per_chip is None and "not published" in V7X.host_link_note
