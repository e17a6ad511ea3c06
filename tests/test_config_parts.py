"""The model config composed by concern (issue 39): no record carries more than 30 fields of its
own, ModelConfig is read, built and written flat with the keys it always had (less the step's
choices, which :class:`StepChoices` holds beside it), and a model family is a module the
transformer asks, not branches in it."""

from __future__ import annotations

import dataclasses
import importlib

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from jaxmem.composed import Composed, Record, composed
from jaxmem.errors import JaxmemError
from jaxmem.models import (
  FAMILIES,
  PRESETS,
  Family,
  FeedForwardSpec,
  MLASpec,
  ModelConfig,
  StepChoices,
  Transformer,
  family_of,
  get_config,
)
from jaxmem.models import families as families_module
from jaxmem.models.layers import param
from jaxmem.models.names import EMBED
from test_imports import _modules

MAX_OWN_FIELDS = 30

# ModelConfig's flat layout before it was split by concern (59 fields, in their order then): the
# keys of its dict form, which a task's cache key holds.
OLD_LAYOUT = (
  "name", "style", "vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "head_dim", "d_ff",
  "max_seq_len", "tie_embeddings", "norm_eps", "rope_theta", "param_dtype", "dtype", "qkv_bias", "qk_norm",
  "sliding_window", "global_every", "window_chunked", "mlp_act", "norm_layout", "qk_norm_full", "out_bias",
  "attention_sinks", "attn_softcap", "final_softcap", "global_head_dim", "global_kv_heads", "global_k_eq_v", "v_norm",
  "kv_shared_layers", "kv_shared_double_mlp", "per_layer_dim", "per_layer_vocab", "moe_every", "num_experts",
  "experts_per_token", "num_shared_experts", "expert_d_ff", "first_dense_layers", "router_scoring", "router_norm_topk",
  "routed_scaling", "router_bias", "expert_groups", "expert_groups_per_token", "moe_impl", "capacity_factor",
  "expert_act", "moe_beside_dense", "mtp_layers", "vision_params", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim",
  "qk_rope_head_dim", "v_head_dim", "dropout",
)
# Step choices added after the split (never config fields): the projections' fp8.
ADDED_CHOICES = ("quantization",)
STEP_CHOICES = ("dropout", "moe_impl", "capacity_factor", *ADDED_CHOICES)


def own_fields(cls: type) -> list[str]:
  """The fields a dataclass declares itself (not those of a dataclass it derives from)."""
  inherited = {f.name for base in cls.__mro__[1:] if dataclasses.is_dataclass(base) for f in dataclasses.fields(base)}
  return [f.name for f in dataclasses.fields(cls) if f.name not in inherited]


def records() -> dict[str, type]:
  """Every dataclass declared in a module of jaxmem and its models, by qualified name."""
  out = {}
  for name in sorted(_modules()):
    if name.endswith("__main__"):  # running it is the CLI
      continue
    module = importlib.import_module(name)
    for value in vars(module).values():
      if isinstance(value, type) and dataclasses.is_dataclass(value) and value.__module__ == name:
        out[f"{name}.{value.__qualname__}"] = value
  return out


def too_wide(classes: dict[str, type]) -> dict[str, int]:
  return {name: n for name, cls in classes.items() if (n := len(own_fields(cls))) > MAX_OWN_FIELDS}


def test_the_check_counts_own_fields_and_finds_a_wide_record():
  wide = dataclasses.make_dataclass("Wide", [(f"f{i}", int) for i in range(MAX_OWN_FIELDS + 1)])
  narrow = dataclasses.make_dataclass("Narrow", [("g", int)], bases=(wide,))
  assert too_wide({"Wide": wide, "Narrow": narrow}) == {"Wide": MAX_OWN_FIELDS + 1}


def test_no_record_has_more_than_30_own_fields():
  classes = records()
  assert "jaxmem.models.config.ModelConfig" in classes and "jaxmem.records.Configuration" in classes
  assert too_wide(classes) == {}


def test_model_config_keeps_its_flat_keys_less_the_step_choices():
  assert len(set(OLD_LAYOUT)) == len(OLD_LAYOUT) == 59
  flat = ModelConfig.flat_fields()
  choices = tuple(f.name for f in dataclasses.fields(StepChoices))
  assert sorted(choices) == sorted(STEP_CHOICES)
  assert sorted(flat) == sorted(set(OLD_LAYOUT) - set(STEP_CHOICES))
  for name in PRESETS:
    cfg = get_config(name)
    d = cfg.as_dict()
    assert tuple(d) == flat  # flat, every part's fields, nothing nested
    assert ModelConfig(**d) == cfg  # read back from its dict, as a cached workload's model is
    assert sorted({**d, **StepChoices().as_dict()}) == sorted(OLD_LAYOUT + ADDED_CHOICES)


def test_parts_and_flat_fields_build_the_same_config():
  cfg = get_config("tiny-mla")
  assert isinstance(cfg.mla, MLASpec) and isinstance(cfg.ffn, FeedForwardSpec) and cfg.kv_lora_rank == 16
  flat = ModelConfig(**{**cfg.core.as_dict(), **cfg.norms.as_dict(), **cfg.ffn.as_dict(), **cfg.mla.as_dict()})
  assert flat == cfg and hash(flat) == hash(cfg)
  assert dataclasses.replace(cfg, kv_lora_rank=8).mla == dataclasses.replace(cfg.mla, kv_lora_rank=8)
  # The whole is checked across its parts: MLA's head_dim is its two parts' sum.
  with pytest.raises(JaxmemError, match="head_dim is qk_nope_head_dim"):
    dataclasses.replace(cfg, qk_rope_head_dim=16)
  with pytest.raises(TypeError, match="dropout"):
    ModelConfig(**cfg.as_dict(), dropout=0.1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Low(Record):
  lo: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class _High(Record):
  hi: int = 1


@composed
class _Range(Composed):
  low: _Low
  high: _High

  def __post_init__(self):
    if self.lo > self.hi:
      raise ValueError("lo above hi")


def test_a_composed_record_checks_its_parts_together():
  Range = _Range
  assert Range(lo=1, hi=2).as_dict() == {"lo": 1, "hi": 2}
  with pytest.raises(ValueError, match="lo above hi"):
    Range(lo=3)
  with pytest.raises(ValueError, match="lo above hi"):
    dataclasses.replace(Range(), lo=2)


def test_step_choices_are_not_the_model_and_default_as_every_model_did():
  assert StepChoices() == StepChoices(dropout=0.0, moe_impl="dropless", capacity_factor=1.25)
  cfg = get_config("tiny-moe")
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  assert model.choices == StepChoices()
  capacity = nnx.eval_shape(lambda: Transformer(cfg, choices=StepChoices(moe_impl="capacity"), rngs=nnx.Rngs(0)))
  # The same parameters whatever the step's choices: they are not the model's.
  shapes = lambda m: jax.tree.map(lambda a: (a.shape, a.dtype), nnx.state(m, nnx.Param))  # noqa: E731
  assert shapes(model) == shapes(capacity)
  assert capacity.moe_blocks.mlp.moe_impl == "capacity"


def test_every_preset_has_one_family():
  names = {name: family_of(get_config(name)).name for name in PRESETS}
  assert names["gpt2-small"] == "gpt2" and names["deepseek-v3"] == "mla" and names["llama3-8b"] == "rope"
  assert type(FAMILIES[-1]) is Family  # the base family takes what no other does


class _Scaled(Family):
  """A toy family, declared here alone: a learned scale on the embeddings."""

  name = "scaled"

  def applies(self, cfg: ModelConfig) -> bool:
    return cfg.name == "scaled"

  def init_model(self, model, rngs) -> None:
    model.embed_scale_d = param(rngs, nnx.initializers.zeros, (model.cfg.d_model,), (EMBED,), jnp.float32)

  def embed_positions(self, model, x_btd, where, weights=None):
    return x_btd * model.embed_scale_d[...].astype(x_btd.dtype)


def test_a_new_family_is_a_module_and_one_entry(monkeypatch):
  monkeypatch.setattr(families_module, "FAMILIES", (_Scaled(), *FAMILIES))
  cfg = dataclasses.replace(get_config("tiny"), name="scaled", dtype="float32")
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  assert model.family.name == "scaled" and model.embed_scale_d.shape == (cfg.d_model,)
  tokens = jnp.zeros((1, 4), jnp.int32)
  # A zero scale zeroes the embeddings, so every position's logits are alike.
  logits = model(tokens)
  assert jnp.allclose(logits[0, 0], logits[0, 1], atol=1e-5)
  assert family_of(get_config("tiny")).name == "rope"
