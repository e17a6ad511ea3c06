"""The time per op (jaxmem.steptime.ops: its per-op terms) and the FLOPs counted in the optimized HLO
with loop trip counts (item 2: right under a tensor axis, and where GPU gives no cost analysis)."""

import jax
import jax.numpy as jnp
import pytest

import jaxmem
from jaxmem.cli import main
from jaxmem.hardware.targets import target_peaks
from jaxmem.hardware.targets import get_target
from jaxmem.hlo.comms import collectives_from_hlo
from jaxmem.hlo.ops import hlo_costs
from jaxmem.hlo.traffic import traffic
from jaxmem.models import get_config
from jaxmem.planning import sweep
from jaxmem.render.explain import render_explain
from jaxmem.render.ops import OP_HEADERS, render_op_times

M, K = 64, 256


def _stack(layers):
  """``layers`` matmuls scanned over a stacked weight: one layer's FLOPs are 2·M·K·K."""
  def f(ws, x):
    return jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)[0]
  return f, jax.ShapeDtypeStruct((layers, K, K), jnp.bfloat16), jax.ShapeDtypeStruct((M, K), jnp.bfloat16)


@pytest.fixture(scope="module")
def stacks():
  """The scanned stack at 2 and 6 layers on tpu:v5e-1 (where dots become convolutions) and CPU."""
  out = {}
  for target in ("tpu:v5e-1", "cpu"):
    for layers in (2, 6):
      f, ws, x = _stack(layers)
      out[target, layers] = jaxmem.analyze(f, ws, x, target=target)
  return out


@pytest.mark.needs_tpu_compiler
@pytest.mark.parametrize("target", ["tpu:v5e-1", "cpu"])
def test_hlo_flops_of_a_scanned_stack_are_layers_times_one_layer(stacks, target):
  two, six = stacks[target, 2], stacks[target, 6]
  one_layer = 2 * M * K * K
  assert six.hlo_flops == pytest.approx(6 * one_layer) and two.hlo_flops == pytest.approx(2 * one_layer)
  # XLA's cost analysis counts the loop body once: the same for both depths.
  assert six.compiler_flops == pytest.approx(two.compiler_flops, rel=0.05)


@pytest.mark.needs_tpu_compiler
def test_ops_sum_to_the_steps_traffic_and_the_sum_over_ops_is_at_least_the_max_of_sums(stacks):
  r = stacks["tpu:v5e-1", 6]
  times = jaxmem.op_times(r, "tpu:v5e-1")
  assert sum(o.cost.bytes_accessed for o in times.ops) == traffic(r.compiled.as_text()).bytes_accessed == times.bytes_accessed
  sums = (times.compute_time_s, times.memory_time_s, times.comm_time_s)
  assert times.op_time_s >= times.ops_roofline_step_time_s == max(sums)
  assert [o.time_s for o in times.ops] == sorted((o.time_s for o in times.ops), reverse=True)
  peaks, _ = target_peaks(get_target("tpu:v5e-1"))
  slowest = times.ops[0]
  assert slowest.compute_time_s == pytest.approx(slowest.cost.flops / peaks.peak_flops)
  assert slowest.time_s == pytest.approx(max(slowest.compute_time_s, slowest.memory_time_s, slowest.comm_time_s))
  # The per-op times are the schedule walk's: they add up to its step.
  assert sum(o.time_s for o in times.ops) == pytest.approx(times.step_time_s)
  # The loop body's ops run once per layer.
  assert {o.cost.count for o in times.ops if o.cost.flops} == {6}
  assert len(times.top(2).ops) == 2 and times.top(2).op_time_s == times.op_time_s
  text = render_op_times(times.top(3), "table")
  assert all(h in text for h in OP_HEADERS) and "sum over ops" in text and "max of the step's sums" in text


def _mlp(axes):
  """A two-matmul MLP over 4 devices: ``axes`` ("tensor": Megatron's column then row split of the
  weights, the batch whole; "fsdp": the batch and the weights' rows split)."""
  t = get_target("tpu:v5e-4")
  mesh = t.make_mesh([(axes, 4)])
  P = jax.sharding.PartitionSpec
  shard = lambda *spec: jax.sharding.NamedSharding(mesh, P(*spec))  # noqa: E731
  w1, w2 = (P(None, "tensor"), P("tensor", None)) if axes == "tensor" else (P("fsdp", None), P("fsdp", None))
  x = P(None, None) if axes == "tensor" else P("fsdp", None)
  args = [jax.ShapeDtypeStruct((M, K), jnp.bfloat16, sharding=shard(*x)),
          jax.ShapeDtypeStruct((K, 4 * K), jnp.bfloat16, sharding=jax.sharding.NamedSharding(mesh, w1)),
          jax.ShapeDtypeStruct((4 * K, K), jnp.bfloat16, sharding=jax.sharding.NamedSharding(mesh, w2))]
  return jaxmem.analyze(lambda x, a, b: jnp.tanh(x @ a) @ b, *args, target=t)


@pytest.mark.needs_tpu_compiler
def test_per_device_flops_of_a_tensor_split_mlp_are_a_quarter():
  tensor, fsdp = _mlp("tensor"), _mlp("fsdp")
  quarter = 2 * 2 * M * K * 4 * K / 4
  assert tensor.hlo_flops == pytest.approx(quarter) and fsdp.hlo_flops == pytest.approx(quarter)
  assert tensor.flops == pytest.approx(fsdp.flops, rel=0.02) and tensor.flops >= quarter


@pytest.fixture(scope="module")
def meshes():
  """tiny (4 kv heads, so tensor=4 divides them) on tpu:v5e-4 under tensor=4 and fsdp=4, dot attention."""
  cfg = get_config("tiny", num_kv_heads=4)
  return {m: sweep.compare(model=cfg, target="tpu:v5e-4", mesh=m, remat="none", batch=8, seq=128, attention="dot",
                           cache=False)[0] for m in ("tensor=4", "fsdp=4")}


@pytest.mark.slow
@pytest.mark.needs_tpu_compiler
def test_per_device_flops_agree_between_tensor_and_fsdp(meshes):
  # Two compiles of the train step (about 7-10 s on the loaded 2-core machine); the MLP above is the cheap cover.
  t, f = meshes["tensor=4"], meshes["fsdp=4"]
  assert t.hlo_flops == pytest.approx(f.hlo_flops, rel=0.02)
  assert t.flops == pytest.approx(f.flops, rel=0.02)
  # Against the model's 6·N·T + attention per device: matrix FLOPs are most of the step's.
  assert 0.9 * t.model_flops < t.hlo_flops <= t.flops
  assert not any("undercount" in n for n in t.notes)


@pytest.mark.needs_tpu_compiler
def test_comm_bytes_sum_over_the_ops_that_send_them():
  t = get_target("tpu:v5e-4")
  mesh = t.make_mesh([("fsdp", 4)])
  spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))
  w = jax.ShapeDtypeStruct((K, K), jnp.bfloat16, sharding=spec)
  x = jax.ShapeDtypeStruct((M, K), jnp.bfloat16, sharding=spec)
  text = jaxmem.analyze(lambda w, x: x @ w, w, x, target="tpu:v5e-4").compiled.as_text()
  costs = hlo_costs(text)
  assert costs.comm_bytes == collectives_from_hlo(text).total_bytes > 0
  assert sum(o.comm_bytes for o in costs.ops) == costs.comm_bytes


@pytest.mark.slow
@pytest.mark.needs_tpu_compiler
@pytest.mark.needs_gpu_compiler
def test_a_gpu_compile_without_a_device_counts_the_same_matrix_flops(meshes):
  # cost_analysis() gives nothing there; the HLO count does (about 25 s of compile).
  cfg = get_config("tiny", num_kv_heads=4)
  (gpu,) = [r for r in sweep.compare(model=cfg, target="gpu:h100x4", mesh="tensor=4", remat="none", batch=8, seq=128,
                                     attention="dot", cache=False) if r.remat == "none"]
  assert gpu.hlo_flops == pytest.approx(meshes["tensor=4"].hlo_flops, rel=0.02)
  assert gpu.flops == pytest.approx(meshes["tensor=4"].flops, rel=0.02)


# --- hand-written HLO: what the TPU and GPU compilers write a matmul as ---------------------------

_CONV = """HloModule m, entry_computation_layout={()->()}

ENTRY %main (a: bf16[64,16,1], b: bf16[8,128,64], c: bf16[8,128,16], d: bf16[8,128,16], g: bf16[1024,64], h: bf16[64,48]) -> bf16[8,128,16] {
  %a = bf16[64,16,1]{0,1,2} parameter(0)
  %b = bf16[8,128,64]{1,2,0} parameter(1)
  %c = bf16[8,128,16]{2,1,0} parameter(2)
  %d = bf16[8,128,16]{2,1,0} parameter(3)
  %g = bf16[1024,64]{1,0} parameter(4)
  %h = bf16[64,48]{1,0} parameter(5)
  %padded = bf16[8,128,16]{1,2,0} convolution(%a, %b), window={size=8 pad=7_7 rhs_reversal=1}, dim_labels=fb0_0oi->0fb
  %dilated = bf16[8,128,128]{2,1,0} convolution(%c, %d), window={size=8 stride=7 lhs_dilate=8}, dim_labels=0bf_0oi->0bf
  %gemm = (bf16[1024,48]{1,0}, s8[4194304]{0}) custom-call(%g, %h), custom_call_target="__cublas$gemm", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}}}
  ROOT %out = bf16[8,128,16]{1,2,0} copy(%padded)
}
"""


def test_matmuls_written_as_convolutions_and_gemm_calls_count_as_their_dots():
  ops = {o.name: o for o in hlo_costs(_CONV).ops}
  # btd,dkh->btkh as TPU writes it: 8 positions of a window padded to read one input each, 64 in, 128 out, batch 16.
  assert ops["padded"].flops == 2 * 8 * 64 * 128 * 16
  # A batched matmul (batch 8 as a dilated spatial dimension): 8 valid (output, kernel) pairs, not 8 x 8.
  assert ops["dilated"].flops == 2 * 8 * 16 * 128 * 128
  assert ops["gemm"].flops == 2 * 1024 * 64 * 48 and ops["gemm"].kind == "__cublas$gemm"
  assert ops["out"].flops == 0


def test_top_ops_needs_a_table_or_json(capsys):
  assert main(["explain", "--model", "tiny", "--top-ops", "3", "--format", "csv"]) == 2
  assert "--top-ops" in capsys.readouterr().err


@pytest.mark.needs_tpu_compiler
def test_explain_lists_the_slowest_ops_when_asked():
  f, ws, x = _stack(2)
  explained = jaxmem.explain(f, ws, x, target="tpu:v5e-1")
  with pytest.raises(jaxmem.JaxmemError):
    jaxmem.op_times(explained, top=0)
  times = jaxmem.op_times(explained, top=2)  # the explanation's target's peaks
  assert len(times.ops) == 2 and times.op_time_s >= times.ops_roofline_step_time_s > 0
  text = render_explain(explained, "table", op_times=times)
  assert "the 2 slowest ops in the simulated schedule" in text and "sum over ops" in text
  assert '"op_times"' in render_explain(explained, "json", op_times=times)
  assert '"op_times"' not in render_explain(explained, "json")
  assert jaxmem.op_times(explained, "cpu").op_time_s is None  # no published peaks: no times


def test_valid_window_positions_are_xlas_double_loop():
  # XLA's valid_position_count (HloCostAnalysis), written out, on a grid of windows.
  from itertools import product

  from jaxmem.hlo.ops import _valid_positions

  def xla(size, kernel, output, stride, pad, base, dilation):
    n = 0
    for k, o in product(range(kernel), range(output)):
      u = o * stride - pad + k * dilation
      i = u // base if base > 1 else u
      n += u == i * base and 0 <= i < size
    return n

  for args in product([1, 3, 8], [1, 2, 8], [1, 8], [1, 7], [0, 7], [1, 8], [1, 3]):
    assert _valid_positions(*args[:3], stride=args[3], pad_low=args[4], base_dilation=args[5],
                            window_dilation=args[6]) == xla(*args), args


@pytest.mark.needs_tpu_compiler
def test_a_slices_collectives_are_timed_where_its_devices_sit():
  """tpu:v5e-4 is a 2x2 grid without wraparound: an all-gather over its four chips drives one link
  an axis, two of the chip's four. The report places each device on its chip; the op times walk
  the same schedule as its row, over those links, slower than at the chip's whole ICI."""
  from jaxmem.steptime import timeline

  t = get_target("tpu:v5e-4")
  mesh = t.make_mesh([("fsdp", 4)])
  spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))
  w = jax.ShapeDtypeStruct((K, K), jnp.bfloat16, sharding=spec)
  x = jax.ShapeDtypeStruct((M, K), jnp.bfloat16, sharding=spec)
  r = jaxmem.analyze(lambda w, x: x @ w, w, x, target=t)
  assert sorted(r.placement) == sorted(tuple(d.coords)[:len(r.placement[0])] for d in mesh.devices.flat)
  placed, anywhere = timeline(r.hlo_costs, t, r.placement), timeline(r.hlo_costs, t)
  times = jaxmem.op_times(r, t)
  assert times.step_time_s == pytest.approx(placed.step_time_s)
  assert times.ici_comm_time_s == pytest.approx(placed.comm_time_s) == times.comm_time_s  # one slice: all on ICI
  assert placed.comm_time_s > anywhere.comm_time_s > 0
  assert any("chip coordinates are not known" in n for n in anywhere.notes)
  assert not any("chip coordinates are not known" in n for n in placed.notes)
