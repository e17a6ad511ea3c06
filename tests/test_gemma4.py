"""Gemma 4 from its published config.json (tests/data/hf/README.md): the 31B's global layers
with their own head_dim, kv heads and no v projection (attention_k_eq_v), counted, built,
compiled and cached; KV sharing (the last layers reuse an earlier layer's keys and values: no
k/v parameters or cache of their own); per-layer embeddings (E2B, E4B: counted exactly as
transformers' text model); the MoE block (26B-A4B: GeGLU experts beside every layer's dense MLP,
Gemma4TextRouter's scales), counted, built and compiled."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import jaxmem
from jaxmem.errors import JaxmemError
from jaxmem.models import StepChoices, Transformer, count_active_params, count_params, from_config
from jaxmem.models.model_flops import matmul_params

from tests.test_hf import DATA

# google/gemma-4-31B-it model card, "Dense Models" table: Total Parameters 30.7B (the text model;
# the ~550M vision encoder is listed apart and not built here).
PUBLISHED_31B = 30.7e9
# transformers' Gemma 4 text models (Gemma4TextModel) as measured in public copies: E2B's
# model.language_model 4,628,569,344 (a parameter-distribution table; a loader's "text-only model
# holds 4,628,569,344 parameters against the checkpoint's 5,123,178,979"), E4B's 7,463,013,376 (a
# fairseq2 test "matching HuggingFace"). tests/data/hf/README.md names them.
MEASURED_TEXT = {"gemma-4-e2b-it.json": 4_628_569_344, "gemma-4-e4b-it.json": 7_463_013_376}
# The model cards' "Total Parameters": E2B "5.1B with embeddings", E4B "8B with embeddings", vision
# (~150M) and audio (~300M) encoders included; E2B's towers and their projections, measured in the
# same distribution table (vision 167,364,608, audio 304,824,608, embed_vision 1,179,648,
# embed_audio 2,359,296), stand for E4B's too (the cards list the same encoders for both).
PUBLISHED_TOTAL = {"gemma-4-e2b-it.json": 5.1e9, "gemma-4-e4b-it.json": 8.0e9}
TOWERS = 167_364_608 + 304_824_608 + 1_179_648 + 2_359_296
# google/gemma-4-26B-A4B-it model card (quoted in several public copies): "25.2B total parameters"
# and "3.8B active", with "a ~550M parameter vision encoder" listed apart, as the 31B's: the text
# model's count (25,233,141,760 here; with the encoder it would be 25.8B, 2.3% over) and its active
# count (embeddings and the dense MLPs included, 8 of 128 experts: 3,822,530,560).
PUBLISHED_26B_A4B = (25.2e9, 3.8e9)


def _tiny(**text):
  raw = json.loads((DATA / "tiny-gemma4.json").read_text())
  raw["text_config"].update(text)
  return raw


def test_31b_loads_with_its_global_layers_geometry():
  cfg = from_config(DATA / "gemma-4-31b-it.json")
  assert (cfg.d_model, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (5376, 60, 32, 16, 256)
  assert cfg.attention_geometry(None) == (4, 512, True) and cfg.attention_geometry(1024) == (16, 256, False)
  assert cfg.num_windowed_layers == 50 and cfg.layer_window(5) is None and cfg.layer_window(0) == 1024
  assert cfg.final_softcap == 30.0 and cfg.v_norm and cfg.qk_norm and cfg.tie_embeddings and cfg.vocab_size == 262_144


def test_31b_parameter_count_matches_the_model_card():
  assert abs(count_params(from_config(DATA / "gemma-4-31b-it.json")) / PUBLISHED_31B - 1) < 0.01


def test_tiny_builds_with_the_counted_parameters_and_k_eq_v_drops_v():
  cfg = from_config(DATA / "tiny-gemma4.json")
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  assert sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))) == count_params(cfg)
  local, glob = model.blocks_0_0.attn, model.blocks_0_5.attn
  assert glob.w_k_dkh.shape[1:] == (64, 1, 32) and not hasattr(glob, "w_v_dkh")  # global: 1 kv head of 32, k = v
  assert local.w_k_dkh.shape[1:] == (64, 2, 16) and local.w_v_dkh.shape[1:] == (64, 2, 16)
  with_v = from_config(_tiny(attention_k_eq_v=False))  # then the global layers keep the kv heads too
  assert with_v.attention_geometry(None) == (2, 32, False) and count_params(with_v) > count_params(cfg)


@pytest.mark.parametrize("name", ["tiny-gemma4.json", "tiny-gemma4-moe.json"])
def test_decode_matches_the_training_logits_and_the_cache_has_the_global_geometry(name, decode_matches_forward):
  cfg = dataclasses.replace(from_config(DATA / name), sliding_window=8, param_dtype="float32", dtype="float32")
  cache = decode_matches_forward(cfg, upto=16)
  assert cache.k_lbksh.shape == (2, 1, 1, 32, 32) and cache.k_local.shape == (10, 1, 2, 8, 16)


@pytest.mark.slow  # ~20 s on two loaded cores
def test_tiny_train_step_compiles(compile_one):
  cfg = from_config(DATA / "tiny-gemma4.json")
  row = compile_one(model=cfg, target="cpu", batch=2, seq=128, attention="dot", remat="full")
  assert row.error is None and row.temp_size_in_bytes > 0


def test_decode_step_compiles_with_the_global_layers_cache():
  cfg = from_config(DATA / "tiny-gemma4.json")
  (dec,) = jaxmem.infer(model=cfg, target="cpu", phase="decode", context=512, batch=2, weights="bf16")
  # 2 global layers x 1 kv head x 32 + 10 windowed x 2 kv heads x 16 (window 16), k and v, bf16
  assert dec.kv_cache_bytes == 2 * 2 * (2 * 1 * 32 * 512 + 10 * 2 * 16 * 16) * 2
  assert abs((dec.argument_size_in_bytes - dec.weight_bytes) / dec.kv_cache_bytes - 1) < 0.02


def _shared(**text):
  """The tiny model with its last period (6 layers) KV-shared, their MLPs double-wide (E2B's)."""
  return from_config(_tiny(num_kv_shared_layers=6, use_double_wide_mlp=True, **text))


def test_kv_shared_layers_have_no_kv_parameters_and_are_counted():
  cfg = _shared()
  # transformers' Gemma4TextConfig.kv_sharing_modes: layers 6..11 reuse layer 4's (sliding) or 5's (full)
  assert [cfg.kv_source(i) for i in range(12)] == [0, 1, 2, 3, 4, 5, 4, 4, 4, 4, 4, 5]
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  assert sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))) == count_params(cfg)
  own, shared = model.blocks_0_4.attn, model.blocks_1_4.attn
  assert own.w_k_dkh.shape[0] == 1 and hasattr(own, "w_v_dkh") and hasattr(own, "k_norm")
  assert not any(hasattr(shared, a) for a in ("w_k_dkh", "w_v_dkh", "k_norm")) and shared.q_norm.scale_h.shape == (1, 16)
  assert model.blocks_1_5.mlp.w_up_df.shape == (1, 64, 256) and model.blocks_0_5.mlp.w_up_df.shape == (1, 64, 128)
  plain = from_config(_tiny())
  # per shared layer: k, v projections and k_norm less (k_eq_v: none of v on the global one), MLP doubled
  less = 5 * (2 * 64 * 2 * 16 + 16) + (64 * 1 * 32 + 32)
  assert count_params(cfg) == count_params(plain) - less + 6 * 3 * 64 * 128


def test_kv_shared_decode_matches_the_training_logits_without_a_cache_of_their_own(decode_matches_forward):
  cfg = dataclasses.replace(_shared(), sliding_window=8, param_dtype="float32", dtype="float32")
  # a 12-token prompt past the 8-wide window: the shared windowed layers take layer 4's new keys
  cache = decode_matches_forward(cfg, upto=16)
  assert cache.k_lbksh.shape == (1, 1, 1, 32, 32) and cache.k_local.shape == (5, 1, 2, 8, 16)  # layers 0..5 only


def test_kv_shared_decode_step_compiles_with_the_smaller_cache():
  (dec,) = jaxmem.infer(model=_shared(), target="cpu", phase="decode", context=512, batch=2, weights="bf16")
  # 1 global layer x 1 kv head x 32 + 5 windowed x 2 kv heads x 16 (window 16), k and v, bf16
  assert dec.kv_cache_bytes == 2 * 2 * (1 * 1 * 32 * 512 + 5 * 2 * 16 * 16) * 2
  assert abs((dec.argument_size_in_bytes - dec.weight_bytes) / dec.kv_cache_bytes - 1) < 0.02


@pytest.mark.slow  # ~20 s on two loaded cores
def test_kv_shared_train_step_compiles(compile_one):
  row = compile_one(model=_shared(), target="cpu", batch=2, seq=128, attention="dot", remat="full")
  assert row.error is None and row.temp_size_in_bytes > 0


@pytest.mark.parametrize(
  "text, feature",
  [
    ({"num_kv_shared_layers": 4}, "whole 6-layer periods"),
    ({"num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 16}, "enable_moe_block is not"),
    ({"enable_moe_block": True, "num_experts": 4, "moe_intermediate_size": 16}, "top_k_experts"),
    ({"enable_moe_block": True, "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 16,
      "hidden_size_per_layer_input": 8}, "no MoE"),
    ({"use_bidirectional_attention": "all"}, "causal"),
    ({"num_hidden_layers": 13, "layer_types": None}, "last layer is global"),
  ],
)
def test_unbuilt_features_are_refused_in_one_line(text, feature):
  with pytest.raises(JaxmemError, match=feature) as e:
    from_config(_tiny(**text))
  assert "\n" not in str(e.value)


def test_hidden_size_per_layer_input_defaults_to_gemma4s_256():
  raw = _tiny()
  del raw["text_config"]["hidden_size_per_layer_input"]
  cfg = from_config(raw)
  assert (cfg.per_layer_dim, cfg.per_layer_vocab) == (256, 256)  # the tiny file's vocab_size_per_layer_input


def _ple(**text):
  """The tiny model with 8-wide per-layer embeddings over 200 tokens, and KV sharing as E2B's."""
  return from_config(_tiny(hidden_size_per_layer_input=8, vocab_size_per_layer_input=200, **text))


def test_per_layer_embeddings_are_built_and_counted():
  cfg = _ple(num_kv_shared_layers=6, use_double_wide_mlp=True)
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  assert sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))) == count_params(cfg)
  # Gemma4TextModel.embed_tokens_per_layer [200, 12 * 8], per_layer_model_projection, its norm
  assert model.ple_table_vq.shape == (200, 96) and model.ple_proj_dq.shape == (64, 96) and model.ple_norm.scale_h.shape == (8,)
  # each layer: per_layer_input_gate, per_layer_projection, post_per_layer_input_norm
  block = model.blocks_0_0
  assert block.ple_gate_dq.shape == (1, 64, 8) and block.ple_proj_qd.shape == (1, 8, 64) and block.ple_norm.scale_d.shape == (1, 64)
  plain = from_config(_tiny(num_kv_shared_layers=6, use_double_wide_mlp=True))
  assert count_params(cfg) - count_params(plain) == 200 * 96 + 64 * 96 + 8 + 12 * (2 * 64 * 8 + 64)


def test_per_layer_embeddings_decode_matches_the_training_logits():
  cfg = dataclasses.replace(_ple(num_kv_shared_layers=6), sliding_window=8, param_dtype="float32", dtype="float32")
  graph, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  tokens = jax.random.randint(jax.random.PRNGKey(1), (1, 16), 0, cfg.per_layer_vocab)  # rows of both tables
  full = jax.jit(lambda s, t: nnx.merge(graph, s)(t))(state, tokens)
  assert jnp.isfinite(full).all()
  cache = jaxmem.models.cache_class(cfg).zeros(cfg, batch=1, context=32)
  logits, cache = jax.jit(lambda s, t, c: nnx.merge(graph, s).cached(t, c, pos=0, last_only=False))(state, tokens[:, :12], cache)
  assert jnp.allclose(logits, full[:, :12], atol=1e-5)
  decode = jax.jit(lambda s, t, c, p: nnx.merge(graph, s).cached(t, c, pos=p))
  for t in range(12, 16):
    logits, cache = decode(state, tokens[:, t : t + 1], cache, t)
    assert jnp.allclose(logits[:, 0], full[:, t], atol=1e-5), t
  other = nnx.merge(graph, state)  # the per-layer inputs reach the logits: another table moves them
  other.ple_table_vq.set_value(other.ple_table_vq.get_value() + 1.0)
  assert not jnp.allclose(other(tokens), full, atol=1e-3)


@pytest.mark.parametrize("name", sorted(MEASURED_TEXT))
def test_e2b_e4b_count_as_transformers_and_their_model_cards(name):
  cfg = from_config(DATA / name)
  assert count_params(cfg) == MEASURED_TEXT[name]
  assert abs((count_params(cfg) + TOWERS) / PUBLISHED_TOTAL[name] - 1) < 0.01


def test_per_layer_table_is_looked_up_not_multiplied_in_the_model_flops():
  cfg = from_config(DATA / "gemma-4-e2b-it.json")
  # the embedding (tied: the output head) and everything else stay; the 262,144 x 35 x 256 table goes
  assert matmul_params(cfg) == 4_628_569_344 - 262_144 * 35 * 256


def test_e2b_shares_kv_from_layers_13_and_14_and_caches_15_layers():
  cfg = from_config(DATA / "gemma-4-e2b-it.json")
  assert (cfg.kv_shared_layers, cfg.kv_shared_double_mlp, cfg.per_layer_dim, cfg.per_layer_vocab) == (20, True, 256, 262_144)
  assert {cfg.kv_source(i) for i in range(15, 35)} == {13, 14} and cfg.kv_source(19) == 14
  assert (cfg.num_cached_layers(True), cfg.num_cached_layers(False)) == (12, 3)


@pytest.mark.slow  # ~20 s on two loaded cores
def test_per_layer_embeddings_train_step_compiles(compile_one):
  row = compile_one(model=_ple(num_kv_shared_layers=6), target="cpu", batch=2, seq=128, attention="dot", remat="full")
  assert row.error is None and row.temp_size_in_bytes > 0



def _moe(**text):
  raw = json.loads((DATA / "tiny-gemma4-moe.json").read_text())
  raw["text_config"].update(text)
  return from_config(raw)


def test_26b_a4b_counts_as_its_model_card():
  cfg = from_config(DATA / "gemma-4-26b-a4b-it.json")
  assert (cfg.num_experts, cfg.experts_per_token, cfg.expert_d_ff, cfg.d_ff, cfg.num_moe_layers) == (128, 8, 704, 2112, 30)
  assert (cfg.expert_act, cfg.moe_beside_dense, cfg.global_k_eq_v) == ("gelu_tanh", True, True)
  total, active = PUBLISHED_26B_A4B
  assert count_params(cfg) == 25_233_141_760 and abs(count_params(cfg) / total - 1) < 0.01
  assert count_active_params(cfg) == 3_822_530_560 and abs(count_active_params(cfg) / active - 1) < 0.015


def test_moe_block_builds_with_the_counted_parameters_in_transformers_layout():
  cfg = _moe()
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  assert sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))) == count_params(cfg)
  block = model.blocks_0_0  # position 0 of the 6-layer pattern, 2 stacked; D 64, F 128, E 8, Fe 32
  # Gemma4TextRouter: proj [E, D], scale [D], per_expert_scale [E]; Gemma4TextExperts: gate_up [E, 2Fe, D], down [E, D, Fe]
  assert block.mlp.router.w_router_de.shape == (2, 64, 8) and block.mlp.router.scale_d.shape == (2, 64)
  assert block.mlp.router.expert_scale_e.shape == (2, 8)
  assert block.mlp.w_gate_edf.shape == block.mlp.w_up_edf.shape == (2, 8, 64, 32) and block.mlp.w_down_efd.shape == (2, 8, 32, 64)
  assert block.dense_mlp.w_gate_df.shape == (2, 64, 128)  # Gemma4TextMLP beside the experts
  for norm in ("post_dense_norm", "experts_norm", "post_experts_norm"):  # post_ff_1, pre_ff_2, post_ff_2
    assert getattr(block, norm).scale_d.shape == (2, 64)
  dense = from_config(DATA / "tiny-gemma4.json")
  d, e, fe = 64, 8, 32
  assert count_params(cfg) - count_params(dense) == 12 * (d * e + d + e + e * 3 * d * fe + 3 * d)
  assert count_active_params(cfg) - count_active_params(dense) == 12 * (d * e + d + e + 2 * 3 * d * fe + 3 * d)


def _moe_numpy_ffn(block, x):
  """Gemma4TextDecoderLayer.forward's feed-forward half, transcribed in numpy (float32), dropless."""
  import numpy as np

  def rms(v, scale=None):
    v = v / np.sqrt(np.mean(v * v, -1, keepdims=True) + 1e-6)
    return v if scale is None else v * scale

  def gelu(v):
    return 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v**3)))

  p = {k: np.asarray(v) for k, v in nnx.to_flat_state(nnx.state(block, nnx.Param))}
  p = {".".join(map(str, k)): v for k, v in p.items()}
  h = rms(x, p["mlp_norm.scale_d"])
  dense = (gelu(h @ p["dense_mlp.w_gate_df"]) * (h @ p["dense_mlp.w_up_df"])) @ p["dense_mlp.w_down_fd"]
  r = rms(x) * p["mlp.router.scale_d"] * x.shape[-1] ** -0.5
  probs = np.exp(r @ p["mlp.router.w_router_de"])
  probs /= probs.sum(-1, keepdims=True)
  top = np.argsort(-probs, -1)[..., :2]
  w = np.take_along_axis(probs, top, -1)
  w = w / w.sum(-1, keepdims=True) * p["mlp.router.expert_scale_e"][top]
  xe = rms(x, p["experts_norm.scale_d"])
  routed = np.zeros_like(x)
  for j in range(2):
    e = top[..., j]
    g = np.einsum("btd,btdf->btf", xe, p["mlp.w_gate_edf"][e])
    u = np.einsum("btd,btdf->btf", xe, p["mlp.w_up_edf"][e])
    routed += w[..., j : j + 1] * np.einsum("btf,btfd->btd", gelu(g) * u, p["mlp.w_down_efd"][e])
  return rms(rms(dense, p["post_dense_norm.scale_d"]) + rms(routed, p["post_experts_norm.scale_d"]), p["post_mlp_norm.scale_d"])


@pytest.mark.parametrize("impl", ["dropless", "capacity"])
def test_moe_block_computes_as_transformers(impl):
  import numpy as np
  from jaxmem.models.layers import no_constraint

  cfg = dataclasses.replace(_moe(), param_dtype="float32", dtype="float32")
  model = Transformer(cfg, choices=StepChoices(moe_impl=impl, capacity_factor=8.0), rngs=nnx.Rngs(0))
  block = jax.tree.map(lambda v: v[0], model.blocks_0_0)  # layer 0 of the stack
  for name in ("scale_d", "expert_scale_e"):  # non-trivial scales, so that each one shows
    p = getattr(block.mlp.router, name)
    p.set_value(p.get_value() + jax.random.uniform(jax.random.PRNGKey(len(name)), p.get_value().shape))
  x = jax.random.normal(jax.random.PRNGKey(2), (2, 8, 64))
  got = block.ffn(x, no_constraint, None)
  assert np.allclose(np.asarray(got), _moe_numpy_ffn(block, np.asarray(x)), atol=2e-4)


@pytest.mark.slow  # ~20 s on two loaded cores
def test_moe_train_step_compiles(compile_one):
  row = compile_one(model=_moe(), target="cpu", batch=2, seq=128, attention="dot", remat="full")
  assert row.error is None and row.temp_size_in_bytes > 0


def test_moe_decode_step_compiles_with_int8_weights():
  (dec,) = jaxmem.infer(model=_moe(), target="cpu", phase="decode", context=256, batch=2, weights="int8")
  assert dec.error is None and dec.weight_bytes > 0


@pytest.mark.slow  # ~60 s on two loaded cores
@pytest.mark.needs_tpu_compiler
def test_moe_compiles_for_tpu_through_megablox_and_ragged_dot():
  from jaxmem.planning.sweep import compare

  rows = compare(model=_moe(), remat="none", batch=8, seq=64, target="tpu:v5e-1", moe_kernel="auto,ragged_dot")
  assert [(r.moe_kernel, r.error) for r in rows] == [("gmm", None), ("ragged_dot", None)]
  assert all(1.0 < r.flops / r.model_flops < 2.0 for r in rows)
