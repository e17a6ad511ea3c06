"""The train step sweep: relationships the seeds predict, read from the compiler."""

import dataclasses

import pytest

from jaxmem.hardware.tpu import tpu_compiler_available
from jaxmem.errors import JaxmemError
from jaxmem.models import get_config
from jaxmem.planning import sweep as cmp
from jaxmem.cache import RowCache
from jaxmem.resolve import plan
from jaxmem.program import optimizers, remat

# Tiny but with enough sequence that activations, not workspace, dominate the temporaries.
SMALL = get_config("tiny", num_layers=4, d_model=128, d_ff=512, num_heads=4, num_kv_heads=2, head_dim=32)
WORK = dict(model=SMALL, batch=4, seq=128)


def _by(rows, key="remat"):
  return {getattr(r, key): r for r in rows}


@pytest.fixture(scope="module")
def rows_cache(tmp_path_factory):
  """One row cache for this module's sweeps: a configuration two of them share compiles once."""
  return RowCache(tmp_path_factory.mktemp("rows"))


@pytest.fixture(scope="module")
def remat_rows(rows_cache):
  return _by(cmp.compare(**WORK, remat="dots_saveable,full", optimizer="adamw", cache=rows_cache))


def test_temp_falls_with_stronger_remat(remat_rows):
  none, dots, full = remat_rows["none"], remat_rows["dots_saveable"], remat_rows["full"]
  assert none.temp_size_in_bytes >= dots.temp_size_in_bytes >= full.temp_size_in_bytes
  assert none.temp_size_in_bytes > full.temp_size_in_bytes  # remat must save something here


def test_remat_moves_only_temporaries(remat_rows):
  args = {r.argument_size_in_bytes for r in remat_rows.values()}
  assert len(args) == 1  # params + optimizer state + batch do not depend on the policy


def test_full_remat_costs_flops(remat_rows):
  assert remat_rows["none"].recompute_overhead_pct == 0
  assert remat_rows["full"].recompute_overhead_pct > 0
  assert remat_rows["full"].flops > remat_rows["none"].flops


def test_row_fields_and_argument_accounting(remat_rows):
  r = remat_rows["none"]
  assert r.error is None and r.capacity_bytes is None and r.fits is None
  assert r.peak_memory_in_bytes is None  # CPU gives no peak: null, with a note
  assert any("peak_memory_in_bytes" in n for n in r.notes)
  tokens = 2 * WORK["batch"] * WORK["seq"] * 4  # int32 inputs and targets
  assert r.argument_size_in_bytes == r.param_bytes + r.optimizer_state_bytes + tokens
  assert r.total_bytes == r.argument_size_in_bytes + r.output_size_in_bytes - r.alias_size_in_bytes + r.temp_size_in_bytes
  # Parameters and optimizer state are donated: their outputs reuse the input buffers.
  assert r.alias_size_in_bytes >= r.param_bytes + r.optimizer_state_bytes - 64
  d = r.as_dict()
  for key in ("model", "target", "mesh", "remat", "optimizer", "batch", "seq", "error", "capacity_bytes", "fits"):
    assert key in d


@pytest.fixture(scope="module")
def opt_rows(rows_cache):
  # adamw without remat is remat_rows' baseline: answered from the cache where both run.
  return _by(cmp.compare(**WORK, remat="none", optimizer="sgd,adamw,adamw_bf16,adafactor", cache=rows_cache), "optimizer")


def test_adamw_minus_sgd_is_two_fp32_copies_of_params(opt_rows):
  sgd, adamw = opt_rows["sgd"], opt_rows["adamw"]
  diff = adamw.argument_size_in_bytes - sgd.argument_size_in_bytes
  assert sgd.param_bytes == adamw.param_bytes
  assert abs(diff - 2 * adamw.param_bytes) <= 16  # + Adam's step count
  assert sgd.optimizer_state_bytes <= 16


def test_bf16_moments_halve_adamw_state(opt_rows):
  assert abs(opt_rows["adamw_bf16"].optimizer_state_bytes * 2 - opt_rows["adamw"].optimizer_state_bytes) <= 32


def test_adafactor_state_far_below_adamw(opt_rows):
  assert opt_rows["adafactor"].optimizer_state_bytes < 0.2 * opt_rows["adamw"].optimizer_state_bytes


# The registries compile for a TPU where libtpu is installed: a tiny step compiles there in about
# 1 s against 3-4 s for the host CPU, and the offload policies get the host memory space they
# name (XLA:CPU may refuse it). Without libtpu they compile for the CPU.
REGISTRY_TARGET = "tpu:v5e-1" if tpu_compiler_available()[0] else "cpu"


# A registry entry's one configuration: tiny shapes, no baseline row beside it.
REGISTRY_WORK = dict(batch=2, seq=16, target=REGISTRY_TARGET)


# One of each kind of state compiles in the fast suite: none, two moments, bf16 moments and
# factored in opt_rows above (the host CPU's compiler), one moment and per-matrix here; the rest
# of the registry here with the slow tests (benchmarks/slow_tests.sh). Every optimizer's update
# is traced below either way.
COMPILED_OPTIMIZERS = ("lion", "muon")


@pytest.mark.parametrize(
    "name", [n if n in COMPILED_OPTIMIZERS else pytest.param(n, marks=pytest.mark.slow) for n in optimizers.OPTIMIZERS]
)
def test_every_optimizer_compiles(name, compile_one):
  row = compile_one(**REGISTRY_WORK, model="tiny", remat="none", optimizer=name)
  assert row.optimizer == name
  assert row.error is None and row.argument_size_in_bytes >= row.param_bytes + row.optimizer_state_bytes


@pytest.mark.parametrize("name", list(optimizers.OPTIMIZERS))
def test_every_optimizer_traces_an_update_of_the_model(name):
  import jax
  import optax

  from jaxmem.program.train import abstract_model

  _, params, _ = abstract_model(get_config("tiny"))
  tx = optimizers.OPTIMIZERS[name].build(1e-3)
  state = jax.eval_shape(tx.init, params)
  new_params = jax.eval_shape(lambda p, s: optax.apply_updates(p, tx.update(p, s, p)[0]), params, state)
  # The update keeps every parameter's shape and dtype (what the compiled step's donation needs).
  assert jax.tree.map(lambda a: (a.shape, a.dtype), new_params) == jax.tree.map(lambda a: (a.shape, a.dtype), params)


# One policy of each kind compiles in the fast suite: recompute all and save by primitive in
# remat_rows above, and here save all, save by name, MaxText's minimal, the attention core and
# offload to the host; the rest here with the slow tests.
COMPILED_POLICIES = ("everything_saveable", "save_qkv_proj", "minimal", "selective", "full_offloaded")


@pytest.mark.parametrize(
    "name",
    [n if n in COMPILED_POLICIES else pytest.param(n, marks=pytest.mark.slow)
     for n, p in remat.REMAT_POLICIES.items() if p.alias_of is None and n != "none"],
)
def test_every_remat_policy_compiles(name, compile_one):
  row = compile_one(**REGISTRY_WORK, model="tiny-gpt2", remat=name, optimizer="sgd")
  assert row.remat == name
  if remat.REMAT_POLICIES[name].needs_host_memory and REGISTRY_TARGET == "cpu":
    return  # the CPU backend may refuse host offload; that is then an error row, not a crash
  assert row.error is None and row.temp_size_in_bytes is not None


def test_fsdp_divides_param_and_optimizer_bytes(rows_cache):
  rows = cmp.compare(**WORK, target="cpu:4", remat="none", optimizer="adamw", mesh=["data=4", "fsdp=4"], cache=rows_cache)
  by = _by(rows, "mesh")
  dp, fsdp = by["data=4"], by["fsdp=4"]
  assert fsdp.param_bytes < dp.param_bytes / 3  # ~1/4, small unsharded vectors aside
  assert fsdp.optimizer_state_bytes < dp.optimizer_state_bytes / 3
  assert fsdp.argument_size_in_bytes < dp.argument_size_in_bytes / 3
  # ... and the memory saved comes back as communication: FSDP gathers weights every step.
  assert dp.comm_all_reduce_bytes > 0  # gradients
  assert fsdp.comm_bytes > dp.comm_bytes


def test_single_device_sends_nothing(remat_rows):
  assert remat_rows["none"].comm_bytes == 0


def test_tensor_parallel_shards_weights(rows_cache):
  # adamw, as above: data=4 comes from the cache where the FSDP test ran first.
  rows = cmp.compare(**WORK, target="cpu:4", remat="none", optimizer="adamw", mesh=["data=4", "tensor=2,data=2"], cache=rows_cache)
  by = _by(rows, "mesh")
  assert by["tensor=2,data=2"].param_bytes < 0.7 * by["data=4"].param_bytes


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(model="gpt5"), "unknown model"),
        (dict(remat="dots"), "unknown remat policy"),
        (dict(optimizer="adamm"), "unknown optimizer"),
        (dict(target="cpu:4", mesh="data=2"), "has 2 devices but target cpu:4 has 4"),
        (dict(target="cpu:4", mesh="data=4", batch=6), "not divisible"),
        (dict(batch=0), "at least 1"),
        (dict(target="cpu:2", mesh="tensor=2", model="tiny-gpt2", batch=2), None),
    ],
)
def test_bad_input_is_refused_before_compiling(kwargs, match):
  base = dict(model="tiny", batch=2, seq=16)
  base.update(kwargs)
  if match is None:
    plan(**base)  # valid
    return
  with pytest.raises(JaxmemError, match=match):
    plan(**base)


def test_indivisible_weight_axis_is_an_error():
  cfg = dataclasses.replace(SMALL, vocab_size=255)
  with pytest.raises(JaxmemError, match="not divisible"):
    cmp.compare(model=cfg, batch=2, seq=16, target="cpu:2", mesh="tensor=2", remat="none")
