"""Precision as big runs train: an f32 master copy beside bf16 parameters,
the moments' dtype, the gradient-reduction dtype; the closed form with the same options.

Byte relationships are read on the CPU target, whose argument buffers are the logical sizes
(TPU layouts pad the tiny model's 64-wide dimensions to 128 lanes)."""

from __future__ import annotations

import json

import pytest

from jaxmem.errors import JaxmemError
from jaxmem.planning import estimate as est
from jaxmem.models import count_params, get_config
from jaxmem.planning import sweep
from jaxmem.resolve import plan

N = count_params(get_config("tiny"))
TINY = dict(model="tiny", target="cpu", batch=2, seq=16, remat="none")
LAYOUTS = {
    "fp32": {},
    "zero": dict(param_dtype="bfloat16", master_dtype="float32"),
    "zero_bf16_moments": dict(param_dtype="bfloat16", master_dtype="float32", moments_dtype="bfloat16"),
    "fp32_bf16_moments": dict(moments_dtype="bfloat16"),
}


@pytest.fixture(scope="module")
def rows():
  # Two sweeps of two moments dtypes each (a dtype list is a sweep axis), the
  # four layouts in four compiles as one compare each would take.
  fp32 = sweep.compare(**TINY, moments_dtype="default,bfloat16")
  zero = sweep.compare(**TINY, **LAYOUTS["zero"], moments_dtype="default,bfloat16")
  return {"fp32": fp32[0], "fp32_bf16_moments": fp32[1], "zero": zero[0], "zero_bf16_moments": zero[1]}


def per_param(b: int | None) -> float:
  assert b is not None
  return b / N


def test_zero_layout_keeps_2_bytes_of_params_and_12_of_state(rows):
  r = rows["zero"]
  assert r.error is None
  assert (r.param_dtype, r.master_dtype, r.moments_dtype, r.grad_reduce_dtype) == ("bfloat16", "float32", "float32", None)
  assert per_param(r.param_bytes) == pytest.approx(2)
  # The master copy (4) and Adam's two float32 moments (4 + 4); the step count is the rest.
  assert per_param(r.optimizer_state_bytes) == pytest.approx(12, rel=1e-3)
  # The compiler's arguments are those plus the tokens (2 x 2 x 16 int32: 0.2% of the tiny model).
  assert per_param(r.argument_size_in_bytes) == pytest.approx(14, rel=0.02)
  # Against float32 parameters and moments (4 + 8): the master layout keeps 2 bytes more.
  assert per_param(r.argument_size_in_bytes - rows["fp32"].argument_size_in_bytes) == pytest.approx(2, rel=0.02)
  assert any("master copy" in n for n in r.notes)


def test_a_moments_list_is_a_row_per_dtype(rows):
  # "default" is the dtype the optimizer updates in: the parameters' float32 here.
  assert (rows["fp32"].moments_dtype, rows["fp32_bf16_moments"].moments_dtype) == ("float32", "bfloat16")
  assert rows["fp32"].recompute_overhead_pct == rows["fp32_bf16_moments"].recompute_overhead_pct == 0  # own baselines


def test_moments_dtype_halves_the_moments(rows):
  full, half = rows["zero"], rows["zero_bf16_moments"]
  assert half.moments_dtype == "bfloat16"
  # 4 (master) + 2 + 2: the moments' 8 bytes halved, the master copy untouched.
  assert per_param(half.optimizer_state_bytes) == pytest.approx(8, rel=1e-3)
  assert per_param(full.argument_size_in_bytes - half.argument_size_in_bytes) == pytest.approx(4, rel=0.02)
  # Without a master copy: float32 parameters, bf16 moments: 2 + 2.
  assert per_param(rows["fp32_bf16_moments"].optimizer_state_bytes) == pytest.approx(4, rel=1e-3)
  assert per_param(rows["fp32_bf16_moments"].param_bytes) == pytest.approx(4)


def test_zero_model_state_is_16_bytes_per_parameter(rows):
  """Parameters + gradients + optimizer state, from the compiler: the arguments (params +
  state) and the temp (gradients, activations, logits) hold at least ZeRO's 16 bytes per
  parameter, and the bf16 gradients make the temp smaller than with float32 parameters (same
  bf16 activations, gradients 2 bytes instead of 4). What the CPU compiler adds above 16 on the
  tiny model (float32 copies of bf16 values, the logits) depends on its release: about 20% with
  jax 0.12.0.1, 46% with 0.10.2, so no upper bound is asserted here; 16 within 10% on
  gpt2-small, tpu:v5e-1, is the slow test below."""
  r, fp32 = rows["zero"], rows["fp32"]
  model_state = per_param(r.argument_size_in_bytes + r.temp_size_in_bytes)
  assert model_state >= 16
  assert per_param(r.temp_size_in_bytes) >= 2  # at least the bf16 gradients
  assert r.temp_size_in_bytes < fp32.temp_size_in_bytes


@pytest.mark.slow
@pytest.mark.needs_tpu_compiler
def test_zero_layout_is_16_bytes_per_parameter_on_gpt2_small():
  """The issue's done-when: gpt2-small on tpu:v5e-1 (batch 1 x 128, full remat, so the
  activations are next to nothing): arguments + temp are 16 bytes per parameter within 10%
  (measured 14.01 + 2.16 = 16.17: the temp is the bf16 gradients and 0.16 of activations and
  workspace)."""
  r = sweep.compare(model="gpt2-small", target="tpu:v5e-1", batch=1, seq=128, remat="full",
                    param_dtype="bfloat16", master_dtype="float32")[-1]
  n = count_params(get_config("gpt2-small"))
  assert (r.argument_size_in_bytes + r.temp_size_in_bytes) / n == pytest.approx(16, rel=0.10)
  assert r.argument_size_in_bytes / n == pytest.approx(14, rel=0.01)


def test_estimate_vs_compiler_takes_the_rows_dtypes(rows):
  comps = {c.component: c for c in est.estimate_vs_compiler(rows["zero"])}
  assert comps["params"].ratio == pytest.approx(1.0)
  assert comps["optimizer state"].ratio == pytest.approx(1.0, rel=0.01)
  assert comps["gradients"].compiler_bytes is None and "temp" in comps["gradients"].source
  assert comps["gradients"].estimate_bytes == pytest.approx(2 * N)
  assert "float32 master" in comps["optimizer state"].source
  half = {c.component: c for c in est.estimate_vs_compiler(rows["zero_bf16_moments"])}
  assert half["optimizer state"].ratio == pytest.approx(1.0, rel=0.01)


@pytest.mark.parametrize(
    "optimizer, dtypes, expected",
    [
        ("adamw", dict(param_dtype="bfloat16", master_dtype="float32"), (2, 2, 12)),  # ZeRO sec. 3
        ("adamw", dict(param_dtype="bfloat16", master_dtype="float32", moments_dtype="bfloat16"), (2, 2, 8)),
        ("adamw", dict(param_dtype="bfloat16", master_dtype="float32", grad_reduce_dtype="float32"), (2, 4, 12)),
        ("adamw", dict(), (4, 4, 8)),  # jaxmem's default step
        ("adamw", dict(param_dtype="bfloat16"), (2, 2, 4)),
        ("lion", dict(param_dtype="bfloat16", master_dtype="float32"), (2, 2, 8)),
        ("sgd", dict(param_dtype="bfloat16", master_dtype="float32"), (2, 2, 4)),
    ],
)
def test_layout_bytes_per_param(optimizer, dtypes, expected):
  assert est.layout_bytes_per_param(optimizer, **dtypes) == expected


def test_megatron_distributed_optimizer_is_6_plus_12_over_d():
  e = est.estimate(model="gpt2-small", param_dtype="bfloat16", master_dtype="float32", grad_reduce_dtype="float32", data=8)
  assert e.bytes_per_param == 18  # Megatron's non-distributed "bf16 param, fp32 grads"
  assert e.distributed_bytes_per_param == pytest.approx(6 + 12 / 8)
  assert (e.param_dtype, e.gradient_dtype, e.master_dtype, e.moments_dtype) == ("bfloat16", "float32", "float32", "float32")
  assert est.estimate(model="gpt2-small").bytes_per_param == 16  # the mixed preset: unchanged


@pytest.mark.parametrize(
    "fields, words",
    [
        (dict(master_dtype="float32"), "not wider than the parameters' float32"),
        (dict(param_dtype="bfloat16", master_dtype="bfloat16"), "not wider"),
        (dict(master_dtype="fp32"), "unknown `master_dtype` 'fp32'"),
        (dict(moments_dtype="bf16"), "unknown `moments_dtype`"),
        (dict(grad_reduce_dtype="int8"), "unknown `grad_reduce_dtype`"),
        (dict(moments_dtype="bfloat16", optimizer="sgd"), "sgd keeps no moments"),
        (dict(moments_dtype="bfloat16", optimizer="adamw,adafactor"), "adafactor does not take one"),
        (dict(moments_dtype="float32", optimizer="adamw_bf16"), "fixes its moments at bfloat16"),
    ],
)
def test_bad_precision_is_one_line(fields, words):
  with pytest.raises(JaxmemError, match=words) as e:
    plan(**{**TINY, **fields})
  assert "\n" not in str(e.value)


def test_a_step_factory_refuses_the_precision_fields():
  with pytest.raises(JaxmemError, match="`master_dtype` applies to jaxmem's own models"):
    plan(step="tests/test_user_step.py:make_step", target="cpu", master_dtype="float32")


def test_cache_key_has_the_precision_fields():
  keys = {plan(**TINY, **kw).tasks()[0].cache_key() for kw in LAYOUTS.values()}
  assert len(keys) == len(LAYOUTS)


@pytest.mark.needs_tpu_compiler
def test_grad_reduce_dtype_sets_the_reduction_bytes():
  """Over data=8 on a TPU target the gradients are all-reduced in ``grad_reduce_dtype`` where the
  compiler forms them so: bf16 takes the float32 model's embedding and norm gradients down to
  bf16 (measured: 14% fewer all-reduce bytes); float32 beside bf16 parameters brings them back
  (the slow test below). The matmul weights' gradients are bf16 products the compiler reduces before widening, in
  every case (hence the note)."""
  tpu = dict(TINY, target="tpu:v5e-8", mesh="data=8", batch=8)

  def reduced(**kw):
    r = sweep.compare(**tpu, **kw)[0]
    assert r.error is None and r.comm_all_reduce_bytes
    return r, r.comm_all_reduce_bytes

  default, f32_params = reduced()
  bf16, bf16_reduce = reduced(grad_reduce_dtype="bfloat16")
  assert bf16.grad_reduce_dtype == "bfloat16" and default.grad_reduce_dtype is None
  assert bf16_reduce < 0.95 * f32_params
  assert not any("may reduce" in n for n in bf16.notes)


@pytest.mark.slow  # two more TPU compiles over data=8; the narrowing direction is held above
@pytest.mark.needs_tpu_compiler
def test_a_float32_grad_reduce_beside_bf16_parameters_widens_the_reduction():
  tpu = dict(TINY, target="tpu:v5e-8", mesh="data=8", batch=8)
  bf16_params = sweep.compare(**tpu, param_dtype="bfloat16")[0]
  wide = sweep.compare(**tpu, param_dtype="bfloat16", grad_reduce_dtype="float32")[0]
  assert bf16_params.error is None and wide.error is None
  assert wide.comm_all_reduce_bytes > bf16_params.comm_all_reduce_bytes
  assert any("may reduce" in n for n in wide.notes)


def test_compare_cli_with_estimate_shows_the_layout(capsys):
  from jaxmem.cli import main

  argv = ["compare", "--model", "tiny", "--batch", "2", "--seq", "16", "--remat", "none", "--target", "cpu",
          "--param-dtype", "bfloat16", "--master-dtype", "float32", "--with-estimate", "--format", "json"]
  assert main(argv) == 0  # the zero layout's row: from the session's cache where `rows` compiled it
  doc = json.loads(capsys.readouterr().out)
  (row,) = doc["rows"]
  assert (row["master_dtype"], row["moments_dtype"], row["grad_reduce_dtype"]) == ("float32", "float32", None)
  comps = {c["component"]: c for c in doc["estimate"]}
  assert comps["optimizer state"]["ratio"] == pytest.approx(1.0, rel=0.01)
  assert main([*argv[:-2], "--optimizer", "sgd", "--moments-dtype", "bfloat16"]) == 2
  assert "--moments-dtype applies to" in capsys.readouterr().err


def test_the_master_copy_is_what_the_step_updates():
  """One real step of the ZeRO layout: the float32 master moves, the bf16 parameters are the
  master cast down (not bf16 arithmetic on the update), and the moments are float32."""
  import jax
  import jax.numpy as jnp

  from jaxmem.program.precision import MasterState
  from jaxmem.program.train import build_train_program

  p = plan(**TINY, **LAYOUTS["zero"])
  mesh, opt, rp = p.configs()[0]
  prog = build_train_program(p.cfg, remat=rp, optimizer=opt, batch=2, seq=16, target=p.target, mesh=mesh,
                             options=p.options())
  params, state, tokens, targets = prog.concrete_args()
  assert isinstance(state, MasterState)
  before = jax.tree.map(lambda m: m.copy(), state.master)
  new_params, new_state, loss = jax.jit(prog.step)(params, state, tokens, targets)
  assert jnp.isfinite(loss)
  for m0, m1, p1 in zip(jax.tree.leaves(before), jax.tree.leaves(new_state.master), jax.tree.leaves(new_params), strict=True):
    assert m1.dtype == jnp.float32 and p1.dtype == jnp.bfloat16
    assert jnp.array_equal(p1, m1.astype(jnp.bfloat16))
  moved = sum(float(jnp.abs(m1 - m0).sum()) for m0, m1 in zip(jax.tree.leaves(before), jax.tree.leaves(new_state.master)))
  assert moved > 0
  assert {str(x.dtype) for x in jax.tree.leaves(new_state.inner) if x.ndim} == {"float32"}
