"""Multi-head latent attention: the math against the paper's equations, the absorbed decode
against the training forward, and the latent cache against its formula and against GQA."""

from __future__ import annotations

import contextlib
import io
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxmem.errors import JaxmemError
from jaxmem.models import (
  DENSE_CHECKPOINT_NAMES,
  MLA_CHECKPOINT_NAMES,
  KVCache,
  MLACache,
  Transformer,
  cache_bytes,
  cache_class,
  count_params,
  get_config,
  kv_cache_bytes,
  mla_cache_bytes,
)
from jaxmem.models.layers import DEFAULT_INIT, no_constraint
from jaxmem.models.mla import MLAttention
from jaxmem.models.rope import rope_tables


def random_like(abstract, seed: int = 0):
  """Values for an abstract parameter tree from numpy's generator (norm scales near 1): cheaper
  than compiling the model's threefry initialiser on CPU, and the values do not matter here."""
  rng = np.random.default_rng(seed)

  def one(path, a):
    z = rng.standard_normal(a.shape)
    near_one = "norm" in jax.tree_util.keystr(path) or "scale" in jax.tree_util.keystr(path)
    return jnp.asarray(1 + 0.1 * z if near_one else 0.05 * z, a.dtype)

  return jax.tree_util.tree_map_with_path(one, abstract)


def init_model(cfg) -> tuple:
  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))), nnx.Param)
  return graphdef, random_like(abstract)


def random_tokens(cfg, shape, seed: int) -> jax.Array:
  return jnp.asarray(np.random.default_rng(seed).integers(0, cfg.vocab_size, shape), jnp.int32)


# --- the math ----------------------------------------------------------------------------------


def reference_mla(attn: MLAttention, x_btd: np.ndarray, cfg) -> np.ndarray:
  """DeepSeek-V2 eqs. (9)-(19), head by head, in float64 numpy."""
  w = lambda p: np.asarray(p[...], np.float64)  # noqa: E731
  x = np.asarray(x_btd, np.float64)
  b, t, _ = x.shape
  n, nope, rope = cfg.num_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
  eps = cfg.norm_eps

  def rms(z, scale):
    return z / np.sqrt(np.mean(z * z, axis=-1, keepdims=True) + eps) * scale

  def rotate(z):  # RoPE, rotate-half pairing (models/rope.py), positions 0..t-1
    half = z.shape[-1] // 2
    angle = np.arange(t)[:, None] * cfg.rope_theta ** (-np.arange(0, 2 * half, 2) / (2 * half))
    cos, sin = np.cos(angle)[None, :, None], np.sin(angle)[None, :, None]
    z1, z2 = z[..., :half], z[..., half:]
    return np.concatenate([z1 * cos - z2 * sin, z2 * cos + z1 * sin], axis=-1)

  if cfg.q_lora_rank:
    q = np.einsum("btq,qnh->btnh", rms(x @ w(attn.w_q_a_dq), w(attn.q_norm_q)), w(attn.w_q_b_qnh))  # (12), (13)
  else:
    q = np.einsum("btd,dnh->btnh", x, w(attn.w_q_dnh))
  q_nope, q_rope = q[..., :nope], rotate(q[..., nope:])  # (14)
  a = x @ w(attn.w_kv_a_dx)
  c_kv = rms(a[..., : cfg.kv_lora_rank], w(attn.kv_norm_c))  # (9)
  k_rope = rotate(a[..., None, cfg.kv_lora_rank :])[:, :, 0]  # (15)
  causal = np.tril(np.ones((t, t), bool))
  heads = []
  for i in range(n):
    k_i = np.concatenate([c_kv @ w(attn.w_k_b_cnh)[:, i], k_rope], axis=-1)  # (10), (17)
    v_i = c_kv @ w(attn.w_v_b_cnv)[:, i]  # (11)
    q_i = np.concatenate([q_nope[:, :, i], q_rope[:, :, i]], axis=-1)  # (16)
    s = np.einsum("bth,bsh->bts", q_i, k_i) / math.sqrt(nope + rope)
    s = np.where(causal, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    heads.append(np.einsum("bts,bsv->btv", p / p.sum(-1, keepdims=True), v_i))  # (18)
  return np.einsum("btnv,nvd->btd", np.stack(heads, axis=2), w(attn.w_o_nvd))  # (19)


@pytest.mark.parametrize("q_lora_rank", [32, 0])
def test_training_forward_matches_the_papers_equations(q_lora_rank):
  cfg = get_config("tiny-mla", dtype="float32", q_lora_rank=q_lora_rank)
  make = lambda: MLAttention(cfg, out_init=DEFAULT_INIT, rngs=nnx.Rngs(0))  # noqa: E731
  graphdef, abstract = nnx.split(nnx.eval_shape(make), nnx.Param)
  params = random_like(abstract, seed=q_lora_rank)
  attn = nnx.merge(graphdef, params)
  t = 12
  x = jnp.asarray(np.random.default_rng(1).standard_normal((2, t, cfg.d_model)), jnp.float32)
  sin, cos = rope_tables(t, cfg.qk_rope_head_dim, cfg.rope_theta)
  run = jax.jit(lambda p, x: nnx.merge(graphdef, p)(x, rope_sin_tk=sin, rope_cos_tk=cos, constrain=no_constraint))
  np.testing.assert_allclose(np.asarray(run(params, x)), reference_mla(attn, x, cfg), rtol=1e-4, atol=1e-6)


def test_absorbed_decode_matches_the_training_forward():
  # tiny-mla: MLA in every layer, one dense layer then two MoE layers (two scans over the cache).
  cfg = get_config("tiny-mla", dtype="float32")
  graphdef, params = init_model(cfg)
  tokens = random_tokens(cfg, (2, 8), 2)

  @jax.jit  # one compile: forward pass, prefill, and a decode step traced once for every position
  def run(params, tokens):
    model = nnx.merge(graphdef, params)
    cache = MLACache.zeros(cfg, batch=2, context=8)
    prefill, cache = model.cached(tokens[:, :5], cache, pos=0, last_only=False)

    def decode(cache, pos):
      logits, cache = model.cached(jax.lax.dynamic_slice_in_dim(tokens, pos, 1, axis=1), cache, pos=pos)
      return cache, logits[:, 0]

    cache, decoded = jax.lax.scan(decode, cache, jnp.arange(5, 8))
    return model(tokens), jnp.concatenate([prefill, jnp.swapaxes(decoded, 0, 1)], axis=1), cache

  full, stepped, cache = run(params, tokens)
  np.testing.assert_allclose(stepped, full, atol=1e-5)
  # Every position was written, in every layer.
  assert bool(jnp.all(jnp.any(cache.latent_lbsc != 0, axis=-1)))


# --- the cache ---------------------------------------------------------------------------------


def test_cache_holds_latent_and_rope_key_per_token():
  cfg = get_config("deepseek-v3")
  cache = MLACache.abstract(cfg, batch=3, context=4096)
  assert cache.latent_lbsc.shape == (61, 3, 4096, 512) and cache.rope_k_lbsr.shape == (61, 3, 4096, 64)
  nbytes = sum(math.prod(a.shape) * a.dtype.itemsize for a in (cache.latent_lbsc, cache.rope_k_lbsr))
  assert nbytes == mla_cache_bytes(cfg, batch=3, context=4096) == cache_bytes(cfg, batch=3, context=4096)
  # (d_c + d_h^R) = 576 bf16 values per token and layer.
  assert mla_cache_bytes(cfg, batch=1, context=1) == 61 * (512 + 64) * 2
  assert cache_class(cfg) is MLACache and cache_class(get_config("llama3-8b")) is KVCache
  gqa = get_config("llama3-8b")
  assert cache_bytes(gqa, batch=2, context=8) == kv_cache_bytes(gqa, batch=2, context=8)


def test_cache_is_far_below_gqa_models_of_similar_size():
  per_token = lambda name: cache_bytes(get_config(name), batch=1, context=1)  # noqa: E731
  mla = per_token("deepseek-v3")
  # Llama 3 70B and 405B (GQA, 8 kv heads) cache 4.7x and 7.3x more per token than 671B DeepSeek-V3.
  assert 4 * mla < per_token("llama3-70b") and 7 * mla < per_token("llama3-405b")
  assert count_params(get_config("llama3-405b")) < count_params(get_config("deepseek-v3"))
  # The same 128 heads cached as full keys and values (DeepSeek's "naive" cache): 71x.
  cfg = get_config("deepseek-v3")
  naive = cfg.num_layers * cfg.num_heads * (cfg.head_dim + cfg.v_head_dim) * 2
  assert naive > 50 * mla


def decode_step_bytes(cfg, *, batch: int, context: int) -> int:
  """Argument bytes of a compiled decode step, less its parameters: the cache (and the token
  and position, a few bytes)."""
  graphdef, params = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))), nnx.Param)
  cache = cache_class(cfg).abstract(cfg, batch=batch, context=context)
  token = jax.ShapeDtypeStruct((batch, 1), jnp.int32)
  pos = jax.ShapeDtypeStruct((), jnp.int32)
  step = jax.jit(lambda p, t, c, i: nnx.merge(graphdef, p).cached(t, c, pos=i), donate_argnums=(2,))
  stats = step.lower(params, token, cache, pos).compile().memory_analysis()
  param_bytes = sum(math.prod(a.shape) * a.dtype.itemsize for a in jax.tree.leaves(params))
  return stats.argument_size_in_bytes - param_bytes


def test_compiled_decode_step_takes_the_formulas_cache():
  mla = get_config("tiny-mla")
  # A GQA twin: the same model with ordinary attention (4 kv heads of 16).
  gqa = get_config("tiny-mla", kv_lora_rank=0, head_dim=16)
  batch, context = 4, 256
  mla_args, gqa_args = (decode_step_bytes(c, batch=batch, context=context) for c in (mla, gqa))
  small = batch * 4 + 4  # the int32 tokens and position
  assert mla_args - small == mla_cache_bytes(mla, batch=batch, context=context)
  assert gqa_args - small == kv_cache_bytes(gqa, batch=batch, context=context)
  # 3 layers x (16 + 8) latent values per token against 3 x 2 x 4 x 16 keys and values.
  assert mla_args * 5 < gqa_args


# --- names and configs -------------------------------------------------------------------------


def saved_scan_residuals(loss, *args) -> list[str]:
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    jax.ad_checkpoint.print_saved_residuals(loss, *args)
  return sorted(line.split()[0] for line in out.getvalue().splitlines() if "output of scan" in line)


def test_mla_checkpoint_names_are_what_a_policy_saves():
  cfg = get_config("tiny-mla")
  graphdef, params = init_model(cfg)
  b, t = 2, 8
  tokens = random_tokens(cfg, (b, t), 3)

  def loss_with(policy):
    return lambda p, x: nnx.merge(graphdef, p)(x, remat=policy).mean()

  policies = jax.checkpoint_policies
  text = str(jax.make_jaxpr(jax.grad(loss_with(policies.nothing_saveable)))(params, tokens))
  found = set(re.findall(r"name=(\w+)", text))
  assert set(MLA_CHECKPOINT_NAMES) | set(DENSE_CHECKPOINT_NAMES) <= found
  widths = {"query_wa_proj": cfg.q_lora_rank, "mla_q": cfg.q_lora_rank, "mla_kv": cfg.kv_lora_rank,
            "kv_wa_proj": cfg.kv_lora_rank + cfg.qk_rope_head_dim}
  baseline = saved_scan_residuals(loss_with(policies.nothing_saveable), params, tokens)
  for name, width in widths.items():
    saved = saved_scan_residuals(loss_with(policies.save_only_these_names(name)), params, tokens)
    for s in baseline:
      saved.remove(s)
    # One stacked residual per scan: the dense first layer, then the two MoE layers.
    assert saved == [f"bf16[1,{b},{t},{width}]", f"bf16[2,{b},{t},{width}]"], (name, saved)


@pytest.mark.parametrize(
  "overrides, match",
  [
    ({"head_dim": 16}, "head_dim"),
    ({"num_kv_heads": 2}, "num_kv_heads"),
    ({"qk_rope_head_dim": 7, "head_dim": 23}, "qk_rope_head_dim"),
    ({"style": "gpt2"}, "llama3"),
  ],
)
def test_bad_mla_fields_are_one_line_errors(overrides, match):
  with pytest.raises(JaxmemError, match=match) as err:
    get_config("tiny-mla", **overrides)
  assert "\n" not in str(err.value)
