"""jaxmem.models: preset sizes, the forward/backward math under remat, and the name vocabularies."""

from __future__ import annotations

import contextlib
import io
import math
import re

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

from jaxmem.errors import JaxmemError
from jaxmem.models import (
  ACTIVATION_AXES,
  CHECKPOINT_NAMES,
  DENSE_CHECKPOINT_NAMES,
  LOGICAL_AXES,
  PRESETS,
  ModelConfig,
  Transformer,
  count_params,
  get_config,
)

policies = jax.checkpoint_policies

# Published parameter counts: GPT-2 paper / released checkpoints; Llama 3 paper table 3 and
# the Llama 3.2 model cards.
PUBLISHED = {
  "gpt2-small": 124e6,
  "gpt2-medium": 355e6,
  "gpt2-large": 774e6,
  "gpt2-xl": 1.56e9,
  "llama3-1b": 1.24e9,
  "llama3-3b": 3.21e9,
  "llama3-8b": 8.03e9,
  "llama3-70b": 70.6e9,
  "llama3-405b": 405.9e9,
}

TINY = ("tiny", "tiny-gpt2")
REMATS = {
  "none": None,
  "nothing_saveable": policies.nothing_saveable,
  "dots_saveable": policies.dots_saveable,
  "save_query_proj": policies.save_only_these_names("query_proj"),
}


def abstract_params(cfg: ModelConfig) -> nnx.State:
  """The model's parameters as shapes only: nothing is allocated, so 405B is fine."""
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  return nnx.state(model, nnx.Param)


def tokens(cfg: ModelConfig, batch: int = 2, seq: int = 8) -> jax.Array:
  return jax.random.randint(jax.random.key(1), (batch, seq), 0, cfg.vocab_size, dtype=jnp.int32)


def loss_fn(graphdef, tokens_bt, remat):
  def loss(params):
    logits_btv = nnx.merge(graphdef, params)(tokens_bt[:, :-1], remat=remat)
    return optax.softmax_cross_entropy_with_integer_labels(logits_btv, tokens_bt[:, 1:]).mean()

  return loss


def scan_residual_shapes(loss, params) -> list[str]:
  """Shapes of what the backward pass saves from the scanned blocks, e.g. 'bf16[2,2,8,4,16]'."""
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    jax.ad_checkpoint.print_saved_residuals(loss, params)
  return sorted(line.split()[0] for line in out.getvalue().splitlines() if "output of scan" in line)


def count_eqns(jaxpr) -> int:
  """Equations in a jaxpr, including those in nested jaxprs (scan bodies, remat, jit)."""
  total = 0
  for eqn in jaxpr.eqns:
    total += 1
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          total += count_eqns(inner)
  return total


# --- configs and sizes -------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_param_count_matches_model_and_publication(name):
  cfg = get_config(name)
  assert cfg.name == name
  built = sum(math.prod(x.shape) for x in jax.tree.leaves(abstract_params(cfg)))
  assert built == count_params(cfg)
  if name in PUBLISHED:
    assert abs(built / PUBLISHED[name] - 1) < 0.01, (name, built)


def test_presets_have_classmethods():
  assert ModelConfig.tiny() == get_config("tiny")
  assert ModelConfig.llama3_405b() == get_config("llama3-405b")
  assert ModelConfig.gpt2_xl().style == "gpt2"


def test_get_config_unknown_name_lists_presets():
  with pytest.raises(JaxmemError) as err:
    get_config("nope")
  msg = str(err.value)
  assert "\n" not in msg and "nope" in msg
  assert all(name in msg for name in PRESETS)


def test_get_config_overrides():
  cfg = get_config("llama3-8b", param_dtype="bfloat16", num_layers=4)
  assert cfg.param_dtype == "bfloat16" and cfg.num_layers == 4 and cfg.d_model == 4096
  with pytest.raises(JaxmemError, match="num_layer"):
    get_config("tiny", num_layer=4)
  with pytest.raises(JaxmemError, match="num_kv_heads"):
    get_config("tiny", num_kv_heads=3)
  with pytest.raises(JaxmemError, match="dtype"):
    get_config("tiny", dtype="int8")


# --- forward and backward ----------------------------------------------------------------------


@pytest.fixture(scope="module", params=TINY)
def tiny(request):
  """(cfg, graphdef, params, jitted forward) per tiny style, shared so each compiles once."""
  cfg = get_config(request.param)
  graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param)
  forward = jax.jit(lambda p, t: nnx.merge(graphdef, p)(t))
  return cfg, graphdef, params, forward


def test_forward_shape_and_dtype(tiny):
  cfg, _, params, forward = tiny
  logits = forward(params, tokens(cfg, batch=2, seq=8))
  assert logits.shape == (2, 8, cfg.vocab_size)
  assert logits.dtype == jnp.float32
  assert bool(jnp.all(jnp.isfinite(logits)))


def test_causal(tiny):
  cfg, _, params, forward = tiny
  toks = tokens(cfg, batch=2, seq=8)
  changed = toks.at[:, 5].set((toks[:, 5] + 1) % cfg.vocab_size)
  a, b = forward(params, toks), forward(params, changed)
  assert jnp.array_equal(a[:, :5], b[:, :5])
  assert not jnp.allclose(a[:, 5:], b[:, 5:])


def all_losses_and_grads(cfg, remats, seq=17):
  """value_and_grad under each remat policy, in one jit so XLA compiles once (CPU compiles are slow)."""
  graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param)
  toks = tokens(cfg, seq=seq)
  run = jax.jit(lambda p: {key: jax.value_and_grad(loss_fn(graphdef, toks, r))(p) for key, r in remats.items()})
  return run(params)


@pytest.mark.parametrize("name", TINY)
def test_remat_does_not_change_loss_or_grads(name):
  # float32 compute so that any real difference stands out (bf16 is checked below): remat
  # only changes what is saved for the backward pass, never the values.
  results = all_losses_and_grads(get_config(name, dtype="float32"), REMATS)
  base_loss, base_grads = results.pop("none")
  assert math.isfinite(float(base_loss))
  for key, (loss, grads) in results.items():
    assert jnp.allclose(loss, base_loss, rtol=1e-6), key
    for g, b in zip(jax.tree.leaves(grads), jax.tree.leaves(base_grads), strict=True):
      assert jnp.allclose(g, b, rtol=1e-5, atol=1e-7), key


def test_remat_does_not_change_loss_or_grads_bf16():
  remats = {k: REMATS[k] for k in ("none", "nothing_saveable")}
  results = all_losses_and_grads(get_config("tiny"), remats)
  (base_loss, base_grads), (loss, grads) = results["none"], results["nothing_saveable"]
  assert jnp.allclose(loss, base_loss, rtol=1e-3)
  for g, b in zip(jax.tree.leaves(grads), jax.tree.leaves(base_grads), strict=True):
    assert jnp.allclose(g, b, rtol=2e-2, atol=1e-4)


def test_remat_none_means_no_checkpoint(tiny):
  cfg, graphdef, params, _ = tiny
  toks = tokens(cfg)

  def has_checkpoint(remat):
    text = str(jax.make_jaxpr(jax.grad(loss_fn(graphdef, toks, remat)))(params))
    return "remat" in text or "checkpoint[" in text

  assert not has_checkpoint(None)
  assert has_checkpoint(policies.nothing_saveable)


def test_param_and_compute_dtypes():
  cfg = get_config("tiny", param_dtype="bfloat16", dtype="float32")
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  assert {x.dtype for x in jax.tree.leaves(nnx.state(model, nnx.Param))} == {jnp.dtype(jnp.bfloat16)}
  graphdef, params = nnx.split(model, nnx.Param)
  forward = lambda p, t: nnx.merge(graphdef, p)(t)
  toks = jax.ShapeDtypeStruct((2, 8), jnp.int32)
  assert jax.eval_shape(forward, params, toks).dtype == jnp.float32
  # Compute in float32: bf16 weights are cast before every matmul.
  text = str(jax.make_jaxpr(forward)(params, toks))
  assert "dot_general" in text and not re.search(r"bf16\[[\d,]*\] = dot_general", text)


def test_gpt2_rejects_sequences_longer_than_its_position_table():
  cfg = get_config("tiny-gpt2", max_seq_len=8)
  graphdef, params = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))), nnx.Param)
  forward = lambda p, t: nnx.merge(graphdef, p)(t)
  assert jax.eval_shape(forward, params, tokens(cfg, seq=8)).shape == (2, 8, cfg.vocab_size)
  with pytest.raises(JaxmemError, match="max_seq_len"):
    jax.eval_shape(forward, params, tokens(cfg, seq=9))


def test_layers_are_scanned_not_unrolled():
  # The traced program must not grow with depth: one scan body whatever num_layers is.
  def num_eqns(num_layers):
    cfg = get_config("tiny", num_layers=num_layers)
    model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    graphdef, params = nnx.split(model, nnx.Param)
    toks = jax.ShapeDtypeStruct((2, 8), jnp.int32)
    loss = lambda p, t: nnx.merge(graphdef, p)(t).mean()
    return count_eqns(jax.make_jaxpr(jax.grad(loss))(params, toks).jaxpr)

  assert num_eqns(80) == num_eqns(2)


# --- names -------------------------------------------------------------------------------------


def test_checkpoint_names_in_gradient_jaxpr(tiny):
  cfg, graphdef, params, _ = tiny
  for remat in (None, policies.nothing_saveable):
    text = str(jax.make_jaxpr(jax.grad(loss_fn(graphdef, tokens(cfg), remat)))(params))
    found = set(re.findall(r"name=(\w+)", text))
    # A dense model tags the dense vocabulary (the MoE and MLA names are tested in test_moe and
    # test_mla); GPT-2's GELU MLP has one input projection (mlpwi_0): mlpwi_1 is SwiGLU's only.
    want = set(DENSE_CHECKPOINT_NAMES) - ({"mlpwi_1"} if cfg.style == "gpt2" else set())
    assert want <= found, want - found
    assert cfg.style == "llama3" or "mlpwi_1" not in found


def test_checkpoint_names_are_what_a_policy_saves(tiny):
  """save_only_these_names(n) saves exactly one extra stacked [layers, ...] residual of n's shape."""
  cfg, graphdef, params, _ = tiny
  b, t = 2, 8
  toks = tokens(cfg, batch=b, seq=t + 1)
  l, n, k, h, d, f = cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.d_model, cfg.d_ff
  expected = {
    "query_proj": (l, b, t, n, h),
    "key_proj": (l, b, t, k, h),
    "value_proj": (l, b, t, k, h),
    "context": (l, b, t, n, h),
    "out_proj": (l, b, t, d),
    "mlpwi": (l, b, t, f),
    # SwiGLU's gate and up projections, each saved alone; GPT-2's one input projection (before
    # GELU) is mlpwi_0, and it has no mlpwi_1.
    "mlpwi_0": (l, b, t, f),
    "mlpwi_1": None if cfg.style == "gpt2" else (l, b, t, f),
    # Nothing later in the block needs the MLP output (it only feeds the residual add), so
    # saving it adds no residual: the name is there for policies, not because saving helps.
    "mlpwo": None,
  }
  assert set(expected) == set(DENSE_CHECKPOINT_NAMES) <= set(CHECKPOINT_NAMES)
  baseline = scan_residual_shapes(loss_fn(graphdef, toks, policies.nothing_saveable), params)
  for cp_name, shape in expected.items():
    saved = scan_residual_shapes(loss_fn(graphdef, toks, policies.save_only_these_names(cp_name)), params)
    extra = list(saved)
    for s in baseline:
      extra.remove(s)
    want = [] if shape is None else ["bf16[" + ",".join(map(str, shape)) + "]"]
    assert extra == want, (cp_name, extra)


@pytest.mark.parametrize("name", ["tiny", "tiny-gpt2", "llama3-8b", "gpt2-small"])
def test_every_param_has_a_full_logical_spec(name):
  cfg = get_config(name)
  params = abstract_params(cfg)
  specs = nnx.get_partition_spec(params)
  flat_params = jax.tree_util.tree_leaves_with_path(params)
  flat_specs = jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
  assert len(flat_params) == len(flat_specs) > 0
  for (path, leaf), spec in zip(flat_params, flat_specs):
    where = jax.tree_util.keystr(path)
    assert len(spec) == len(leaf.shape), where
    assert all(axis in LOGICAL_AXES for axis in spec), (where, spec)
    assert ("blocks" in where) == (spec[0] == "layers"), (where, spec)
    if "blocks" in where:
      assert leaf.shape[0] == cfg.num_layers, where


def test_constrain_hook_sees_named_activations(tiny):
  cfg, graphdef, params, _ = tiny
  seen = []

  def constrain(x, axes):
    assert len(axes) == x.ndim, (axes, x.shape)
    seen.append(tuple(axes))
    return x

  # Tracing is enough to see every call; nothing needs to compile.
  jax.eval_shape(lambda p, t: nnx.merge(graphdef, p)(t, constrain=constrain), params, tokens(cfg))
  assert {a for axes in seen for a in axes} <= set(LOGICAL_AXES) | set(ACTIVATION_AXES)
  for axes in [
    ("batch", "seq", "embed"),
    ("batch", "seq", "heads", "head_dim"),
    ("batch", "seq", "kv_heads", "head_dim"),
    ("batch", "seq", "mlp"),
    ("batch", "seq", "vocab"),
  ]:
    assert axes in seen, axes
