"""Model hyper-parameters, the named presets, and lookup by CLI name.

Preset sources (parameter counts in the tests are checked against these):

* GPT-2: Radford et al. 2019, "Language Models are Unsupervised Multitask Learners", table 2,
  with the sizes of the released checkpoints (124M/355M/774M/1558M; vocab 50257, context
  1024, d_ff = 4 d_model, head_dim 64).
* Llama 3: Llama Team 2024, "The Llama 3 Herd of Models", table 3 (8B/70B/405B), and the
  Llama 3.2 1B/3B model cards (``config.json`` on the Hugging Face hub: tied embeddings).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import jax.numpy as jnp
import numpy as np

from jaxmem.errors import JaxmemError
from jaxmem.registry import Registry

Style = Literal["gpt2", "llama3"]
STYLES: tuple[str, ...] = ("gpt2", "llama3")

# Llama 3.1 / 3.2 context length and RoPE base (Llama 3 paper, section 3.2 and table 3).
_LLAMA3_ROPE_THETA = 500_000.0
_LLAMA3_MAX_SEQ_LEN = 131_072
_LLAMA3_VOCAB = 128_256
_GPT2_VOCAB = 50_257
_GPT2_MAX_SEQ_LEN = 1024


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
  """Everything that fixes a model's parameter shapes and compute dtypes.

  ``style`` picks the architecture family:

  * ``"gpt2"``: pre-LayerNorm (with bias), learned positions (``max_seq_len`` rows), GELU MLP
    and attention projections with biases, tied embeddings, final LayerNorm.
  * ``"llama3"``: pre-RMSNorm, RoPE (``rope_theta``), grouped-query attention
    (``num_kv_heads`` < ``num_heads``), SwiGLU MLP, no biases, final RMSNorm; embeddings tied
    only if ``tie_embeddings``.

  ``param_dtype`` is the storage dtype of the parameters; ``dtype`` is the compute dtype the
  weights are cast to at use. Attention softmax and the output logits are always float32.
  """

  name: str
  style: Style
  vocab_size: int
  d_model: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  d_ff: int
  max_seq_len: int
  tie_embeddings: bool
  norm_eps: float
  rope_theta: float  # unused by "gpt2" (learned positions)
  param_dtype: str = "float32"
  dtype: str = "bfloat16"

  def __post_init__(self):
    if self.style not in STYLES:
      raise JaxmemError(f"model {self.name!r}: style must be one of {', '.join(STYLES)}, got {self.style!r}")
    for field in ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "head_dim", "d_ff", "max_seq_len"):
      value = getattr(self, field)
      # bool is an int subclass; True layers is a typo, not a size.
      if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise JaxmemError(f"model {self.name!r}: {field} must be a positive integer, got {value!r}")
    if self.num_heads % self.num_kv_heads:
      raise JaxmemError(
        f"model {self.name!r}: num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
      )
    if self.style == "llama3" and self.head_dim % 2:
      raise JaxmemError(f"model {self.name!r}: RoPE needs an even head_dim, got {self.head_dim}")
    if not self.norm_eps > 0:
      raise JaxmemError(f"model {self.name!r}: norm_eps must be > 0, got {self.norm_eps!r}")
    if self.style == "llama3" and not self.rope_theta > 0:
      raise JaxmemError(f"model {self.name!r}: rope_theta must be > 0, got {self.rope_theta!r}")
    for field in ("param_dtype", "dtype"):
      _float_dtype(self.name, field, getattr(self, field))

  @property
  def param_jnp_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.param_dtype)

  @property
  def compute_jnp_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.dtype)

  # --- presets -------------------------------------------------------------------------------

  @classmethod
  def tiny(cls) -> ModelConfig:
    """Llama-3-style toy (GQA, RoPE, SwiGLU, untied) for tests: ~0.1M parameters."""
    return cls(
      name="tiny", style="llama3", vocab_size=256, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2,
      head_dim=16, d_ff=128, max_seq_len=256, tie_embeddings=False, norm_eps=1e-5, rope_theta=10_000.0,
    )

  @classmethod
  def tiny_gpt2(cls) -> ModelConfig:
    """GPT-2-style toy (MHA, learned positions, GELU, tied) for tests: ~0.1M parameters."""
    return cls(
      name="tiny-gpt2", style="gpt2", vocab_size=256, d_model=64, num_layers=2, num_heads=4, num_kv_heads=4,
      head_dim=16, d_ff=256, max_seq_len=256, tie_embeddings=True, norm_eps=1e-5, rope_theta=10_000.0,
    )

  @classmethod
  def gpt2_small(cls) -> ModelConfig:
    return _gpt2("gpt2-small", d_model=768, num_layers=12, num_heads=12)

  @classmethod
  def gpt2_medium(cls) -> ModelConfig:
    return _gpt2("gpt2-medium", d_model=1024, num_layers=24, num_heads=16)

  @classmethod
  def gpt2_large(cls) -> ModelConfig:
    return _gpt2("gpt2-large", d_model=1280, num_layers=36, num_heads=20)

  @classmethod
  def gpt2_xl(cls) -> ModelConfig:
    return _gpt2("gpt2-xl", d_model=1600, num_layers=48, num_heads=25)

  @classmethod
  def llama3_1b(cls) -> ModelConfig:
    """Llama 3.2 1B: head_dim 64, tied embeddings."""
    return _llama3("llama3-1b", d_model=2048, num_layers=16, num_heads=32, head_dim=64, d_ff=8192, tie=True)

  @classmethod
  def llama3_3b(cls) -> ModelConfig:
    """Llama 3.2 3B: tied embeddings."""
    return _llama3("llama3-3b", d_model=3072, num_layers=28, num_heads=24, head_dim=128, d_ff=8192, tie=True)

  @classmethod
  def llama3_8b(cls) -> ModelConfig:
    """Llama 3.1 8B."""
    return _llama3("llama3-8b", d_model=4096, num_layers=32, num_heads=32, head_dim=128, d_ff=14336, tie=False)

  @classmethod
  def llama3_70b(cls) -> ModelConfig:
    """Llama 3.1 70B."""
    return _llama3("llama3-70b", d_model=8192, num_layers=80, num_heads=64, head_dim=128, d_ff=28672, tie=False)

  @classmethod
  def llama3_405b(cls) -> ModelConfig:
    """Llama 3.1 405B."""
    return _llama3("llama3-405b", d_model=16384, num_layers=126, num_heads=128, head_dim=128, d_ff=53248, tie=False)


def _float_dtype(name: str, field: str, value: Any) -> None:
  try:
    dt = jnp.dtype(value)
  except TypeError:
    dt = None
  if dt is None or not jnp.issubdtype(dt, jnp.floating):
    raise JaxmemError(f"model {name!r}: {field} must name a float dtype (e.g. float32, bfloat16), got {value!r}")


def _gpt2(name: str, *, d_model: int, num_layers: int, num_heads: int) -> ModelConfig:
  return ModelConfig(
    name=name, style="gpt2", vocab_size=_GPT2_VOCAB, d_model=d_model, num_layers=num_layers,
    num_heads=num_heads, num_kv_heads=num_heads, head_dim=d_model // num_heads, d_ff=4 * d_model,
    max_seq_len=_GPT2_MAX_SEQ_LEN, tie_embeddings=True, norm_eps=1e-5, rope_theta=10_000.0,
  )


def _llama3(name: str, *, d_model: int, num_layers: int, num_heads: int, head_dim: int, d_ff: int, tie: bool) -> ModelConfig:
  # Every Llama 3 size uses 8 KV heads (Llama 3 paper, table 3).
  return ModelConfig(
    name=name, style="llama3", vocab_size=_LLAMA3_VOCAB, d_model=d_model, num_layers=num_layers,
    num_heads=num_heads, num_kv_heads=8, head_dim=head_dim, d_ff=d_ff, max_seq_len=_LLAMA3_MAX_SEQ_LEN,
    tie_embeddings=tie, norm_eps=1e-5, rope_theta=_LLAMA3_ROPE_THETA,
  )


# CLI name -> preset constructor. Constructors rather than instances so callers always get a
# fresh value to `dataclasses.replace`, and the dict stays cheap to import.
_PRESETS: dict[str, Callable[[], ModelConfig]] = {
  "tiny": ModelConfig.tiny,
  "tiny-gpt2": ModelConfig.tiny_gpt2,
  "gpt2-small": ModelConfig.gpt2_small,
  "gpt2-medium": ModelConfig.gpt2_medium,
  "gpt2-large": ModelConfig.gpt2_large,
  "gpt2-xl": ModelConfig.gpt2_xl,
  "llama3-1b": ModelConfig.llama3_1b,
  "llama3-3b": ModelConfig.llama3_3b,
  "llama3-8b": ModelConfig.llama3_8b,
  "llama3-70b": ModelConfig.llama3_70b,
  "llama3-405b": ModelConfig.llama3_405b,
}

# A read-only Mapping with the same get/parse and one-line errors as the other registries.
PRESETS: Registry[Callable[[], ModelConfig]] = Registry("model", _PRESETS, flag="model")


def get_config(name: str, **overrides: Any) -> ModelConfig:
  """The preset called ``name`` (a key of ``PRESETS``), with fields replaced by ``overrides``.

  Raises:
    JaxmemError: unknown preset name, unknown field, or an override that makes the config
      invalid; the message is one line and lists what is valid.
  """
  if name not in PRESETS:
    raise JaxmemError(f"unknown model {name!r}; valid models: {', '.join(PRESETS)}")
  cfg = PRESETS[name]()
  if not overrides:
    return cfg
  fields = [f.name for f in dataclasses.fields(ModelConfig)]
  unknown = sorted(set(overrides) - set(fields))
  if unknown:
    raise JaxmemError(f"unknown model field(s) {', '.join(unknown)}; valid fields: {', '.join(fields)}")
  return dataclasses.replace(cfg, **overrides)
