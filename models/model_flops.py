"""Model FLOPs of a step: the work the model needs, whatever the program recomputes; what MFU
divides by.

Training (PaLM, Chowdhery et al. 2022, appendix B: 6N + 12LHQT FLOPs per token; Kaplan et al.
2020, section 2.1, has the same 6N with the backward pass at twice the forward, and counts the
attention scores QK^T alone):

  model FLOPs = 6 * N * T + c * 6 * L * T * S * H * (dqk + dv)

with T tokens in the step (batch x seq), N the parameters a token's matrix products use (see
:func:`matmul_params`), L layers, S the sequence length, H query heads and dqk, dv their query/key
and value widths. With dqk = dv = Q the attention term is PaLM's 12 * L * H * Q * T per token of
an S-token sequence: QK^T and AV are 2 * S * H * Q FLOPs each per token forward, times 3 for
forward and backward. ``c`` is 1/2 for a causal model (``causal=True``, what rows use): a token
attends to the positions before it, half the scores on average, and the fused kernels skip the
masked blocks, so a step can run fewer FLOPs than the unhalved count and an MFU formed with it
would read above 100% (MaxText halved it in ``calculate_tflops_training_per_device`` in July
2025 for that reason). ``causal=False`` is PaLM's and Kaplan's convention and MaxText's before
that change: the MFU published with MaxText's v5p/v5e configurations was formed so, and the
calibration against it uses it.

Inference runs the forward pass only: 2 * N * T + c * 2 * L * T * S * H * (dqk + dv), T the
tokens the step produces (prefill: batch x prompt, S the prompt, c = 1/2 as above; decode:
batch, S the cache length, each new token attending to all of it: c = 1).

Recomputation (remat) is not model work: it is in the program's FLOPs (the rows' ``flops``) and
not here, so MFU falls as remat recomputes more, as it should.
"""

from __future__ import annotations

from .config import ModelConfig
from .counting import count_active_params


def matmul_params(cfg: ModelConfig) -> int:
  """Parameters a token's matrix products use: the active parameters (a MoE token uses its k
  routed experts) less those that are looked up rather than multiplied: the token embedding
  when the output head is a matrix of its own, GPT-2's learned positions and Gemma 4's per-layer
  embedding table (E2B: 2.35B of its 4.63B parameters; its projection is a matrix product and
  stays). With tied embeddings the table is the output head's matrix, counted once. Norm scales
  and biases stay in (they are a rounding error beside the matrices)."""
  n = count_active_params(cfg)
  if not cfg.tie_embeddings:
    n -= cfg.vocab_size * cfg.d_model
  if cfg.style == "gpt2":
    n -= cfg.max_seq_len * cfg.d_model
  n -= cfg.per_layer_vocab * cfg.num_layers * cfg.per_layer_dim if cfg.per_layer_dim else 0
  return n


def _head_widths(cfg: ModelConfig) -> tuple[int, int]:
  if cfg.is_mla:
    return cfg.qk_nope_head_dim + cfg.qk_rope_head_dim, cfg.v_head_dim
  return cfg.head_dim, cfg.head_dim


def _layer_widths(cfg: ModelConfig, widths: int) -> int:
  """L * (dqk + dv) summed over the layers: Gemma 4's global layers have their own head_dim."""
  if not cfg.has_global_geometry:
    return cfg.num_layers * widths
  h = cfg.attention_geometry(None)[1]
  return sum(widths if cfg.layer_window(i) is not None else 2 * h for i in range(cfg.num_layers))


def weight_flops(cfg: ModelConfig, *, tokens: int, training: bool) -> float:
  """The matrix products with the weights alone: 6 * N * T for training, 2 * N * T for a
  forward step. Every program of the model runs at least these, whatever its attention kernel
  skips (a causal kernel halves the attention term), so a per-device count below them is an
  undercount (:func:`jaxmem.steptime.roofline.compute_flops`)."""
  return (6.0 if training else 2.0) * matmul_params(cfg) * tokens


def training_flops(cfg: ModelConfig, *, batch: int, seq: int, causal: bool = True) -> float:
  """Model FLOPs of one training step of ``batch`` sequences of ``seq`` tokens (module
  docstring; ``causal=False``: the attention term not halved, PaLM's convention)."""
  tokens = batch * seq
  dqk, dv = _head_widths(cfg)
  c = 0.5 if causal else 1.0
  return 6.0 * matmul_params(cfg) * tokens + c * 6.0 * tokens * seq * cfg.num_heads * _layer_widths(cfg, dqk + dv)


def inference_flops(cfg: ModelConfig, *, tokens: int, context: int, causal: bool = False) -> float:
  """Model FLOPs of one forward step producing ``tokens`` tokens, each attending to ``context``
  positions (module docstring): ``causal`` for a prefill, whose tokens attend to the prompt
  before them; a decode step's token attends to the whole cache."""
  dqk, dv = _head_widths(cfg)
  c = 0.5 if causal else 1.0
  return 2.0 * matmul_params(cfg) * tokens + c * 2.0 * tokens * context * cfg.num_heads * _layer_widths(cfg, dqk + dv)
