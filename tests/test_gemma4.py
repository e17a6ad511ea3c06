"""Gemma 4 from its published config.json (tests/data/hf/README.md): the 31B's global layers
with their own head_dim, kv heads and no v projection (attention_k_eq_v), counted, built,
compiled and cached; KV sharing (the last layers reuse an earlier layer's keys and values: no
k/v parameters or cache of their own); per-layer embeddings (E2B, E4B: counted exactly as
transformers' text model); the MoE block, not built, refused in one line."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import jaxmem
from jaxmem.errors import JaxmemError
from jaxmem.models import Transformer, count_params, from_config
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


def test_decode_matches_the_training_logits_and_the_cache_has_the_global_geometry():
  cfg = dataclasses.replace(from_config(DATA / "tiny-gemma4.json"), sliding_window=8, param_dtype="float32", dtype="float32")
  graph, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  tokens = jax.random.randint(jax.random.PRNGKey(1), (1, 20), 0, cfg.vocab_size)
  full = jax.jit(lambda s, t: nnx.merge(graph, s)(t))(state, tokens)
  cache = jaxmem.models.cache_class(cfg).zeros(cfg, batch=1, context=32)
  assert cache.k_lbksh.shape == (2, 1, 1, 32, 32) and cache.k_local.shape == (10, 1, 2, 8, 16)
  logits, cache = jax.jit(lambda s, t, c: nnx.merge(graph, s).cached(t, c, pos=0, last_only=False))(state, tokens[:, :12], cache)
  assert jnp.allclose(logits, full[:, :12], atol=1e-5)
  decode = jax.jit(lambda s, t, c, p: nnx.merge(graph, s).cached(t, c, pos=p))
  for t in range(12, 16):
    logits, cache = decode(state, tokens[:, t : t + 1], cache, t)
    assert jnp.allclose(logits[:, 0], full[:, t], atol=1e-5), t


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


def test_kv_shared_decode_matches_the_training_logits_without_a_cache_of_their_own():
  cfg = dataclasses.replace(_shared(), sliding_window=8, param_dtype="float32", dtype="float32")
  graph, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  tokens = jax.random.randint(jax.random.PRNGKey(1), (1, 20), 0, cfg.vocab_size)
  full = jax.jit(lambda s, t: nnx.merge(graph, s)(t))(state, tokens)
  cache = jaxmem.models.cache_class(cfg).zeros(cfg, batch=1, context=32)
  assert cache.k_lbksh.shape == (1, 1, 1, 32, 32) and cache.k_local.shape == (5, 1, 2, 8, 16)  # layers 0..5 only
  # a 12-token prompt past the 8-wide window: the shared windowed layers take layer 4's new keys
  logits, cache = jax.jit(lambda s, t, c: nnx.merge(graph, s).cached(t, c, pos=0, last_only=False))(state, tokens[:, :12], cache)
  assert jnp.allclose(logits, full[:, :12], atol=1e-5)
  decode = jax.jit(lambda s, t, c, p: nnx.merge(graph, s).cached(t, c, pos=p))
  for t in range(12, 16):
    logits, cache = decode(state, tokens[:, t : t + 1], cache, t)
    assert jnp.allclose(logits[:, 0], full[:, t], atol=1e-5), t


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
    ({"enable_moe_block": True, "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 16}, "mixture-of-experts"),
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

