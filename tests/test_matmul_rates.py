"""GPU matmuls timed at XLA's measured GEMM throughput by shape (jaxmem.hardware.matmul_rates):
the table's values where it has the shape, XLA's interpolation between and clamping beyond, no rate
where XLA has no table for the part, and a walk that is never faster than at the peak while the
roofline bound stays at the peak."""

import dataclasses

import pytest

from jaxmem.hardware.gpu import GPU_SPECS
from jaxmem.hardware.matmul_rates import achieved_flops, profile_name, rate_function
from jaxmem.hardware.targets import get_target
from jaxmem.hardware.targets import target_machine as machine
from jaxmem.hlo.ops import hlo_costs
from jaxmem.steptime import estimate, timeline
from jaxmem.steptime.walk import simulate


def test_a_listed_shape_gets_the_tables_value():
  # Two sm_90 entries of XLA's kDefaultMatmulPTable as the source prints them
  # (third_party/xla/xla/backends/gpu/cost_model/matmul_interpolator_data.h at tensorflow/tensorflow
  # a305421c45a1ea5117c170b8d8a00a51f9dcee8f): b 1, m 256, n 256 / 512, k 256.
  assert achieved_flops("h100", 1, 256, 256, 256) == pytest.approx(6721641025641)
  assert achieved_flops("h100", 1, 256, 512, 256) == pytest.approx(12372578171091)
  assert achieved_flops("h100", 1, 256, 256, 256, "f32xf32->f32") == pytest.approx(6026298850574)


def test_xlas_profile_names_pick_the_grid():
  assert [profile_name(GPU_SPECS[n]) for n in ("a100-80gb", "h100", "h200", "b200")] == [
      "sm_80", "sm_90", "sm_90", "sm_100_B200"]
  shape = (2, 1024, 2048, 512)
  assert achieved_flops("h200", *shape) == achieved_flops("h100", *shape)  # one GH100 die, one grid
  assert achieved_flops("b200", *shape) > achieved_flops("h100", *shape)


def test_between_entries_the_rate_lies_between_them_and_beyond_the_grid_the_edge_stands():
  at = lambda m: achieved_flops("h100", 1, m, 4096, 4096)  # noqa: E731
  assert min(at(2048), at(4096)) <= at(3000) <= max(at(2048), at(4096))
  assert at(8192) == pytest.approx(at(4096)) and at(65536) == pytest.approx(at(4096))
  assert at(64) == pytest.approx(at(256))
  # every rate is below the datasheet peak the roofline bound divides by
  assert at(4096) < GPU_SPECS["h100"].peak_bf16_flops


def test_no_rate_where_xla_has_no_table_for_the_part_or_the_dtype():
  assert achieved_flops("a100-80gb", 1, 4096, 4096, 4096) is None  # XLA's table has no sm_80
  assert rate_function(GPU_SPECS["a100-80gb"]) is None
  assert achieved_flops("h100", 1, 4096, 4096, 4096, "f16xf16->f16") is None
  assert achieved_flops("no-such-gpu", 1, 4096, 4096, 4096) is None
  assert machine(get_target("gpu:a100-80gb"))[0].matmul_rate is None
  assert machine(get_target("tpu:v5e-1"))[0].matmul_rate is None  # no per-shape table for TPU


# A Triton GEMM fusion (a dot inside a fusion, as XLA writes GPU matmuls) and a cuBLAS call whose
# backend config carries the dot's dimension numbers: both timed at their shape's rate.
_STEP = """HloModule m

%gemm (p0: bf16[4,512,1024], p1: bf16[4,1024,2048]) -> bf16[4,512,2048] {
  %p0 = bf16[4,512,1024]{2,1,0} parameter(0)
  %p1 = bf16[4,1024,2048]{2,1,0} parameter(1)
  ROOT %d = bf16[4,512,2048]{2,1,0} dot(%p0, %p1), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
}

ENTRY %main (a: bf16[4,512,1024], b: bf16[4,1024,2048], c: bf16[8192,4096], w: bf16[4096,4096]) -> (bf16[4,512,2048], bf16[8192,4096]) {
  %a = bf16[4,512,1024]{2,1,0} parameter(0)
  %b = bf16[4,1024,2048]{2,1,0} parameter(1)
  %c = bf16[8192,4096]{1,0} parameter(2)
  %w = bf16[4096,4096]{1,0} parameter(3)
  %f = bf16[4,512,2048]{2,1,0} fusion(%a, %b), kind=kCustom, calls=%gemm
  %g = (bf16[8192,4096]{1,0}, s8[33554432]{0}) custom-call(%c, %w), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}}}
  %gte = bf16[8192,4096]{1,0} get-tuple-element(%g), index=0
  ROOT %t = (bf16[4,512,2048]{2,1,0}, bf16[8192,4096]{1,0}) tuple(%f, %gte)
}
"""


def test_each_gemm_takes_its_flops_over_its_shapes_rate():
  walk = timeline(hlo_costs(_STEP), get_target("gpu:h100"))
  ops = {o.name: o for o in walk.ops}
  rate = lambda *shape: achieved_flops("h100", *shape)  # noqa: E731
  assert ops["f"].compute_time_s == pytest.approx(2 * 4 * 512 * 2048 * 1024 / rate(4, 512, 2048, 1024))
  assert ops["g"].compute_time_s == pytest.approx(2 * 8192 * 4096 * 4096 / rate(1, 8192, 4096, 4096))


@pytest.mark.parametrize("name", ["gpu:h100", "gpu:b200"])
def test_the_walk_at_measured_rates_is_never_faster_than_at_the_peak_and_the_bound_stays(name):
  costs, target = hlo_costs(_STEP), get_target(name)
  rates, _ = machine(target)
  measured, peak = simulate(costs, rates), simulate(costs, dataclasses.replace(rates, matmul_rate=None))
  assert measured.step_time_s > peak.step_time_s
  for o in peak.ops:
    assert next(m for m in measured.ops if m.name == o.name).compute_time_s >= o.compute_time_s
  args = dict(flops=costs.flops, bytes_accessed=costs.bytes_accessed, comm_bytes=0, num_devices=1, target=target,
              work=None)
  with_rates, _ = estimate(**args, walk=measured)
  at_peak, _ = estimate(**args, walk=peak)
  assert with_rates.roofline_step_time_s == at_peak.roofline_step_time_s  # the bound: datasheet peak
  assert with_rates.roofline_compute_time_s == pytest.approx(costs.flops / rates.peak_flops)
  assert with_rates.step_time_s > at_peak.step_time_s >= at_peak.roofline_step_time_s


@pytest.mark.needs_gpu_compiler
def test_a_compiled_gpu_step_is_slower_at_measured_rates_than_at_the_peak():
  """A small scanned matmul stack compiled for gpu:h100: XLA's GEMMs there (Triton fusions or
  cuBLAS calls) are timed at their rates, the walk is slower than at the peak, and the row's
  roofline bound is the peak's."""
  import jax
  import jax.numpy as jnp

  import jaxmem

  def f(ws, x):
    return jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)[0]

  target = get_target("gpu:h100")
  r = jaxmem.analyze(f, jax.ShapeDtypeStruct((4, 1024, 1024), jnp.bfloat16),
                     jax.ShapeDtypeStruct((2048, 1024), jnp.bfloat16), target="gpu:h100")
  costs = hlo_costs(r.compiled.as_text())
  rates, _ = machine(target)
  measured, peak = simulate(costs, rates), simulate(costs, dataclasses.replace(rates, matmul_rate=None))
  assert costs.flops == pytest.approx(4 * 2 * 2048 * 1024 * 1024)
  matmul = sum(o.compute_time_s for o in measured.ops)
  assert matmul == pytest.approx(costs.flops / achieved_flops("h100", 1, 2048, 1024, 1024))
  assert measured.step_time_s > peak.step_time_s
