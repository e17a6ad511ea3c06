"""The position-wise feed-forward blocks: GELU MLP (GPT-2) and SwiGLU (Llama 3)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from .config import ModelConfig
from .fp8 import Einsum
from .layers import DEFAULT_INIT, Constrain, param
from .names import BATCH, EMBED, MLP, MLPWI, MLPWI_0, MLPWI_1, MLPWO, NORM_SEQ, SEQ


class GeluMLP(nnx.Module):
  """y = gelu(x W_in + b_in) W_out + b_out (Vaswani et al. 2017 with GELU, Hendrycks & Gimpel 2016).

  GPT-2 uses the tanh approximation of GELU (openai/gpt-2 model.py), hence approximate=True.
  """

  def __init__(self, cfg: ModelConfig, *, out_init: nnx.Initializer, rngs: nnx.Rngs, einsum: Einsum = jnp.einsum):
    d, f, pdt = cfg.d_model, cfg.d_ff, cfg.param_jnp_dtype
    self.dtype = cfg.compute_jnp_dtype
    self.einsum = einsum  # the projections' (models/fp8.py: fp8 under quantization fp8_full)
    self.w_in_df = param(rngs, DEFAULT_INIT, (d, f), (EMBED, MLP), pdt)
    self.b_in_f = param(rngs, nnx.initializers.zeros, (f,), (MLP,), pdt)
    self.w_out_fd = param(rngs, out_init, (f, d), (MLP, EMBED), pdt)
    self.b_out_d = param(rngs, nnx.initializers.zeros, (d,), (EMBED,), pdt)

  def __call__(self, x_btd: jax.Array, *, constrain: Constrain) -> jax.Array:
    pre_btf = self.einsum("btd,df->btf", x_btd, self.w_in_df[...].astype(self.dtype))
    pre_btf = pre_btf + self.b_in_f[...].astype(self.dtype)
    # The input projection before the activation: MaxText names a single one "mlpwi", a name
    # jaxmem gives the hidden after the activation, so it carries "mlpwi_0" (the first, and only,
    # input projection) and MaxText's `minimal` policy finds it under that name.
    pre_btf = checkpoint_name(constrain(pre_btf, (BATCH, SEQ, MLP)), MLPWI_0)
    h_btf = jax.nn.gelu(pre_btf, approximate=True)
    h_btf = checkpoint_name(constrain(h_btf, (BATCH, SEQ, MLP)), MLPWI)
    out_btd = self.einsum("btf,fd->btd", h_btf, self.w_out_fd[...].astype(self.dtype))
    out_btd = out_btd + self.b_out_d[...].astype(self.dtype)
    out_btd = constrain(out_btd, (BATCH, NORM_SEQ, EMBED))  # row-parallel: reduced (scattered under SP)
    return checkpoint_name(out_btd, MLPWO)


class SwiGLU(nnx.Module):
  """y = (silu(x W_gate) * (x W_up)) W_down, no biases (Shazeer 2020, eq. 6; Llama); with
  ``cfg.mlp_act`` gelu_tanh, GeGLU (Shazeer 2020, eq. 5, GELU's tanh form: Gemma)."""

  def __init__(self, cfg: ModelConfig, *, out_init: nnx.Initializer, rngs: nnx.Rngs, einsum: Einsum = jnp.einsum):
    d, f, pdt = cfg.d_model, cfg.d_ff, cfg.param_jnp_dtype
    self.dtype = cfg.compute_jnp_dtype
    self.einsum = einsum  # the projections' (models/fp8.py: fp8 under quantization fp8_full)
    self.gelu = cfg.mlp_act == "gelu_tanh"
    self.w_gate_df = param(rngs, DEFAULT_INIT, (d, f), (EMBED, MLP), pdt)
    self.w_up_df = param(rngs, DEFAULT_INIT, (d, f), (EMBED, MLP), pdt)
    self.w_down_fd = param(rngs, out_init, (f, d), (MLP, EMBED), pdt)

  def __call__(self, x_btd: jax.Array, *, constrain: Constrain) -> jax.Array:
    gate_btf = self.einsum("btd,df->btf", x_btd, self.w_gate_df[...].astype(self.dtype))
    up_btf = self.einsum("btd,df->btf", x_btd, self.w_up_df[...].astype(self.dtype))
    # Each input projection is named on its own (MaxText's mlpwi_0 / mlpwi_1) and the hidden
    # after the activation is still "mlpwi", so policies of either vocabulary apply.
    gate_btf = checkpoint_name(constrain(gate_btf, (BATCH, SEQ, MLP)), MLPWI_0)
    up_btf = checkpoint_name(constrain(up_btf, (BATCH, SEQ, MLP)), MLPWI_1)
    h_btf = (jax.nn.gelu(gate_btf, approximate=True) if self.gelu else jax.nn.silu(gate_btf)) * up_btf
    h_btf = checkpoint_name(constrain(h_btf, (BATCH, SEQ, MLP)), MLPWI)
    out_btd = self.einsum("btf,fd->btd", h_btf, self.w_down_fd[...].astype(self.dtype))
    out_btd = constrain(out_btd, (BATCH, NORM_SEQ, EMBED))  # row-parallel: reduced (scattered under SP)
    return checkpoint_name(out_btd, MLPWO)


def make_mlp(cfg: ModelConfig, *, out_init: nnx.Initializer, rngs: nnx.Rngs, einsum: Einsum = jnp.einsum) -> GeluMLP | SwiGLU:
  cls = GeluMLP if cfg.style == "gpt2" else SwiGLU
  return cls(cfg, out_init=out_init, rngs=rngs, einsum=einsum)
