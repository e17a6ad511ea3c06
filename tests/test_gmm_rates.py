"""The grouped matmul kernel's measured rate by shape (tokamax's autotuning cache): the lookup
against the rows it was read from, and the parts it covers."""

from __future__ import annotations

import math

import pytest

from jaxmem.hardware.gmm_rates import achieved_flops, device_kind
from jaxmem.hardware.gmm_rates_data import ROWS
from jaxmem.hardware.tpu import TPU_GENERATIONS

PARTS = {g.device_kind: f"TPU {g.name}" for g in TPU_GENERATIONS.values()}


def _rate(row) -> float:
  _, _, _, m, k, n, seconds = row
  return 2.0 * m * k * n / seconds


def test_every_row_is_a_part_jaxmem_catalogues():
  assert {r[0] for r in ROWS} <= set(PARTS)
  assert {r[1] for r in ROWS} == {"gmm", "tgmm"}


@pytest.mark.parametrize("row", ROWS[::7])
def test_at_a_measured_shape_the_rate_is_the_fastest_measured_there(row):
  dk, kind, g, m, k, n, _ = row
  there = [_rate(r) for r in ROWS if r[:2] == (dk, kind) and math.isclose(r[3] / r[2], m / g) and r[4:6] == (k, n)]
  assert achieved_flops(PARTS[dk], kind, groups=g, rows=m, k=k, n=n) == max(there)


def test_a_shape_takes_its_nearest_measured_shapes_rate():
  dk, kind, g, m, k, n, _ = ROWS[0]
  part = PARTS[dk]
  exact = achieved_flops(part, kind, groups=g, rows=m, k=k, n=n)
  assert achieved_flops(part, kind, groups=g, rows=m, k=k + 1, n=n - 1) == exact


def test_measured_rates_stay_under_the_parts_matrix_peak_a_device():
  for row in ROWS:
    gen = next(g for g in TPU_GENERATIONS.values() if g.device_kind == row[0])
    assert _rate(row) < gen.peak_bf16_flops_per_chip / gen.devices_per_chip


@pytest.mark.parametrize("part", ["TPU v4", "TPU v6e", "NVIDIA H100", "cpu"])
def test_a_part_without_a_measured_cache_has_no_rate(part):
  assert achieved_flops(part, "gmm", groups=8, rows=4096, k=1024, n=1024) is None


def test_device_kind_follows_the_catalogue():
  assert all(device_kind(part) == dk for dk, part in PARTS.items())
  assert device_kind("NVIDIA H100") is None
