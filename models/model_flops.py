"""Model FLOPs of a step: the work the model needs, whatever the program recomputes; what MFU
divides by.

Training (PaLM, Chowdhery et al. 2022, appendix B: 6N + 12LHQT FLOPs per token; Kaplan et al.
2020, section 2.1, has the same 6N with the backward pass at twice the forward, and counts the
attention scores QK^T alone):

  model FLOPs = 6 * N * T + 6 * L * T * S * H * (dqk + dv)

with T tokens in the step (batch x seq), N the parameters a token's matrix products use (see
:func:`matmul_params`), L layers, S the sequence length, H query heads and dqk, dv their query/key
and value widths. With dqk = dv = Q the attention term is PaLM's 12 * L * H * Q * T per token of
an S-token sequence: QK^T and AV are 2 * S * H * Q FLOPs each per token forward, times 3 for
forward and backward. The causal mask is not halved out (PaLM's and Kaplan's convention, and
MaxText's ``calculate_tflops_training_per_device`` until its July 2025 change, which halved it):
the MFU published with MaxText's v5p/v5e configurations was formed so.

Inference runs the forward pass only: 2 * N * T + 2 * L * T * S * H * (dqk + dv), T the tokens the
step produces (prefill: batch x prompt, S the prompt; decode: batch, S the cache length).

Recomputation (remat) is not model work: it is in the program's FLOPs (the rows' ``flops``) and
not here, so MFU falls as remat recomputes more, as it should.
"""

from __future__ import annotations

from .config import ModelConfig
from .counting import count_active_params


def matmul_params(cfg: ModelConfig) -> int:
  """Parameters a token's matrix products use: the active parameters (a MoE token uses its k
  routed experts) less those that are looked up rather than multiplied: the token embedding
  when the output head is a matrix of its own, and GPT-2's learned positions. With tied
  embeddings the table is the output head's matrix, counted once. Norm scales and biases stay
  in (they are a rounding error beside the matrices)."""
  n = count_active_params(cfg)
  if not cfg.tie_embeddings:
    n -= cfg.vocab_size * cfg.d_model
  if cfg.style == "gpt2":
    n -= cfg.max_seq_len * cfg.d_model
  return n


def _head_widths(cfg: ModelConfig) -> tuple[int, int]:
  if cfg.is_mla:
    return cfg.qk_nope_head_dim + cfg.qk_rope_head_dim, cfg.v_head_dim
  return cfg.head_dim, cfg.head_dim


def training_flops(cfg: ModelConfig, *, batch: int, seq: int) -> float:
  """Model FLOPs of one training step of ``batch`` sequences of ``seq`` tokens (module docstring)."""
  tokens = batch * seq
  dqk, dv = _head_widths(cfg)
  return 6.0 * matmul_params(cfg) * tokens + 6.0 * cfg.num_layers * tokens * seq * cfg.num_heads * (dqk + dv)


def inference_flops(cfg: ModelConfig, *, tokens: int, context: int) -> float:
  """Model FLOPs of one forward step producing ``tokens`` tokens, each attending to ``context``
  positions (module docstring)."""
  dqk, dv = _head_widths(cfg)
  return 2.0 * matmul_params(cfg) * tokens + 2.0 * cfg.num_layers * tokens * context * cfg.num_heads * (dqk + dv)
