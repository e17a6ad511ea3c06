"""Closed-form parameter count of a ModelConfig, without building the model.

With V vocab, D d_model, L layers, N heads, K kv heads, H head_dim, F d_ff, P max_seq_len:

  attention per layer = D*N*H (q) + 2*D*K*H (k, v) + N*H*D (out)
                        + [gpt2] N*H + 2*K*H + D (biases)
                        + [qkv_bias] N*H + 2*K*H (q, k, v biases; Qwen2)
                        + [qk_norm] 2*H (one head_dim scale for q, one for k; Qwen3)
  mlp per layer       = gpt2: 2*D*F + F + D (in/out with biases)
                        llama3: 3*D*F (gate, up, down; no biases)
  norms per layer     = 2 * D (scales) + [gpt2] 2 * D (LayerNorm biases)
  total = V*D (token embedding) + [gpt2] P*D (positions) + [untied] D*V (unembedding)
          + L * (attention + mlp + norms) + D (final norm scale) + [gpt2] D (its bias)

E.g. GPT-2 small: 124,439,808; Llama 3.1 8B: 8,030,261,248; Qwen2.5 7B: 7,615,616,512;
Qwen3 8B: 8,190,735,360 (the published 124M, 8.03B, 7.61B and 8.2B).
The tests check that this equals the number of elements in the built model's parameters.
"""

from __future__ import annotations

from .config import ModelConfig


def count_params(cfg: ModelConfig) -> int:
  """Number of scalar parameters of ``Transformer(cfg)`` (formula in the module docstring)."""
  v, d, l, n, k, h, f = (
    cfg.vocab_size, cfg.d_model, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.d_ff,
  )
  gpt2 = cfg.style == "gpt2"
  attention = d * n * h + 2 * d * k * h + n * h * d + ((n * h + 2 * k * h + d) if gpt2 else 0)
  attention += (n * h + 2 * k * h if cfg.qkv_bias else 0) + (2 * h if cfg.qk_norm else 0)
  mlp = (2 * d * f + f + d) if gpt2 else 3 * d * f
  norms = (4 if gpt2 else 2) * d
  total = v * d + l * (attention + mlp + norms) + (2 if gpt2 else 1) * d
  if gpt2:
    total += cfg.max_seq_len * d
  if not cfg.tie_embeddings:
    total += d * v
  return total
