"""Mixture-of-experts models: routing, both expert implementations, presets, names, sharding."""

from __future__ import annotations

import contextlib
import functools
import io
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxmem.errors import JaxmemError
from jaxmem.models import (
  CHECKPOINT_NAMES,
  LOGICAL_AXES,
  MOE_CHECKPOINT_NAMES,
  KVCache,
  StepChoices,
  Transformer,
  count_active_params,
  count_params,
  dropless_experts,
  expert_capacity,
  get_config,
)
from jaxmem.models.layers import DEFAULT_INIT, no_constraint
from jaxmem.models.moe import MoE, select_experts

# Published (total, active) parameters: Mixtral paper section 2 and its model cards; the
# Qwen3-30B-A3B model card; DeepSeek-V3 README_WEIGHTS.md (main model without the MTP module).
PUBLISHED = {
  "mixtral-8x7b": (46.7e9, 12.9e9),
  "mixtral-8x22b": (141e9, 39e9),
  "qwen3-30b-a3b": (30.5e9, 3.3e9),
  "deepseek-v3": (671e9, 37e9),
}
IMPLS = ("dropless", "capacity")


def built_params(cfg) -> nnx.State:
  return nnx.state(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))), nnx.Param)


def choosing(impl: str, **more) -> StepChoices:
  return StepChoices(moe_impl=impl, **more)


def random_like(abstract, seed: int = 0):
  """Values for an abstract parameter tree from numpy's generator: norm scales near 1, weights
  N(0, 0.05). Initialising through the model would compile its threefry random program, which
  takes XLA's CPU compiler seconds; what the values are does not matter to these tests."""
  rng = np.random.default_rng(seed)

  def one(path, a):
    z = rng.standard_normal(a.shape)
    near_one = "norm" in jax.tree_util.keystr(path) or "scale" in jax.tree_util.keystr(path)
    return jnp.asarray(1 + 0.1 * z if near_one else 0.05 * z, a.dtype)

  return jax.tree_util.tree_map_with_path(one, abstract)


def init_model(cfg, choices: StepChoices | None = None) -> tuple:
  """(graphdef, parameters) of Transformer(cfg, choices=choices)."""
  graphdef, abstract = nnx.split(
    nnx.eval_shape(lambda: Transformer(cfg, choices=choices, rngs=nnx.Rngs(0))), nnx.Param
  )
  return graphdef, random_like(abstract)


def normal(shape, seed: int) -> jax.Array:
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def random_tokens(cfg, shape, seed: int) -> jax.Array:
  return jnp.asarray(np.random.default_rng(seed).integers(0, cfg.vocab_size, shape), jnp.int32)


def numel(tree) -> int:
  return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))


# --- presets and counts ------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_presets_match_published_total_and_active(name):
  cfg = get_config(name)
  total, active = count_params(cfg), count_active_params(cfg)
  assert numel(built_params(cfg)) == total
  pub_total, pub_active = PUBLISHED[name]
  assert abs(total / pub_total - 1) < 0.01, (name, total)
  # Active figures are published to two digits ("3.3B", "37B"): within 2%.
  assert abs(active / pub_active - 1) < 0.02, (name, active)
  assert active < total / 3


@pytest.mark.parametrize("name", ["tiny-moe", "tiny-mla"])
def test_active_params_leave_out_unchosen_experts_of_the_built_model(name):
  cfg = get_config(name)
  params = built_params(cfg)
  leaves = jax.tree_util.tree_leaves_with_path(params)
  routed = numel([v for path, v in leaves if re.search(r"w_(gate|up|down)_e", jax.tree_util.keystr(path))])
  assert routed == cfg.num_moe_layers * cfg.num_experts * 3 * cfg.d_model * cfg.expert_d_ff
  unchosen = routed * (cfg.num_experts - cfg.experts_per_token) // cfg.num_experts
  assert count_active_params(cfg) == numel(params) - unchosen
  dense = get_config("tiny")
  assert count_active_params(dense) == count_params(dense)


@pytest.mark.parametrize(
  "overrides, match",
  [
    ({"experts_per_token": 9}, "experts_per_token"),
    ({"expert_d_ff": 0}, "expert_d_ff"),
    ({"first_dense_layers": 2}, "first_dense_layers"),
    ({"router_scoring": "relu"}, "router_scoring"),
    ({"expert_groups": 3}, "expert_groups"),
    ({"style": "gpt2"}, "llama3"),
  ],
)
def test_bad_moe_fields_are_one_line_errors(overrides, match):
  with pytest.raises(JaxmemError, match=match) as err:
    get_config("tiny-moe", **overrides)
  assert "\n" not in str(err.value)


@pytest.mark.parametrize(
  "choices, match",
  [({"moe_impl": "dense"}, "moe_impl"), ({"capacity_factor": 0.0}, "capacity_factor"), ({"dropout": 1.0}, "dropout")],
)
def test_bad_step_choices_are_one_line_errors(choices, match):
  with pytest.raises(JaxmemError, match=match) as err:
    StepChoices(**choices)
  assert "\n" not in str(err.value)
  # Not the model's fields: a config override names them as the step's.
  with pytest.raises(JaxmemError, match=f"{next(iter(choices))}: how a step runs the model") as err:
    get_config("tiny-moe", **choices)
  assert "\n" not in str(err.value)


def test_dense_prefix_and_moe_layers_are_separate_scans():
  def scan_lengths(name, **overrides):
    cfg = get_config(name, **overrides)
    graphdef, params = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))), nnx.Param)
    jaxpr = jax.make_jaxpr(lambda p, t: nnx.merge(graphdef, p)(t))(params, jax.ShapeDtypeStruct((2, 8), jnp.int32))
    return [e.params["length"] for e in jaxpr.jaxpr.eqns if e.primitive.name == "scan"]

  assert scan_lengths("tiny") == [2]
  assert scan_lengths("tiny-moe") == [2]
  assert scan_lengths("tiny-mla") == [1, 2]  # first_dense_layers=1, then 2 MoE layers
  assert scan_lengths("tiny-mla", num_layers=40, first_dense_layers=3) == [3, 37]


@pytest.mark.parametrize("name", ["tiny-moe", "tiny-mla", "mixtral-8x7b", "deepseek-v3"])
def test_every_param_has_a_full_logical_spec(name):
  cfg = get_config(name)
  params = built_params(cfg)
  specs = jax.tree.leaves(nnx.get_partition_spec(params), is_leaf=lambda x: isinstance(x, P))
  flat = jax.tree_util.tree_leaves_with_path(params)
  assert len(flat) == len(specs) > 0
  expert_weights = 0
  for (path, leaf), spec in zip(flat, specs, strict=True):
    where = jax.tree_util.keystr(path)
    assert len(spec) == len(leaf.shape) and all(a in LOGICAL_AXES for a in spec), (where, spec)
    assert ("blocks" in where) == (spec[0] == "layers"), (where, spec)
    if "moe_blocks" in where:
      assert leaf.shape[0] == cfg.num_moe_layers, where
    if re.search(r"w_(gate|up|down)_e", where):
      assert spec[1] == "exp" and leaf.shape[1] == cfg.num_experts, (where, spec)
      expert_weights += 1
  assert expert_weights == 3


# --- the router --------------------------------------------------------------------------------


def reference_route(logits_e, *, k, scoring, norm_topk, scaling, bias_e=None, groups=1, groups_per_token=1):
  """One token's (weights, experts) written out as Mixtral's and DeepSeek-V3's Gate describe."""
  logits_e = np.asarray(logits_e, np.float64)
  if scoring == "softmax":
    s = np.exp(logits_e - logits_e.max()) / np.exp(logits_e - logits_e.max()).sum()
  else:
    s = 1 / (1 + np.exp(-logits_e))
  choice = s + (0 if bias_e is None else np.asarray(bias_e, np.float64))
  if groups > 1:
    per = choice.reshape(groups, -1)
    rank = np.sort(per, axis=1)[:, ::-1]
    group_score = rank[:, :2].sum(1) if bias_e is not None else rank[:, 0]
    best = np.argsort(-group_score)[:groups_per_token]
    mask = np.zeros(groups, bool)
    mask[best] = True
    choice = np.where(np.repeat(mask, per.shape[1]), choice, -np.inf)
  experts = np.argsort(-choice)[:k]
  w = s[experts]
  if norm_topk:
    w = w / w.sum()
  return w * scaling, experts


def test_softmax_router_is_mixtrals_softmax_over_the_top_k_logits():
  logits = normal((2, 5, 8), 0)
  weights, experts = select_experts(logits, k=2, scoring="softmax")
  top_logits, top_experts = jax.lax.top_k(logits, 2)
  assert jnp.array_equal(experts, top_experts)
  assert jnp.allclose(weights, jax.nn.softmax(top_logits, axis=-1), atol=1e-6)
  # Without renormalising (DeepSeek-V2, Qwen1.5-MoE) the weights are the raw softmax scores.
  raw, _ = select_experts(logits, k=2, scoring="softmax", norm_topk=False)
  assert bool(jnp.all(jnp.sum(raw, -1) < 1.0))


def test_sigmoid_router_with_groups_and_bias_matches_deepseek_gate():
  logits = normal((3, 7, 16), 1)
  bias = 0.3 * normal((16,), 2)
  kw = dict(k=4, scoring="sigmoid", norm_topk=True, scaling=2.5, groups=4, groups_per_token=2)
  weights, experts = select_experts(logits, bias_e=bias, **kw)
  no_bias_weights, no_bias_experts = select_experts(logits, **kw)
  for b in range(3):
    for t in range(7):
      w_ref, e_ref = reference_route(logits[b, t], bias_e=bias, **kw)
      assert np.array_equal(np.asarray(experts[b, t]), e_ref)
      assert np.allclose(np.asarray(weights[b, t]), w_ref, rtol=1e-5)
      # Group-limited: the 4 chosen experts come from at most 2 of the 4 groups.
      assert len(set(np.asarray(experts[b, t]) // 4)) <= 2
  assert np.allclose(np.asarray(weights).sum(-1), 2.5, rtol=1e-5)
  # The bias steers the choice, so with it some tokens pick other experts.
  assert not jnp.array_equal(experts, no_bias_experts)
  assert no_bias_weights.shape == weights.shape


# --- the expert implementations ----------------------------------------------------------------


def make_moe(name: str, **choices) -> tuple:
  """(cfg, MoE) in float32 so that exact comparisons hold; a random selection bias if any.
  ``choices``: the step's (StepChoices: moe_impl, capacity_factor)."""
  cfg = get_config(name, dtype="float32")
  graphdef, abstract = nnx.split(
    nnx.eval_shape(lambda: MoE(cfg, choices=StepChoices(**choices), out_init=DEFAULT_INIT, rngs=nnx.Rngs(0))),
    nnx.Param,
  )
  moe = nnx.merge(graphdef, random_like(abstract))
  if cfg.router_bias:
    moe.router.b_select_e.set_value(0.2 * normal((cfg.num_experts,), 7))
  return cfg, moe


def jitted(moe: MoE, method: str = "__call__", **kwargs):
  """moe.method(x, constrain=no_constraint, **kwargs) as one compiled program."""
  graphdef, params = nnx.split(moe, nnx.Param)
  fn = jax.jit(lambda p, x: getattr(nnx.merge(graphdef, p), method)(x, constrain=no_constraint, **kwargs))
  return lambda x: fn(params, x)


def per_token_reference(moe: MoE, x_btd, *, capacity: int | None = None) -> tuple[np.ndarray, int]:
  """(output, dropped copies): a loop over tokens and their chosen experts. With ``capacity``,
  copies past an expert's capacity slots in a sequence are dropped, first choices placed first."""
  weights, experts = (np.asarray(a) for a in jitted(moe.router)(x_btd))
  x = np.asarray(x_btd, np.float64)
  wg, wu, wd = (np.asarray(p[...], np.float64) for p in (moe.w_gate_edf, moe.w_up_edf, moe.w_down_efd))
  silu = lambda z: z / (1 + np.exp(-z))  # noqa: E731
  b, t, _ = x.shape
  k = experts.shape[-1]
  keep = np.ones((b, t, k), bool)
  if capacity is not None:
    for bi in range(b):
      used = np.zeros(wg.shape[0], int)
      for j in range(k):
        for ti in range(t):
          used[experts[bi, ti, j]] += 1
          keep[bi, ti, j] = used[experts[bi, ti, j]] <= capacity
  y = np.zeros_like(x)
  for bi in range(b):
    for ti in range(t):
      for j in range(k):
        if keep[bi, ti, j]:
          e, xt = experts[bi, ti, j], x[bi, ti]
          y[bi, ti] += weights[bi, ti, j] * ((silu(xt @ wg[e]) * (xt @ wu[e])) @ wd[e])
  if moe.has_shared:
    y += np.asarray(jitted(moe.shared)(x_btd), np.float64)
  return y, int((~keep).sum())


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", ["tiny-moe", "tiny-mla"])
def test_forward_matches_a_per_token_loop_over_chosen_experts(name, impl):
  # A capacity factor of E / k gives every expert T slots: nothing can be dropped.
  cfg, moe = make_moe(name, moe_impl=impl, capacity_factor=8 / 2)
  x = normal((2, 16, cfg.d_model), 3)
  want, dropped = per_token_reference(moe, x)
  got = jitted(moe)(x)
  assert dropped == 0 and got.shape == x.shape
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)


def test_capacity_drops_the_copies_beyond_capacity():
  cfg, moe = make_moe("tiny-moe", moe_impl="capacity", capacity_factor=0.5)
  x = normal((2, 16, cfg.d_model), 4)
  c = expert_capacity(16, cfg.experts_per_token, cfg.num_experts, 0.5)
  assert c == 2
  want, dropped = per_token_reference(moe, x, capacity=c)
  assert dropped > 0
  got = jitted(moe)(x)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)
  full = jitted(moe, experts=dropless_experts)(x)
  assert not np.allclose(np.asarray(got), np.asarray(full), atol=1e-4)


def lm_loss(graphdef, **call):
  def loss(params, tokens_bt):
    logits = nnx.merge(graphdef, params)(tokens_bt[:, :-1], **call)
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens_bt[:, 1:]).mean()

  return loss


def test_capacity_temp_grows_with_capacity_factor():
  # A train-like step of one MoE layer (gradients for its weights and input), compiled for CPU.
  temps = []
  for factor in (1.0, 2.0, 4.0):  # 16, 32, 64 slots per expert for 64 tokens x top-2 of 8
    cfg, choices = get_config("tiny-moe"), choosing("capacity", capacity_factor=factor)
    graphdef, params = nnx.split(
      nnx.eval_shape(lambda: MoE(cfg, choices=choices, out_init=DEFAULT_INIT, rngs=nnx.Rngs(0))), nnx.Param
    )

    def loss(p, x_btd):
      return jnp.mean(jnp.square(nnx.merge(graphdef, p)(x_btd, constrain=no_constraint).astype(jnp.float32)))

    x = jax.ShapeDtypeStruct((2, 64, cfg.d_model), jnp.bfloat16)
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(params, x).compile()
    temps.append(compiled.memory_analysis().temp_size_in_bytes)
  assert temps[0] < temps[1] < temps[2], temps


# --- checkpoint names ---------------------------------------------------------------------------


def saved_scan_residuals(loss, *args) -> list[str]:
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    jax.ad_checkpoint.print_saved_residuals(loss, *args)
  return sorted(line.split()[0] for line in out.getvalue().splitlines() if "output of scan" in line)


@pytest.mark.parametrize("impl", IMPLS)
def test_moe_checkpoint_names_are_what_a_policy_saves(impl):
  cfg, choices = get_config("tiny-moe"), choosing(impl)
  graphdef, params = init_model(cfg, choices)
  b, t = 2, 8
  tokens = random_tokens(cfg, (b, t + 1), 5)
  l, e, k, f, d = cfg.num_moe_layers, cfg.num_experts, cfg.experts_per_token, cfg.expert_d_ff, cfg.d_model
  c = expert_capacity(t, k, e, choices.capacity_factor)
  hidden = (l, b * t * k, f) if impl == "dropless" else (l, e, b, c, f)
  expected = {"router_logits": f"f32[{l},{b},{t},{e}]", "moe_mlpwi_0": hidden, "moe_mlpwi_1": hidden}
  policies = jax.checkpoint_policies
  text = str(jax.make_jaxpr(jax.grad(lm_loss(graphdef, remat=policies.nothing_saveable)))(params, tokens))
  assert set(MOE_CHECKPOINT_NAMES) <= set(re.findall(r"name=(\w+)", text))
  assert set(MOE_CHECKPOINT_NAMES) <= set(CHECKPOINT_NAMES)
  baseline = saved_scan_residuals(lm_loss(graphdef, remat=policies.nothing_saveable), params, tokens)
  for name, shape in expected.items():
    saved = saved_scan_residuals(lm_loss(graphdef, remat=policies.save_only_these_names(name)), params, tokens)
    for s in baseline:
      saved.remove(s)
    want = shape if isinstance(shape, str) else "bf16[" + ",".join(map(str, shape)) + "]"
    assert saved == [want], (name, saved)


# --- inference ---------------------------------------------------------------------------------


def test_cached_prefill_and_decode_match_the_forward_pass():
  # A dense first layer and two MoE layers: the KV cache is carried through both scans.
  cfg = get_config("tiny-moe", dtype="float32", first_dense_layers=1, num_layers=3)
  graphdef, params = init_model(cfg)
  tokens = random_tokens(cfg, (2, 8), 6)

  @jax.jit  # one compile: the forward pass, a prefill and a decode step traced once for every position
  def run(params, tokens):
    model = nnx.merge(graphdef, params)
    prefill, cache = model.cached(tokens[:, :5], KVCache.zeros(cfg, batch=2, context=8), pos=0, last_only=False)

    def decode(cache, pos):
      logits, cache = model.cached(jax.lax.dynamic_slice_in_dim(tokens, pos, 1, axis=1), cache, pos=pos)
      return cache, logits[:, 0]

    _, decoded = jax.lax.scan(decode, cache, jnp.arange(5, 8))
    return model(tokens), jnp.concatenate([prefill, jnp.swapaxes(decoded, 0, 1)], axis=1)

  full, stepped = run(params, tokens)
  np.testing.assert_allclose(stepped, full, atol=1e-5)


# --- sharding ----------------------------------------------------------------------------------


def rules_constrain(mesh: Mesh, rules: dict[str, tuple[str, ...]]):
  """A constrain hook and a spec function from logical->mesh rules (the scheme of
  jaxmem.sharding: an axis used by an earlier dimension is not reused)."""

  def spec(names, shape):
    used, out = set(), []
    for name, dim in zip(names, shape, strict=True):
      axes = tuple(a for a in rules.get(name or "", ()) if a not in used)
      if not axes or dim % math.prod(mesh.shape[a] for a in axes):
        out.append(None)
        continue
      used.update(axes)
      out.append(axes if len(axes) > 1 else axes[0])
    return P(*out)

  def constrain(x, names):
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec(names, x.shape)))

  return constrain, spec


def sharded_forward(cfg, mesh, act_rules, param_rules, *, batch=8, choices=None, **call):
  constrain, act_spec = rules_constrain(mesh, act_rules)
  _, param_spec = rules_constrain(mesh, param_rules)
  graphdef, params = nnx.split(
    nnx.eval_shape(lambda: Transformer(cfg, choices=choices, rngs=nnx.Rngs(0))), nnx.Param
  )
  logical = nnx.get_partition_spec(params)
  on = lambda a, names: NamedSharding(mesh, param_spec(tuple(names), a.shape))  # noqa: E731
  args = jax.tree.map(
    lambda a, names: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=on(a, names)), params, logical,
    is_leaf=lambda x: isinstance(x, P),
  )
  batch_sharding = NamedSharding(mesh, act_spec(("batch", "seq"), (batch, 32)))
  tokens = jax.ShapeDtypeStruct((batch, 32), jnp.int32, sharding=batch_sharding)
  fn = jax.jit(lambda p, t: nnx.merge(graphdef, p)(t, constrain=constrain, **call))
  return fn, (args, tokens)


def test_expert_axis_exchanges_dispatched_tokens_with_all_to_all():
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "expert"))
  cfg = get_config("tiny-moe")
  counts = {}
  for label, exp in (("expert", ("expert",)), ("replicated", ())):
    act = {"batch": ("data", "expert"), "exp": exp}
    fn, args = sharded_forward(cfg, mesh, act, {"exp": exp}, choices=choosing("capacity"))
    hlo = fn.lower(*args).compile().as_text()
    counts[label] = len(re.findall(r"all-to-all(?:-start)?\(", hlo))
  # Two exchanges per MoE layer's forward pass (dispatch, combine); none without the rule.
  assert counts["expert"] >= 2 and counts["replicated"] == 0, counts


def test_experts_hook_runs_dropless_per_shard():
  """The hook a sharded caller uses: dropless experts in shard_map over the batch, so each
  device sorts its own tokens instead of GSPMD gathering all of them for one global sort."""
  mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
  cfg = get_config("tiny-moe", dtype="float32")
  rules = {"batch": ("data",)}
  per_shard = functools.partial(dropless_experts, constrain=no_constraint)
  sharded = jax.shard_map(
    per_shard, mesh=mesh, in_specs=(P("data"), P("data"), P("data"), P(), P(), P()), out_specs=P("data"),
    check_vma=False,
  )
  hook = lambda *args, constrain: sharded(*args)  # noqa: E731
  plain, args = sharded_forward(cfg, mesh, rules, {}, batch=16)
  hooked, _ = sharded_forward(cfg, mesh, rules, {}, batch=16, experts=hook)
  plain, hooked = (f.lower(*args).compile() for f in (plain, hooked))
  temps = [c.memory_analysis().temp_size_in_bytes for c in (plain, hooked)]
  assert temps[1] < temps[0], temps
  _, params = init_model(cfg)
  tokens = random_tokens(cfg, (16, 32), 7)
  inputs = jax.device_put((params, tokens), jax.tree.map(lambda a: a.sharding, args))
  np.testing.assert_allclose(hooked(*inputs), plain(*inputs), atol=1e-5)


# --- accelerator targets, compiled without the hardware ------------------------------------------


@functools.cache
def _compiler(target: str) -> tuple[bool, str]:
  from jaxmem.hardware.gpu import gpu_compiler_available
  from jaxmem.hardware.tpu import tpu_compiler_available

  return tpu_compiler_available() if target.startswith("tpu") else gpu_compiler_available("h100")


# The GPU case also runs, with its note, through the sweep in test_moe_wiring.py (in the fast
# suite); here it is under slow so the two compile the same programs once per CI run.
# Both paths compile for the CPU in tests/test_moe_wiring.py; the accelerator targets with the slow tests.
@pytest.mark.slow
@pytest.mark.parametrize("target", ["tpu:v5e-1", "gpu:h100"])
def test_both_implementations_compile_for_accelerator_targets(target):
  ok, why = _compiler(target)
  if not ok:
    pytest.skip(f"{target} compiler unavailable: {why}")
  from jaxmem.hardware.targets import get_target

  device = jax.sharding.SingleDeviceSharding(get_target(target).devices()[0])
  cfg = get_config("tiny-moe")
  graphdefs = [
    nnx.split(nnx.eval_shape(lambda impl=impl: Transformer(cfg, choices=choosing(impl), rngs=nnx.Rngs(0))), nnx.Param)[0]
    for impl in IMPLS
  ]
  params = built_params(cfg)  # the implementations share every parameter shape
  args = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device), params)
  tokens = jax.ShapeDtypeStruct((4, 129), jnp.int32, sharding=device)
  remat = jax.checkpoint_policies.nothing_saveable
  losses = [lm_loss(g, remat=remat) for g in graphdefs]

  def both(p, t):  # one program holding a train step of each implementation: one compile
    return tuple(jax.value_and_grad(loss)(p, t) for loss in losses)

  compiled = jax.jit(both).lower(args, tokens).compile()
  text = compiled.as_text()
  stats = compiled.memory_analysis()
  # Arguments hold at least the float32 parameters (TPU pads small arrays), and both steps'
  # gradients come out: twice the parameters.
  assert stats.argument_size_in_bytes >= 4 * count_params(cfg)
  assert stats.output_size_in_bytes >= 2 * 4 * count_params(cfg)
  assert stats.temp_size_in_bytes > 0 and "ENTRY" in text
