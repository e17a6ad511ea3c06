"""A mixture-of-experts step in the schedule walk: megablox's grouped matmuls timed as their tiles
do the work (row tiles over ragged groups, masked blocks), and the step's time by MoE term
(jaxmem.steptime.kernels, jaxmem.steptime.moe)."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import pytest

import jaxmem
from jaxmem.hardware.targets import get_target, target_machine, target_peaks
from jaxmem.hlo.ops import hlo_costs
from jaxmem.hlo.text import parse_module
from jaxmem.models.moe_kernels import gmm, ragged_dot
from jaxmem.steptime import timeline
from jaxmem.steptime.kernels import expected_visits
from jaxmem.steptime.moe import classify
from jaxmem.steptime.walk import simulate

TARGET = "tpu:v5e-1"


def test_one_group_visits_each_row_tile_once():
  assert expected_visits(rows=4096, tm=512, groups=1, local_groups=1, visit_empty=False) == 8


def test_more_groups_split_more_row_tiles_up_to_the_kernels_bound():
  visits = [expected_visits(rows=4096, tm=512, groups=g, local_groups=g, visit_empty=False) for g in (1, 2, 8, 64)]
  assert visits == sorted(visits) and visits[0] < visits[-1]
  for g, v in zip((1, 2, 8, 64), visits):
    assert v <= math.ceil(4096 / 512) + g - 1  # megablox's tiles_m + num_groups - 1


def test_a_row_tile_of_one_row_is_never_split():
  # With tm = 1 no group starts inside a tile: the rows are the visits.
  assert expected_visits(rows=300, tm=1, groups=16, local_groups=16, visit_empty=False) == 300


def test_empty_groups_cost_a_tile_only_where_the_kernel_visits_them():
  # 64 rows over 256 experts: most groups are empty; tgmm writes their (zero) gradient blocks.
  skip = expected_visits(rows=64, tm=64, groups=256, local_groups=256, visit_empty=False)
  visit = expected_visits(rows=64, tm=64, groups=256, local_groups=256, visit_empty=True)
  assert visit > skip + 100


def test_a_device_holding_a_quarter_of_the_experts_visits_about_a_quarter_of_the_tiles():
  whole = expected_visits(rows=1 << 16, tm=512, groups=64, local_groups=64, visit_empty=False)
  quarter = expected_visits(rows=1 << 16, tm=512, groups=64, local_groups=16, visit_empty=False)
  assert 0.2 < quarter / whole < 0.3


def _step(kernel, m: int, k: int, n: int, groups: int):
  def step(x, w, sizes):
    return jax.grad(lambda x, w: kernel(x, w, sizes).astype(jnp.float32).sum(), argnums=(0, 1))(x, w)

  args = (jax.ShapeDtypeStruct((m, k), jnp.bfloat16), jax.ShapeDtypeStruct((groups, k, n), jnp.bfloat16),
          jax.ShapeDtypeStruct((groups,), jnp.int32))
  report = jaxmem.analyze(step, *args, target=TARGET)
  return timeline(report.hlo_costs, get_target(TARGET), report.placement)


@pytest.mark.needs_tpu_compiler
def test_more_groups_over_the_same_rows_take_the_kernel_longer():
  # Same matmul work (2mkn); 8 groups leave more part-filled row tiles than 2.
  few, many = (_step(gmm, 2048, 256, 384, g) for g in (2, 8))
  assert few.moe is not None and many.moe is not None
  assert many.moe.grouped_matmul_time_s > few.moe.grouped_matmul_time_s
  assert many.moe.tile_fill_time_s > few.moe.tile_fill_time_s > 0
  assert many.moe.experts == 8 and many.moe.rows == 2048


@pytest.mark.needs_tpu_compiler
def test_a_dimension_the_tile_does_not_divide_pads_the_kernel():
  # n = 640 against megablox's n tile cut to 640 (one block) versus n = 1152 (two blocks of 1024,
  # the second mostly masked): per unit of matmul work the second runs more tiles.
  fits, spills = (_step(gmm, 1024, 256, n, 1) for n in (640, 1152))
  fill = lambda t: t.moe.tile_fill_time_s / t.moe.grouped_matmul_time_s  # noqa: E731
  assert fill(spills) > fill(fits)


@pytest.mark.needs_tpu_compiler
def test_the_kernels_tiles_time_more_than_their_cost_estimate_at_the_peak():
  walk = _step(gmm, 2048, 256, 384, 8)
  kernels = [o for o in walk.ops if o.opcode == "custom-call" and o.flops]
  assert len(kernels) == 2  # the forward's transposed gmm and tgmm
  peak = target_peaks(get_target(TARGET))[0].peak_flops
  for o in kernels:
    assert o.padded_flops > o.flops  # the tiles' work over the cost estimate's 2mkn
    assert o.time_s > o.flops / peak  # what the walk gave them before: 2mkn at the peak


@pytest.mark.needs_tpu_compiler
def test_without_the_kernel_the_step_has_no_moe_terms():
  assert _step(ragged_dot, 2048, 256, 384, 8).moe is None


_MODULE = """HloModule m

%cmp (a: f32[], b: f32[]) -> pred[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %lt = pred[] compare(%a, %b), direction=LT
}

ENTRY %main (w: bf16[2,8,64,32], ids: s32[512], x: bf16[512,64], logits: f32[128,8]) -> bf16[8,64,32] {
  %w = bf16[2,8,64,32]{3,2,1,0} parameter(0)
  %ids = s32[512]{0} parameter(1)
  %x = bf16[512,64]{1,0} parameter(2)
  %logits = f32[128,8]{1,0} parameter(3)
  %ag = bf16[8,8,64,32]{3,2,1,0} all-gather(%w), dimensions={0}, replica_groups={{0,1,2,3}}
  %top = (f32[128,8]{1,0}, s32[128,8]{1,0}) sort(%logits, %logits), dimensions={1}, to_apply=%cmp
  %order = s32[512]{0} sort(%ids), dimensions={0}, to_apply=%cmp
  %rows = bf16[512,64]{1,0} gather(%x, %ids), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,64}
  %act = bf16[512,64]{1,0} multiply(%rows, %rows)
  ROOT %r = bf16[8,64,32]{2,1,0} slice(%ag), slice={[0:1], [0:8], [0:64], [0:32]}
}
"""


@pytest.mark.parametrize("name, collective, term", [
    ("ag", True, "expert_weights"),  # the experts' weights gathered: [.., E, a, b]
    ("top", False, "router"),  # a top-k over the experts, one row a token
    ("order", False, "permutation"),  # the argsort of the routed rows' expert ids
    ("rows", False, "permutation"),  # the gather of the rows into expert order
    ("act", False, "expert_activation"),  # arithmetic on the routed rows
    ("logits", False, "router"),
])
def test_each_op_falls_under_its_moe_term(name, collective, term):
  module = parse_module(_MODULE)
  ins = module.get(name, "main")
  assert classify(module, ins, experts=8, rows=512, collective=collective) == term


def test_ops_of_no_moe_term_are_left_out():
  module = parse_module(_MODULE)
  # A collective moving neither experts' arrays nor routed rows.
  assert classify(module, module.get("logits", "main"), experts=8, rows=512, collective=True) is None
  assert hlo_costs(_MODULE).ops  # the module parses as the walk reads it


@pytest.mark.needs_tpu_compiler
def test_the_kernels_measured_rate_is_its_own_part_of_the_grouped_matmul():
  # On TPU v5p the grouped matmul measured by tokamax runs below its tiles at the chip's peak
  # (jaxmem.hardware.gmm_rates): the walk times it no faster, and reports what that adds apart.
  # The same program on a machine whose part has no measured rate is timed by its tiles alone.
  target = "tpu:v5p-2"
  def step(x, w, sizes):
    return jax.grad(lambda x, w: gmm(x, w, sizes).astype(jnp.float32).sum(), argnums=(0, 1))(x, w)

  args = (jax.ShapeDtypeStruct((8192, 1024), jnp.bfloat16), jax.ShapeDtypeStruct((8, 1024, 1024), jnp.bfloat16),
          jax.ShapeDtypeStruct((8,), jnp.int32))
  report = jaxmem.analyze(step, *args, target=target)
  machine, _ = target_machine(get_target(target), report.placement)
  measured = simulate(report.hlo_costs, machine).moe
  tiles = simulate(report.hlo_costs, dataclasses.replace(machine, part="TPU v5p, no measured rate")).moe
  assert tiles.kernel_rate_time_s == 0 < measured.kernel_rate_time_s
  assert measured.grouped_matmul_time_s == pytest.approx(tiles.grouped_matmul_time_s + measured.kernel_rate_time_s)
  assert measured.tile_fill_time_s == pytest.approx(tiles.tile_fill_time_s)
  assert "measured rate" in measured.summary() and "measured rate" not in tiles.summary()
