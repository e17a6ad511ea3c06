"""Closed-form parameter counts of a ModelConfig, without building the model.

With V vocab, D d_model, L layers, N heads, K kv heads, H head_dim, F d_ff, P max_seq_len:

  attention per layer = D*N*H (q) + 2*D*K*H (k, v) + N*H*D (out)
                        + [gpt2] N*H + 2*K*H + D (biases)
                        + [qkv_bias] N*H + 2*K*H (q, k, v biases; Qwen2)
                        + [qk_norm] 2*H (one head_dim scale for q, one for k; Qwen3, Gemma 3)
                        + [qk_norm_full] (N+K)*H (OLMo 2) + [out_bias] D + [attention_sinks] N
                        (Gemma 4's global layers: their own K and H, and D*K*H less with k_eq_v;
                        its KV-shared layers: D*N*H + N*H*D + H, no k/v projections or k_norm)
  mlp per layer       = gpt2: 2*D*F + F + D (in/out with biases)
                        llama3: 3*D*F (gate, up, down; no biases; 3*D*2F in Gemma 4's KV-shared
                        layers with use_double_wide_mlp)
  norms per layer     = 2 * D (scales; 4 * D with norm_layout sandwich) + [gpt2] 2 * D (LayerNorm biases)
  total = V*D (token embedding) + [gpt2] P*D (positions) + [untied] D*V (unembedding)
          + L * (attention + mlp + norms) + D (final norm scale) + [gpt2] D (its bias)
          + [Gemma 4's per-layer embeddings, width Q, vocabulary Vq] Vq*L*Q (their table)
          + D*L*Q (the embeddings' projection) + Q (its norm) + L * (2*D*Q + D) (each layer's
          gate, projection and norm)

E.g. GPT-2 small: 124,439,808; Llama 3.1 8B: 8,030,261,248; Qwen2.5 7B: 7,615,616,512;
Qwen3 8B: 8,190,735,360 (the published 124M, 8.03B, 7.61B and 8.2B).

Multi-head latent attention (models/mla.py) replaces the attention term, with latent widths
Cq (q_lora_rank) and C (kv_lora_rank), per-head sizes Hn (qk_nope), Hr (qk_rope), Hv (v_head):

  mla per layer = [Cq > 0] D*Cq + Cq + Cq*N*(Hn+Hr)  (W^DQ, q_norm, W^UQ;W^QR)
                  [Cq = 0] D*N*(Hn+Hr)
                  + D*(C+Hr) + C + C*N*Hn + C*N*Hv   (W^DKV;W^KR, kv_norm, W^UK, W^UV)
                  + N*Hv*D                           (W^O)

A mixture-of-experts layer (models/moe.py) replaces the MLP term, with E experts, Fe
expert_d_ff and S shared experts:

  moe per layer = D*E (router) + [router_bias] E + E*3*D*Fe (routed) + 3*D*(S*Fe) (shared)
                  + [moe_beside_dense, Gemma 4] D + E (the router's scale and per-expert scale)
                  + 3*D*F (the dense MLP beside the experts) + 3*D (its post-norm, the experts'
                  pre- and post-norms)

and an MoE model has first_dense_layers dense layers and L - first_dense_layers MoE layers.
Active parameters per token (:func:`count_active_params`) count k = experts_per_token routed
experts per MoE layer instead of E, and everything else (embeddings and head included, as the
published "active" figures do).

The tests check that count_params equals the number of elements in the built model's parameters.

A multimodal checkpoint's total (:func:`count_checkpoint_params`) adds its vision tower and
projector, counted from the config (``ModelConfig.vision_params``; Llama 4's is
:func:`llama4_vision_params`), which the text model does not build.
"""

from __future__ import annotations

from .config import ModelConfig


def _attention(cfg: ModelConfig, *, window: int | None = 0, kv_shared: bool = False) -> int:
  """One layer's attention parameters; ``window`` None is a global layer, which in Gemma 4 has
  its own kv heads and head_dim and, with k_eq_v, no v projection (Gemma4TextAttention).
  ``kv_shared``: a Gemma 4 KV-shared layer, q (and q_norm) and o only (Gemma4TextAttention
  builds no k_proj, v_proj, k_norm for it)."""
  d, n = cfg.d_model, cfg.num_heads
  k, h, k_eq_v = cfg.attention_geometry(cfg.sliding_window if window == 0 else window)
  if kv_shared:  # _check_kv_sharing: no biases, sinks or full-width q/k norms with it
    return 2 * d * n * h + (h if cfg.qk_norm else 0)
  if cfg.is_mla:
    cq, c = cfg.q_lora_rank, cfg.kv_lora_rank
    hn, hr, hv = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    query = (d * cq + cq + cq * n * (hn + hr)) if cq else d * n * (hn + hr)
    return query + d * (c + hr) + c + c * n * hn + c * n * hv + n * hv * d
  biases = (n * h + 2 * k * h + d) if cfg.style == "gpt2" else 0
  biases += (n * h + 2 * k * h) if cfg.qkv_bias else 0
  biases += d if cfg.out_bias and cfg.style != "gpt2" else 0
  norms = 2 * h if cfg.qk_norm else ((n + k) * h if cfg.qk_norm_full else 0)
  sinks = n if cfg.attention_sinks else 0
  return d * n * h + (1 if k_eq_v else 2) * d * k * h + n * h * d + biases + norms + sinks


def _dense_mlp(cfg: ModelConfig) -> int:
  d, f = cfg.d_model, cfg.d_ff
  return (2 * d * f + f + d) if cfg.style == "gpt2" else 3 * d * f


def _moe(cfg: ModelConfig, *, routed: int) -> int:
  """One MoE layer's parameters with ``routed`` of its routed experts counted."""
  d, e, fe = cfg.d_model, cfg.num_experts, cfg.expert_d_ff
  router = d * e + (e if cfg.router_bias else 0)
  # Gemma4TextRouter's scale and per_expert_scale; Gemma4TextMLP beside Gemma4TextExperts; the
  # decoder layer's post_feedforward_layernorm_1, pre_feedforward_layernorm_2, post_feedforward_layernorm_2.
  beside = (d + e + _dense_mlp(cfg) + 3 * d) if cfg.moe_beside_dense else 0
  return router + beside + routed * 3 * d * fe + 3 * d * cfg.num_shared_experts * fe


def _count(cfg: ModelConfig, *, routed: int) -> int:
  v, d = cfg.vocab_size, cfg.d_model
  gpt2 = cfg.style == "gpt2"
  norms = (4 if gpt2 or cfg.norm_layout == "sandwich" else 2) * d
  if cfg.has_global_geometry or cfg.kv_shared_layers:  # Gemma 4: layers' attention differs in shape
    attention = sum(
      _attention(cfg, window=cfg.layer_window(i), kv_shared=cfg.layer_shares_kv(i)) for i in range(cfg.num_layers)
    )
  else:
    attention = cfg.num_layers * _attention(cfg)
  layers = attention + cfg.num_layers * norms + cfg.num_dense_layers * _dense_mlp(cfg)
  if cfg.kv_shared_double_mlp:  # use_double_wide_mlp: the shared layers' MLP twice as wide
    layers += cfg.kv_shared_layers * _dense_mlp(cfg)
  layers += cfg.num_moe_layers * _moe(cfg, routed=routed)
  total = v * d + layers + (2 if gpt2 else 1) * d
  if cfg.per_layer_dim:  # Gemma4TextModel.embed_tokens_per_layer, per_layer_model_projection, its norm
    q, lq = cfg.per_layer_dim, cfg.num_layers * cfg.per_layer_dim
    total += cfg.per_layer_vocab * lq + d * lq + q + cfg.num_layers * (2 * d * q + d)
  if gpt2:
    total += cfg.max_seq_len * d
  if not cfg.tie_embeddings:
    total += d * v
  return total


def count_params(cfg: ModelConfig) -> int:
  """Number of scalar parameters of ``Transformer(cfg)`` (formula in the module docstring)."""
  return _count(cfg, routed=cfg.num_experts)


def count_active_params(cfg: ModelConfig) -> int:
  """Parameters one token passes through: every routed expert but the k it chooses left out.
  Equal to :func:`count_params` for a dense model."""
  return _count(cfg, routed=cfg.experts_per_token)


def count_checkpoint_params(cfg: ModelConfig) -> int:
  """The checkpoint's parameters: the text model's (:func:`count_params`) and, for a multimodal
  checkpoint, its vision tower's and projector's (``cfg.vision_params``, not built)."""
  return count_params(cfg) + cfg.vision_params


def llama4_vision_params(vision: dict, text_hidden: int) -> int:
  """Llama 4's vision encoder, pixel-shuffle adapter and projector, from its ``vision_config``
  (transformers' ``Llama4VisionModel`` and ``Llama4MultiModalProjector``, modeling_llama4.py):
  with hidden size h, MLP width I, L layers, patch p, image side s and C channels,

    patch embedding  C*p*p*h (a linear over unfolded patches, no bias)
    class token      h;  positions ((s/p)^2 + 1)*h
    layer norms      pre and post: 2 * 2h (scale and bias)
    per layer        q, k, v, o with biases 4*(h*h + h); fc1, fc2 with biases h*I + I + I*h + h;
                     two LayerNorms 2 * 2h
    adapter          fc1 I x projector_input_dim, fc2 projector_output_dim^2 (no biases)
    projector        vision_output_dim x the text model's hidden size (no bias)
  """
  h, i, layers = vision["hidden_size"], vision["intermediate_size"], vision["num_hidden_layers"]
  p, side, c = vision["patch_size"], vision["image_size"], vision.get("num_channels", 3)
  layer = 4 * (h * h + h) + (h * i + i) + (i * h + h) + 2 * 2 * h
  tower = c * p * p * h + h + ((side // p) ** 2 + 1) * h + 2 * 2 * h + layers * layer
  adapter = i * vision["projector_input_dim"] + vision["projector_output_dim"] ** 2
  return tower + adapter + vision["vision_output_dim"] * text_hidden
