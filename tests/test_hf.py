"""Models from Hugging Face config.json files (models/hf.py), the architecture flags they need
(qkv_bias, qk_norm, sliding_window) and the presets built from them."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from jaxmem.errors import JaxmemError
from jaxmem.models import (
  DENSE_CHECKPOINT_NAMES,
  LOGICAL_AXES,
  ModelConfig,
  Transformer,
  count_params,
  from_config,
  get_config,
)
from jaxmem.models.hf import SUPPORTED

DATA = Path(__file__).parent / "data" / "hf"

# fixture (a copy of the checkpoint's config.json; sources in data/hf/README.md) -> preset
FIXTURES = {
  "mistral-7b-v0.3": "mistral-7b",
  "qwen2.5-7b": "qwen2.5-7b",
  "qwen2.5-72b": "qwen2.5-72b",
  "qwen3-8b": "qwen3-8b",
  "llama3.1-8b": "llama3-8b",
  "gpt2": "gpt2-small",
  # Mixtures of experts; deepseek-v3.json without its quantization_config (README).
  "mixtral-8x7b": "mixtral-8x7b",
  "qwen3-30b-a3b": "qwen3-30b-a3b",
  "deepseek-v3": "deepseek-v3",
}
# Parameter counts on the model cards: Mistral 7B (v0.3) 7.25B, Qwen2.5-7B 7.61B,
# Qwen2.5-72B 72.7B, Qwen3-8B 8.2B (8.19B to three figures).
PUBLISHED = {"mistral-7b": 7.25e9, "qwen2.5-7b": 7.61e9, "qwen2.5-72b": 72.7e9, "qwen3-8b": 8.19e9}


def raw(fixture: str) -> dict:
  return json.loads((DATA / f"{fixture}.json").read_text())


def built_count(cfg: ModelConfig) -> int:
  """Elements of the built model's parameters, from shapes only (nothing is allocated)."""
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  return sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def refusal(config: dict) -> str:
  with pytest.raises(JaxmemError) as err:
    from_config(config)
  msg = str(err.value)
  assert "\n" not in msg, msg
  return msg


# --- fixtures and presets ----------------------------------------------------------------------


@pytest.mark.parametrize("fixture", list(FIXTURES))
def test_fixture_parses_to_its_preset(fixture):
  cfg = from_config(DATA / f"{fixture}.json")
  assert cfg.name == fixture  # no _name_or_path in these files: the file's name
  preset = get_config(FIXTURES[fixture])
  assert dataclasses.replace(cfg, name=preset.name) == preset


def test_families_map_to_their_flags():
  qwen2, qwen3, mistral = (from_config(DATA / f"{f}.json") for f in ("qwen2.5-7b", "qwen3-8b", "mistral-7b-v0.3"))
  assert (qwen2.qkv_bias, qwen2.qk_norm) == (True, False)
  assert (qwen3.qkv_bias, qwen3.qk_norm) == (False, True)
  assert not (mistral.qkv_bias or mistral.qk_norm)
  # Qwen2.5's file says sliding_window 131072 but use_sliding_window false: no window.
  assert raw("qwen2.5-7b")["sliding_window"] and qwen2.sliding_window is None and qwen2.notes == ()
  assert {qwen2.style, qwen3.style, mistral.style} == {"llama3"}
  assert from_config(DATA / "gpt2.json").style == "gpt2"


@pytest.mark.parametrize("preset", list(PUBLISHED))
def test_new_presets_match_published_sizes_and_the_built_model(preset):
  cfg = get_config(preset)
  n = count_params(cfg)
  assert abs(n / PUBLISHED[preset] - 1) < 0.01, (preset, n)
  assert built_count(cfg) == n


def test_qwen2_5_7b_config_json_gives_7_6b_parameters():
  assert round(count_params(from_config(DATA / "qwen2.5-7b.json")) / 1e9, 1) == 7.6


def test_get_config_takes_a_json_path_with_overrides():
  cfg = get_config(str(DATA / "tiny-qwen3.json"), num_layers=3, param_dtype="bfloat16")
  assert (cfg.name, cfg.num_layers, cfg.param_dtype, cfg.qk_norm) == ("tiny-qwen3", 3, "bfloat16", True)
  with pytest.raises(JaxmemError, match="config.json"):
    get_config("no-such-model")


# --- names ---------------------------------------------------------------------------------------


def test_name_from_directory_name_or_path_or_argument(tmp_path):
  d = tmp_path / "Qwen2.5-7B"
  d.mkdir()
  (d / "config.json").write_text(json.dumps(raw("qwen2.5-7b")))
  assert from_config(d / "config.json").name == "Qwen2.5-7B"
  assert get_config(str(d / "config.json")).name == "Qwen2.5-7B"
  (d / "config.json").write_text(json.dumps({**raw("qwen2.5-7b"), "_name_or_path": "Qwen/Qwen2.5-7B-Instruct"}))
  assert from_config(d / "config.json").name == "Qwen/Qwen2.5-7B-Instruct"
  # A local directory in _name_or_path names the model by its last part.
  assert from_config({**raw("qwen2.5-7b"), "_name_or_path": "/ckpt/run-7/"}).name == "run-7"
  assert from_config(d / "config.json", name="mine").name == "mine"


# --- what is accepted, what is refused -----------------------------------------------------------


def test_unsupported_architecture_is_one_line_naming_the_supported():
  msg = refusal({**raw("qwen2.5-7b"), "architectures": ["FalconForCausalLM"]})
  assert "FalconForCausalLM" in msg and all(a in msg for a in SUPPORTED)
  msg = refusal({"model_type": "qwen2_moe", "hidden_size": 8})
  assert "qwen2_moe" in msg and all(a in msg for a in SUPPORTED)


@pytest.mark.parametrize(
  ("fixture", "change", "named"),
  [
    ("qwen3-8b", {"num_experts": 128, "num_experts_per_tok": 8}, "num_experts"),
    ("llama3.1-8b", {"kv_lora_rank": 512}, "kv_lora_rank"),
    ("llama3.1-8b", {"attention_bias": True}, "attention_bias"),
    ("qwen3-8b", {"attention_bias": True}, "attention_bias"),
    ("llama3.1-8b", {"mlp_bias": True}, "mlp_bias"),
    ("llama3.1-8b", {"hidden_act": "gelu"}, "hidden_act"),
    ("gpt2", {"activation_function": "relu"}, "activation_function"),
    ("qwen2.5-7b", {"rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}, "mrope"),
    ("qwen2.5-7b", {"use_mrope": True}, "use_mrope"),
    ("mistral-7b-v0.3", {"quantization_config": {"bits": 4}}, "quantization_config"),
    ("qwen2.5-7b", {"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ("llama3.1-8b", {"sliding_window": 4096}, "sliding_window"),  # not a Llama field
    ("gpt2", {"n_embd": "768"}, "n_embd"),
    ("qwen2.5-7b", {"hidden_size": None}, "hidden_size"),
  ],
)
def test_field_the_models_cannot_express_is_one_line(fixture, change, named):
  config = {**raw(fixture), **change}
  config = {k: v for k, v in config.items() if not (v is None and k in change)}
  assert named in refusal(config)


@pytest.mark.parametrize(
  ("fixture", "change", "named"),
  [
    ("deepseek-v3", {"quantization_config": {"quant_method": "fp8", "fmt": "e4m3"}}, "quantization_config"),
    ("deepseek-v3", {"moe_layer_freq": 2}, "moe_layer_freq"),
    ("deepseek-v3", {"topk_method": "sinkhorn"}, "topk_method"),
    ("deepseek-v3", {"n_group": 3}, "expert_groups"),
    ("qwen3-30b-a3b", {"decoder_sparse_step": 2}, "decoder_sparse_step"),
    ("qwen3-30b-a3b", {"mlp_only_layers": [0, 1]}, "mlp_only_layers"),
    ("qwen3-30b-a3b", {"shared_expert_intermediate_size": 5632}, "shared_expert_intermediate_size"),
    ("mixtral-8x7b", {"kv_lora_rank": 512}, "kv_lora_rank"),
    ("mixtral-8x7b", {"num_experts_per_tok": 9}, "experts_per_token"),
  ],
)
def test_moe_layouts_the_models_cannot_express_are_one_line(fixture, change, named):
  assert named in refusal({**raw(fixture), **change})


def test_moe_fixtures_route_as_their_models_do():
  mixtral, qwen, ds = (from_config(DATA / f"{f}.json") for f in ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3"))
  assert (mixtral.expert_d_ff, mixtral.d_ff, mixtral.router_scoring) == (14_336, 14_336, "softmax")
  assert qwen.qk_norm and qwen.router_norm_topk and qwen.num_moe_layers == 48
  assert (ds.router_scoring, ds.router_bias, ds.expert_groups, ds.expert_groups_per_token) == ("sigmoid", True, 8, 4)
  assert ds.is_mla and ds.first_dense_layers == 3 and ds.mtp_layers == 1
  assert any("mtp_layers 1 recorded, not modelled" in n for n in ds.notes)
  # Without the bias (DeepSeek-V2's group_limited_greedy) or groups (greedy), as the Gate ranks.
  assert not from_config({**raw("deepseek-v3"), "topk_method": "group_limited_greedy"}).router_bias
  assert from_config({**raw("deepseek-v3"), "topk_method": "greedy"}).expert_groups == 1


def test_fields_that_do_not_change_memory_are_accepted():
  base = from_config(DATA / "llama3.1-8b.json")
  assert raw("llama3.1-8b")["rope_scaling"]["rope_type"] == "llama3"  # accepted as it is
  extra = {"bos_token_id": 7, "pretraining_tp": 2, "torch_dtype": "float16", "attention_dropout": 0.1, "use_cache": False}
  assert from_config({**raw("llama3.1-8b"), **extra}) == dataclasses.replace(base, name="llama")
  # transformers 5 moves rope_theta into rope_parameters.
  moved = {k: v for k, v in raw("qwen3-8b").items() if k not in ("rope_theta", "rope_scaling")}
  moved["rope_parameters"] = {"rope_type": "default", "rope_theta": 5_000_000.0}
  assert from_config(moved).rope_theta == 5_000_000.0


def test_sliding_window_is_read():
  v01 = {**raw("mistral-7b-v0.3"), "sliding_window": 4096, "vocab_size": 32000}
  cfg = from_config(v01)
  assert cfg.sliding_window == 4096 and cfg.global_every == 0 and cfg.num_windowed_layers == cfg.num_layers
  assert cfg.notes == ()
  assert count_params(cfg) == count_params(dataclasses.replace(cfg, sliding_window=None))
  qwen = from_config({**raw("qwen2.5-7b"), "use_sliding_window": True})
  assert qwen.sliding_window == 131072
  with pytest.raises(JaxmemError, match="sliding_window"):
    dataclasses.replace(cfg, sliding_window=0)


def test_unreadable_files_are_one_line(tmp_path):
  bad = tmp_path / "bad.json"
  bad.write_text("{not json")
  for path in (bad, tmp_path / "missing.json"):
    with pytest.raises(JaxmemError) as err:
      from_config(path)
    assert "\n" not in str(err.value) and path.name in str(err.value)


def test_flags_are_refused_on_gpt2_style():
  for flag in ("qkv_bias", "qk_norm"):
    with pytest.raises(JaxmemError, match=flag):
      get_config("tiny-gpt2", **{flag: True})


# --- the flags in the model --------------------------------------------------------------------

TINY_FLAGS = {
  "plain": {},
  "qkv_bias": {"qkv_bias": True},
  "qk_norm": {"qk_norm": True},
  "both": {"qkv_bias": True, "qk_norm": True},
  "wide_heads_tied": {"qk_norm": True, "head_dim": 32, "tie_embeddings": True},
}


@pytest.mark.parametrize("flags", list(TINY_FLAGS))
def test_tiny_config_with_each_flag_builds_and_matches_the_closed_form(flags):
  cfg = get_config("tiny", **TINY_FLAGS[flags])
  assert built_count(cfg) == count_params(cfg)
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  specs = jax.tree.leaves(
    nnx.get_partition_spec(nnx.state(model, nnx.Param)), is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)
  )
  assert specs and all(axis in LOGICAL_AXES for spec in specs for axis in spec)


def test_flag_parameter_counts_follow_the_shapes():
  base = get_config("tiny")
  l, n, k, h = base.num_layers, base.num_heads, base.num_kv_heads, base.head_dim
  with_bias = get_config("tiny", qkv_bias=True)
  with_norm = get_config("tiny", qk_norm=True)
  assert count_params(with_bias) - count_params(base) == l * (n * h + 2 * k * h)
  assert count_params(with_norm) - count_params(base) == l * 2 * h


@pytest.fixture(scope="module", params=["tiny-qwen2", "tiny-qwen3"])
def tiny_hf(request):
  """(cfg, graphdef, params, jitted forward) for a tiny Qwen2 / Qwen3 config, compiled once."""
  cfg = from_config(DATA / f"{request.param}.json")
  graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param)
  forward = jax.jit(lambda p, t: nnx.merge(graphdef, p)(t))
  return cfg, graphdef, params, forward


def test_tiny_qwen_forward_runs_and_uses_its_flag_parameters(tiny_hf):
  cfg, _, params, forward = tiny_hf
  toks = jax.random.randint(jax.random.key(1), (2, 8), 0, cfg.vocab_size, dtype=jnp.int32)
  logits = forward(params, toks)
  assert logits.shape == (2, 8, cfg.vocab_size) and bool(jnp.all(jnp.isfinite(logits)))
  # The flag's parameters take part: changing them changes the logits.
  name = "b_q_nh" if cfg.qkv_bias else "scale_h"
  bumped = jax.tree_util.tree_map_with_path(
    lambda path, x: x + 0.5 if name in jax.tree_util.keystr(path) else x, copy.deepcopy(params)
  )
  assert not jnp.allclose(forward(bumped, toks), logits)


def test_tiny_qwen_keeps_every_checkpoint_name(tiny_hf):
  cfg, graphdef, params, _ = tiny_hf
  toks = jnp.zeros((2, 8), jnp.int32)
  loss = lambda p: nnx.merge(graphdef, p)(toks).mean()  # noqa: E731
  text = str(jax.make_jaxpr(jax.grad(loss))(params))
  assert set(DENSE_CHECKPOINT_NAMES) <= set(re.findall(r"name=(\w+)", text))


# --- end to end ----------------------------------------------------------------------------------


def test_cli_compare_on_a_config_json(capsys):
  from jaxmem.cli import main

  path = str(DATA / "tiny-qwen3.json")
  # One remat policy (one compile) keeps this fast; the path goes through get_config as any
  # --model does, so the default policies would take the same route three times.
  argv = ["compare", "--model", path, "--target", "cpu", "--batch", "2", "--seq", "16", "--remat", "none"]
  rc = main([*argv, "--format", "json"])
  out = capsys.readouterr().out
  assert rc == 0, out
  rows = json.loads(out)["rows"]
  assert rows and {r["model"] for r in rows} == {"tiny-qwen3"}
  # Parameter bytes follow from the shapes alone: float32 parameters, one device.
  assert all(r["param_bytes"] == 4 * count_params(from_config(path)) for r in rows)
  assert all(r["error"] is None and r["temp_size_in_bytes"] > 0 for r in rows)
  assert main(["compare", "--model", str(DATA / "nope.json"), "--target", "cpu"]) == 2


def test_config_json_notes_and_extras_reach_rows(tmp_path, capsys):
  # A config.json model with a recorded sliding window: its note reaches compare's and infer's
  # rows, and compare's --with-estimate / --with-inference use the plan's config, not a preset
  # lookup by the row's name (which a config.json model does not have).
  from jaxmem.cli import main

  path = tmp_path / "windowed" / "config.json"
  path.parent.mkdir()
  path.write_text(json.dumps({**raw("tiny-qwen2"), "use_sliding_window": True}))
  argv = ["--model", str(path), "--target", "cpu", "--batch", "2", "--format", "json"]
  assert main(["compare", *argv, "--seq", "16", "--remat", "none", "--with-estimate", "--with-inference"]) == 0
  doc = json.loads(capsys.readouterr().out)
  (row,) = doc["rows"]
  assert row["model"] == "windowed"
  assert {e["component"] for e in doc["estimate"]} >= {"params", "temp"}
  assert [s["workload"] for s in doc["inference"]] == ["train", "decode"] and doc["inference"][1]["model"] == "windowed"
  assert main(["infer", *argv, "--phase", "decode", "--context", "32"]) == 0
  (irow,) = json.loads(capsys.readouterr().out)["rows"]
  assert irow["model"] == "windowed"
