"""The training runs tpu-recipes publishes with a measured step time, each as its recipe ran it.

tpu-recipes (AI-Hypercomputer/tpu-recipes, read at c8cfe2f, 2026-08-07): the table of
``training/ironwood/README.md`` (model, chips, global batch, sequence, precision, step time,
TFLOP/s and tokens/s a chip) and each row's ``run_recipe.sh`` (``MAXTEXT_ARGS``) and ``README.md``
(the versions it ran on), at the commit that published the row's number where the script changed
since; and DeepSeek-V3 on v5p-1024 (``training/v5p/DeepSeek3-671B-MaxText/README.md``, its step-11
log line, with MaxText's ``benchmarks/maxtext_v5p_model_configs.py::deepseek3_671b_v5p_1024`` at
the commit it names). Left out: wan2.1-14b (a MaxDiffusion run, not MaxText's train step).

How the Ironwood step times were measured is not stated (their scripts run 30 steps and log each);
the v5p row is one logged step after warm-up.

``overrides`` are the script's ``MAXTEXT_ARGS`` as published, less the options that set no part of
the compiled program (paths, steps, profiler, checkpointing, tokenizer, dataset: train_compile feeds
shapes only; ``skip_jax_distributed_system``). :func:`for_maxtext` turns them into what MaxText
0.2.5 (the ``maxtext`` extra) accepts, naming each change. :data:`XLA_FLAGS`: the flags each script
passes libtpu (``LIBTPU_INIT_ARGS``), which :mod:`calibrate_steptime` compiles with (the Llama 3.1
70B step, for one, needs the scoped VMEM they raise: without them libtpu refuses it,
"CompileTimeScopedVmemOom"); :mod:`published_runs` does not pass them (each case says so). Plain
data: :mod:`published_runs` makes its cases of these and :mod:`calibrate_steptime` its runs.
"""

from __future__ import annotations

import dataclasses

TR = "tpu-recipes @c8cfe2f"
IRONWOOD = "training/ironwood"

# MaxText renamed or removed recipe keys after the recipes' versions (MaxText's base.yml history):
# fsdp_shard_on_exp became shard_exp_on_fsdp (a0fceb5 / maxtext-v0.2.0, same meaning); the v5p
# recipe's tile_batch_seq / tile_embed_dim / tile_mlp_dim became the 18 wi_/wo_tile_* keys, whose
# 0.2.5 defaults are the recipe's 512 / 1024 / 1024; the *_buffer_count keys (the kernels' VMEM
# pipelining depth) are gone by maxtext-v0.2.2.
RENAMED = {"fsdp_shard_on_exp": "shard_exp_on_fsdp"}
# MaxText 0.2.5 refuses random routing without expert parallelism (configs/types.py: "When EP rank
# is 1, use_random_routing must be False"), which the recipes that set it (none uses an expert
# axis) ran with; their compile routes with the learned router instead, said.
WITHOUT_EXPERT_AXIS = ("use_random_routing",)
REMOVED = ("tile_batch_seq", "tile_embed_dim", "tile_mlp_dim")
REMOVED_SUFFIX = "_buffer_count"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Recipe:
  """One published run: ``slice`` as the recipe names it (``tpu7x-4x4x4``; ``v5p-1024``), its
  ``overrides`` as published, the step it was measured at (``step_s``) and what else the table
  gives (``measured``), the ``script`` at ``commit`` (the one that published the number) and the
  ``versions`` its README names. ``needs``: what jaxmem lacks to build it (the case is skipped)."""

  name: str
  slice: str
  step_s: float
  measured: str
  script: str
  commit: str
  versions: str
  configuration: str
  overrides: tuple[str, ...]
  needs: str | None = None


def _o(text: str) -> tuple[str, ...]:
  return tuple(text.split())


V1_5 = "MaxText maxtext-tutorial-v1.5.0 (first tagged v1.4.0), jax 0.8.2.dev20251215, libtpu 0.0.32.dev20251215"
A0FCEB5 = "MaxText a0fceb5, jax 0.9.2.dev20260306, libtpu 0.0.37"
DF1B359 = "MaxText df1b359, jax 0.10.2.dev20260603, libtpu 0.0.42.dev20260603"
FSDP_TRANSPOSE = ("a fsdp_transpose mesh axis (ici_fsdp_transpose_parallelism > 1), which jaxmem's MaxText "
                  "mapping has no axis for")

DEEPSEEK_COMMON = (
    "model_name=deepseek3-671b per_device_batch_size=8.0 max_target_length=4096 dcn_pipeline_parallelism=1 "
    "dcn_data_parallelism=-1 ici_pipeline_parallelism=1 ici_fsdp_transpose_parallelism={t} ici_fsdp_parallelism=-1 "
    "allow_split_physical_axes=True use_iota_embed=True remat_policy=custom decoder_layer_input=offload opt_type=adamw ")
SPLASH_2048 = ("sa_use_fused_bwd_kernel=True sa_block_q=2048 sa_block_kv=2048 sa_block_q_dkv=2048 sa_block_kv_dkv=2048 "
               "sa_block_kv_dkv_compute=2048 sa_block_kv_dq=2048 sa_block_q_dq=2048 attention=flash use_tokamax_splash=True ")
DEEPSEEK_KERNELS = ("cost_estimate_flops_fwd=5000000000000 cost_estimate_flops_bwd=5000000000000 float32_weight_sum=False "
                    "use_tokamax_gmm=True ")
FP8 = "use_qwix_quantization=True quantization=fp8_full "
FP8_FIXED = "weight_quantization_calibration_method=fixed,-224,224 act_quantization_calibration_method=fixed,-224,224"
DEEPSEEK_FP8_TILES = (
    "wi_tile_fwd_batch_seq=128 wi_tile_fwd_embed_dim=7168 wi_tile_fwd_mlp_dim=2048 wi_tile_dlhs_batch_seq=256 "
    "wi_tile_dlhs_embed_dim=2048 wi_tile_dlhs_mlp_dim=3584 wi_tile_drhs_batch_seq=256 wi_tile_drhs_embed_dim=1792 "
    "wi_tile_drhs_mlp_dim=2048 wo_tile_fwd_batch_seq=256 wo_tile_fwd_embed_dim=2048 wo_tile_fwd_mlp_dim=3584 "
    "wo_tile_dlhs_batch_seq=256 wo_tile_dlhs_embed_dim=7168 wo_tile_dlhs_mlp_dim=1024 wo_tile_drhs_batch_seq=256 "
    "wo_tile_drhs_embed_dim=2048 wo_tile_drhs_mlp_dim=1792 ")
GPT_OSS = (
    "model_name=gpt-oss-120b per_device_batch_size=10.0 max_target_length=8192 dtype=bfloat16 weight_dtype=float32 "
    "use_custom_sort_vjp=True fsdp_shard_on_exp=True use_tokamax_gmm=True use_random_routing=True remat_policy=custom "
    "decoder_layer_input=offload mlpwo=offload opt_type=adamw megablox=True sparse_matmul=True use_tokamax_splash=True "
    "sa_block_q=1024 sa_block_kv=1024 sa_block_kv_compute=1024 sa_block_q_dkv=2048 sa_block_kv_dkv=2048 "
    "sa_block_kv_dkv_compute=2048 sa_block_q_dq=2048 sa_block_kv_dq=2048 sa_use_fused_bwd_kernel=True "
    "sa_q_layout=SEQ_MINOR sa_k_layout=SEQ_MINOR sa_v_layout=SEQ_MINOR attention=flash dcn_pipeline_parallelism=1 "
    "dcn_data_parallelism=-1 ici_pipeline_parallelism=1 ici_fsdp_transpose_parallelism=1 ici_fsdp_parallelism=64 "
    "ici_data_parallelism={dp}")
GEMMA4_26B = (
    "model_name=gemma4-26b dtype=bfloat16 per_device_batch_size=16 max_target_length=4096 use_iota_embed=True "
    "num_vocab_tiling=1 {remat} allow_split_physical_axes=True ici_fsdp_transpose_parallelism=1 {mesh} "
    "wi_tile_fwd_embed_dim=2816 wi_tile_dlhs_embed_dim=2816 wi_tile_drhs_embed_dim=2816 wo_tile_fwd_embed_dim=2816 "
    "wo_tile_dlhs_embed_dim=2816 wo_tile_drhs_embed_dim=2816 wi_tile_fwd_mlp_dim=704 wi_tile_dlhs_mlp_dim=704 "
    "wi_tile_drhs_mlp_dim=704 wo_tile_fwd_mlp_dim=704 wo_tile_dlhs_mlp_dim=704 wo_tile_drhs_mlp_dim=704 megablox=True "
    "sparse_matmul=True use_custom_sort_vjp=True attention=flash use_tokamax_splash=True sa_use_fused_bwd_kernel=True "
    "sa_block_q=1024 sa_block_kv=1024 sa_block_kv_compute=512 sa_block_q_dkv=1024 sa_block_kv_dkv=1024 "
    "sa_block_kv_dkv_compute=256 opt_type=adamw")
GEMMA4_SMALL = (
    "model_name={model} scan_layers=False dtype=bfloat16 per_device_batch_size=2 max_target_length=8192 "
    "use_iota_embed=True num_vocab_tiling=8 remat_policy=full allow_split_physical_axes=True ici_data_parallelism=4 "
    "ici_fsdp_parallelism=-1 attention=flash use_tokamax_splash=True sa_use_fused_bwd_kernel=True sa_block_q=1024 "
    "sa_block_kv=1024 sa_block_kv_compute=512 sa_block_q_dkv=1024 sa_block_kv_dkv=1024 sa_block_kv_dkv_compute=256 "
    "opt_type=adamw")
LLAMA70B_8K = (
    "model_name=llama3.1-70b dtype=bfloat16 per_device_batch_size=2 use_iota_embed=True remat_policy=custom "
    "decoder_layer_input=device context=device query_proj=device key_proj=device value_proj=device qkv_proj=device "
    "ici_fsdp_parallelism=-1 opt_type=adamw mu_dtype=bfloat16 ")
LLAMA70B_8K_BF16 = (
    "sa_block_q=2048 sa_block_kv=2048 sa_block_kv_compute=2048 sa_block_q_dkv=2048 sa_block_kv_dkv=2048 "
    "sa_block_kv_dkv_compute=2048 sa_q_layout=SEQ_MINOR sa_k_layout=SEQ_MINOR sa_v_layout=HEAD_DIM_MINOR "
    "sa_use_fused_bwd_kernel=True use_tokamax_splash=True max_target_length=8192 attention=flash")
LLAMA70B_8K_FP8 = (
    "sa_block_q=1024 sa_block_kv=1024 sa_block_kv_compute=512 sa_block_q_dkv=2048 sa_block_kv_dkv=2048 "
    "sa_block_kv_dkv_compute=256 sa_q_layout=SEQ_MINOR sa_k_layout=HEAD_DIM_MINOR sa_v_layout=HEAD_DIM_MINOR "
    "sa_use_fused_bwd_kernel=True use_tokamax_splash=True max_target_length=8192 attention=flash " + FP8 + FP8_FIXED)
LLAMA70B_128K = (
    "model_name=llama3.1-70b dtype=bfloat16 per_device_batch_size=0.125 use_iota_embed=True remat_policy=custom "
    "decoder_layer_input=device context=device query_proj=device key_proj=device value_proj=device mlpwo=device "
    "num_vocab_tiling=4 ici_fsdp_parallelism=-1 ici_context_parallelism=8 opt_type=adam_pax sa_block_q=2048 "
    "sa_block_kv=2048 sa_block_kv_compute=512 sa_block_q_dkv=1024 sa_block_kv_dkv=4096 sa_block_kv_dkv_compute=256 "
    "sa_q_layout=SEQ_MINOR sa_k_layout=HEAD_DIM_MINOR sa_v_layout=SEQ_MINOR sa_use_fused_bwd_kernel=True "
    "dq_reduction_steps=3 use_tokamax_splash=True use_max_logit_estimate=30 max_target_length=131072 attention=flash")
QWEN3 = (
    "model_name=qwen3-235b-a22b per_device_batch_size=16.0 max_target_length=4096 dtype=bfloat16 weight_dtype=float32 "
    "opt_type=adamw remat_policy=custom decoder_layer_input=offload use_custom_sort_vjp=True use_random_routing=True "
    "{exp}=False megablox=False sparse_matmul=True use_tokamax_gmm=True use_tokamax_splash=True "
    "sa_use_fused_bwd_kernel=True attention=flash sa_block_q=1024 sa_block_kv=1024 sa_block_kv_compute=512 "
    "sa_block_q_dkv=2048 sa_block_kv_dkv=2048 sa_block_kv_dkv_compute=1024 sa_block_q_dq=1024 sa_block_kv_dq=1024 "
    "sa_q_layout=HEAD_DIM_MINOR sa_k_layout=SEQ_MINOR sa_v_layout=HEAD_DIM_MINOR dcn_pipeline_parallelism=1 "
    "dcn_data_parallelism=-1 ici_pipeline_parallelism=1 ici_fsdp_transpose_parallelism=1 ici_fsdp_parallelism=-1")
QWEN3_FP8_TILES = (
    "wi_tile_fwd_batch_seq=512 wi_tile_fwd_embed_dim=4096 wi_tile_fwd_mlp_dim=1536 wi_tile_dlhs_batch_seq=512 "
    "wi_tile_dlhs_embed_dim=1536 wi_tile_dlhs_mlp_dim=4096 wi_tile_drhs_batch_seq=1024 wi_tile_drhs_embed_dim=1024 "
    "wi_tile_drhs_mlp_dim=1536 wo_tile_fwd_batch_seq=512 wo_tile_fwd_embed_dim=1536 wo_tile_fwd_mlp_dim=4096 "
    "wo_tile_dlhs_batch_seq=512 wo_tile_dlhs_embed_dim=4096 wo_tile_dlhs_mlp_dim=1536 wo_tile_drhs_batch_seq=512 "
    "wo_tile_drhs_embed_dim=768 wo_tile_drhs_mlp_dim=4096")


def _ironwood(model: str, variant: str, *, xpk: bool = True) -> str:
  return f"{IRONWOOD}/{model}/{variant}/" + ("xpk/" if xpk else "") + "run_recipe.sh"


RECIPES: tuple[Recipe, ...] = (
    Recipe(name="deepseek3-671b-tpu7x-4x4x8-bf16", slice="tpu7x-4x4x8", step_s=27.02,
           measured="27.02 s/step, 607.53 TFLOP/s/chip", script=_ironwood("deepseek3-671b", "4k-bf16-tpu7x-4x4x8"),
           commit="216f3e1", versions=V1_5,
           configuration="DeepSeek-V3 671B, 128 chips (256 devices), FSDP over all, experts sharded on FSDP and "
           "gathered for the kernel, tokamax GMM with random routing, 8 x 4096 a device, decoder input offloaded",
           overrides=_o(DEEPSEEK_COMMON.format(t=1) + "mu_dtype=bfloat16 grad_dtype=bfloat16 use_random_routing=True "
                        "megablox=True sparse_matmul=True use_custom_sort_vjp=True fsdp_shard_on_exp=True " + SPLASH_2048
                        + "use_max_logit_estimate=-1 " + DEEPSEEK_KERNELS)),
    Recipe(name="deepseek3-671b-tpu7x-4x4x8-fp8", slice="tpu7x-4x4x8", step_s=22.47,
           measured="22.47 s/step, 730.60 TFLOP/s/chip", script=_ironwood("deepseek3-671b", "4k-fp8-tpu7x-4x4x8"),
           commit="52ab24d", versions="MaxText 98a3d4c, jax 0.8.3.dev20260104, libtpu 0.0.33.dev20260104",
           configuration="as deepseek3-671b-tpu7x-4x4x8-bf16 in fp8_full (qwix, fixed scales), learned routing, "
           "hand-set GMM tiles",
           overrides=_o(DEEPSEEK_COMMON.format(t=1) + "mu_dtype=bfloat16 grad_dtype=bfloat16 megablox=True "
                        "sparse_matmul=True use_custom_sort_vjp=True fsdp_shard_on_exp=True " + SPLASH_2048
                        + "use_max_logit_estimate=-1 " + DEEPSEEK_KERNELS + FP8 + DEEPSEEK_FP8_TILES + FP8_FIXED)),
    Recipe(name="deepseek3-671b-tpu7x-4x8x8-bf16", slice="tpu7x-4x8x8", step_s=26.79,
           measured="26.79 s/step, 612.66 TFLOP/s/chip",
           script=_ironwood("deepseek3-671b", "4k-bf16-tpu7x-4x8x8", xpk=False), commit="216f3e1", versions=V1_5,
           configuration="DeepSeek-V3 671B, 256 chips (512 devices), FSDP x fsdp_transpose 2, 2-D FSDP sharding of "
           "the experts, 8 x 4096 a device (the December script; HEAD's is an April rewrite)",
           overrides=_o(DEEPSEEK_COMMON.format(t=2) + "mu_dtype=bfloat16 grad_dtype=bfloat16 use_random_routing=True "
                        "megablox=True sparse_matmul=True use_custom_sort_vjp=True fsdp_shard_on_exp=False "
                        "use_2d_fsdp_sharding=True " + SPLASH_2048 + "use_max_logit_estimate=-1 " + DEEPSEEK_KERNELS),
           needs=FSDP_TRANSPOSE),
    Recipe(name="deepseek3-671b-tpu7x-4x8x8-fp8", slice="tpu7x-4x8x8", step_s=22.08,
           measured="22.08 s/step, 743.46 TFLOP/s/chip",
           script=_ironwood("deepseek3-671b", "4k-fp8-tpu7x-4x8x8", xpk=False), commit="216f3e1", versions=V1_5,
           configuration="DeepSeek-V3 671B fp8_full, 256 chips, FSDP x fsdp_transpose 2, two-stage expert gathers, "
           "logit soft cap 15 (the December script)",
           overrides=_o(DEEPSEEK_COMMON.format(t=2) + "megablox=True sparse_matmul=True use_custom_sort_vjp=True "
                        "fsdp_shard_on_exp=True moe_fsdp_use_two_stage_all_gather=True " + SPLASH_2048
                        + "use_max_logit_estimate=22 attn_logits_soft_cap=15 " + DEEPSEEK_KERNELS + FP8
                        + DEEPSEEK_FP8_TILES + FP8_FIXED),
           needs=FSDP_TRANSPOSE),
    Recipe(name="qwen3-235b-a22b-tpu7x-4x8x8-bf16", slice="tpu7x-4x8x8", step_s=30.87,
           measured="30.87 s/step, 629.79 TFLOP/s/chip", script=_ironwood("qwen3-235b-a22b", "4k-bf16-tpu7x-4x8x8"),
           commit="1302a86", versions=A0FCEB5,
           configuration="Qwen3-235B-A22B, 256 chips (512 devices), FSDP over all, experts not sharded on FSDP, "
           "tokamax ragged dot, random routing, 16 x 4096 a device, decoder input offloaded",
           overrides=_o(QWEN3.format(exp="shard_exp_on_fsdp"))),
    Recipe(name="qwen3-235b-a22b-tpu7x-4x8x8-fp8", slice="tpu7x-4x8x8", step_s=27.67,
           measured="27.67 s/step, 702.60 TFLOP/s/chip",
           script=_ironwood("qwen3-235b-a22b", "4k-fp8-tpu7x-4x8x8", xpk=False), commit="5ccfce2",
           versions="MaxText maxtext-tutorial-v1.5.0, jax 0.8.3.dev20251219, libtpu 0.0.33.dev20251219",
           configuration="as qwen3-235b-a22b-tpu7x-4x8x8-bf16 in fp8_full, hand-set GMM tiles",
           overrides=_o(QWEN3.format(exp="fsdp_shard_on_exp") + " " + FP8 + FP8_FIXED + " " + QWEN3_FP8_TILES)),
    *(Recipe(name=f"gpt-oss-120b-tpu7x-{grid}-bf16", slice=f"tpu7x-{grid}", step_s=step,
             measured=f"{step:.2f} s/step, {tflops} TFLOP/s/chip", script=_ironwood("gpt-oss-120b", f"8k-bf16-tpu7x-{grid}"),
             commit="adaaeb4", versions=V1_5,
             configuration=f"GPT-OSS-120B, {chips} chips, FSDP 64 x data {dp}, experts sharded on FSDP, megablox with "
             "tokamax GMM, random routing, 10 x 8192 a device, decoder input and MLP output offloaded",
             overrides=_o(GPT_OSS.format(dp=dp)))
      for grid, chips, dp, step, tflops in (("4x4x4", 64, 2, 17.10, "330.25"), ("4x8x8", 256, 8, 17.12, "329.90"))),
    Recipe(name="gemma4-26b-tpu7x-4x4x4-bf16", slice="tpu7x-4x4x4", step_s=5.54, measured="5.54 s/step, 592.31 TFLOP/s/chip",
           script=_ironwood("gemma4-26b", "4k-bf16-tpu7x-4x4x4"), commit="aa23ecd", versions=DF1B359,
           configuration="Gemma 4 26B (MoE), 64 chips, FSDP over all, megablox with tiles of the model's own sizes, "
           "16 x 4096 a device, remat full (its decoder_layer_input=offload applies to custom only)",
           overrides=_o(GEMMA4_26B.format(remat="remat_policy=full decoder_layer_input=offload",
                                          mesh="ici_fsdp_parallelism=-1"))),
    Recipe(name="gemma4-26b-tpu7x-4x8x8-bf16", slice="tpu7x-4x8x8", step_s=5.54, measured="5.54 s/step, 592.41 TFLOP/s/chip",
           script=_ironwood("gemma4-26b", "4k-bf16-tpu7x-4x8x8"), commit="aa23ecd", versions=DF1B359,
           configuration="Gemma 4 26B (MoE), 256 chips, FSDP 256 x data 2, remat custom naming nothing",
           overrides=_o(GEMMA4_26B.format(remat="remat_policy=custom",
                                          mesh="ici_fsdp_parallelism=256 ici_data_parallelism=2"))),
    *(Recipe(name=f"{model}-tpu7x-4x4x4-bf16", slice="tpu7x-4x4x4", step_s=step,
             measured=f"{step:.2f} s/step, {tflops} TFLOP/s/chip", script=_ironwood(model, "8k-bf16-tpu7x-4x4x4"),
             commit="aa23ecd", versions=DF1B359,
             configuration=f"Gemma 4 {model[7:].upper()} (dense, MaxText {name}), 64 chips, data 4 x FSDP 32, unscanned "
             "layers, 2 x 8192 a device, remat full, vocabulary in 8 tiles",
             overrides=_o(GEMMA4_SMALL.format(model=name)))
      for model, name, step, tflops in (("gemma4-2b", "gemma4-e2b", 0.57, "892.84"), ("gemma4-4b", "gemma4-e4b", 0.97, "1,002.50"))),
    Recipe(name="gemma4-31b-tpu7x-4x4x4-bf16", slice="tpu7x-4x4x4", step_s=12.20, measured="12.20 s/step, 1,057.76 TFLOP/s/chip",
           script=_ironwood("gemma4-31b", "8k-bf16-tpu7x-4x4x4"), commit="d25b533", versions=DF1B359,
           configuration="Gemma 4 31B (dense), 64 chips, FSDP 16 x fsdp_transpose 8, 4 x 8192 a device, splash with "
           "its own blocks for the local layers",
           overrides=_o(
               "model_name=gemma4-31b per_device_batch_size=4 max_target_length=8192 use_iota_embed=True attention=flash "
               "use_tokamax_splash=True sa_use_fused_bwd_kernel=True sa_block_q=2048 sa_block_kv=2048 "
               "sa_block_kv_compute=512 sa_block_q_dkv=1024 sa_block_kv_dkv=2048 sa_block_kv_dkv_compute=1024 "
               "sa_block_q_dq=1024 sa_block_kv_dq=1024 sa_q_layout=SEQ_MINOR sa_k_layout=SEQ_MINOR "
               "sa_v_layout=HEAD_DIM_MINOR use_splash_scheduler=True local_sa_block_q=1024 local_sa_block_kv=1024 "
               "local_sa_block_kv_compute=512 local_sa_block_q_dkv=1024 local_sa_block_kv_dkv=2048 "
               "local_sa_block_kv_dkv_compute=1024 local_use_splash_scheduler=False ici_fsdp_parallelism=16 "
               "ici_fsdp_transpose_parallelism=8 dense_fsdp_use_two_stage_all_gather=True num_vocab_tiling=8 "
               "remat_policy=custom out_proj=device mlpwo=device"),
           needs=FSDP_TRANSPOSE),
    Recipe(name="llama3.1-70b-tpu7x-4x4x4-bf16", slice="tpu7x-4x4x4", step_s=12.20,
           measured="12.20 s/step, 1,207.05 TFLOP/s/chip", script=_ironwood("llama3.1-70b", "8k-bf16-tpu7x-4x4x4"),
           commit="edf6fa7", versions=V1_5,
           configuration="Llama 3.1 70B, 64 chips (128 devices), FSDP 128, 2 x 8192 a device, remat custom with "
           "everything on device, AdamW with bf16 moments, tokamax splash",
           overrides=_o(LLAMA70B_8K + LLAMA70B_8K_BF16)),
    Recipe(name="llama3.1-70b-tpu7x-4x4x4-fp8", slice="tpu7x-4x4x4", step_s=7.93,
           measured="7.93 s/step, 1,854.19 TFLOP/s/chip", script=_ironwood("llama3.1-70b", "8k-fp8-tpu7x-4x4x4"),
           commit="bdc1828", versions=A0FCEB5,
           configuration="as llama3.1-70b-tpu7x-4x4x4-bf16 in fp8_full (qwix, fixed scales), other splash blocks",
           overrides=_o(LLAMA70B_8K + LLAMA70B_8K_FP8)),
    Recipe(name="llama3.1-70b-tpu7x-4x8x8-bf16", slice="tpu7x-4x8x8", step_s=12.27,
           measured="12.27 s/step, 1,199.67 TFLOP/s/chip", script=_ironwood("llama3.1-70b", "8k-bf16-tpu7x-4x8x8"),
           commit="a29f0e4", versions=V1_5, configuration="as llama3.1-70b-tpu7x-4x4x4-bf16 on 256 chips (FSDP 512)",
           overrides=_o(LLAMA70B_8K + LLAMA70B_8K_BF16)),
    Recipe(name="llama3.1-70b-tpu7x-4x8x8-fp8", slice="tpu7x-4x8x8", step_s=7.95,
           measured="7.95 s/step, 1,851.25 TFLOP/s/chip",
           script=_ironwood("llama3.1-70b", "8k-fp8-tpu7x-4x8x8", xpk=False), commit="82a737a", versions=A0FCEB5,
           configuration="as llama3.1-70b-tpu7x-4x4x4-fp8 on 256 chips (FSDP 512)",
           overrides=_o(LLAMA70B_8K + LLAMA70B_8K_FP8)),
    Recipe(name="llama3.1-70b-128k-tpu7x-4x8x8-bf16", slice="tpu7x-4x8x8", step_s=34.02,
           measured="34.02 s/step, 897.94 TFLOP/s/chip", script=_ironwood("llama3.1-70b", "128k-bf16-tpu7x-4x8x8"),
           commit="82a737a", versions=A0FCEB5,
           configuration="Llama 3.1 70B at 131072 tokens, 256 chips, FSDP 64 x context 8, 0.125 sequences a device, "
           "vocabulary in 4 tiles, Adam (pax)",
           overrides=_o(LLAMA70B_128K)),
    Recipe(name="llama3.1-70b-128k-tpu7x-4x8x8-fp8", slice="tpu7x-4x8x8", step_s=30.11,
           measured="30.11 s/step, 1,014.45 TFLOP/s/chip",
           script=_ironwood("llama3.1-70b", "128k-fp8-tpu7x-4x8x8", xpk=False), commit="ad4736a", versions=A0FCEB5,
           configuration="as llama3.1-70b-128k-tpu7x-4x8x8-bf16 in fp8_full (qwix, default calibration)",
           overrides=_o(LLAMA70B_128K + " " + FP8)),
    Recipe(name="llama3.1-405b-tpu7x-4x8x8-bf16", slice="tpu7x-4x8x8", step_s=98.34,
           measured="98.34 s/step, 1,261.40 TFLOP/s/chip",
           script=_ironwood("llama3.1-405b", "8k-bf16-tpu7x-4x8x8", xpk=False), commit="ddfa8bc", versions=A0FCEB5,
           configuration="Llama 3.1 405B, 256 chips, FSDP 512, 3 x 8192 a device, decoder input and MLP output "
           "offloaded, k/v projections kept, vocabulary in 4 tiles",
           overrides=_o(
               "model_name=llama3.1-405b dtype=bfloat16 per_device_batch_size=3 use_iota_embed=True "
               "ici_fsdp_parallelism=-1 remat_policy=custom decoder_layer_input=offload mlpwo=offload key_proj=device "
               "value_proj=device attention=flash sa_block_q=2048 sa_block_kv=2048 sa_block_kv_compute=1024 "
               "sa_block_q_dkv=2048 sa_block_kv_dkv=2048 sa_block_kv_dkv_compute=512 sa_use_fused_bwd_kernel=True "
               "sa_q_layout=SEQ_MINOR sa_k_layout=SEQ_MINOR sa_v_layout=HEAD_DIM_MINOR use_splash_scheduler=True "
               "use_tokamax_splash=True opt_type=adamw mu_dtype=bfloat16 num_vocab_tiling=4 max_target_length=8192")),
    Recipe(name="llama3.1-405b-tpu7x-4x8x8-fp8", slice="tpu7x-4x8x8", step_s=64.37,
           measured="64.37 s/step, 1,927.15 TFLOP/s/chip",
           script=_ironwood("llama3.1-405b", "8k-fp8-tpu7x-4x8x8", xpk=False), commit="24b35b2", versions=A0FCEB5,
           configuration="Llama 3.1 405B fp8_full, 256 chips, FSDP 512, 3 x 8192 a device, decoder input offloaded",
           overrides=_o(
               "model_name=llama3.1-405b dtype=bfloat16 per_device_batch_size=3 use_iota_embed=True remat_policy=custom "
               "decoder_layer_input=offload ici_fsdp_parallelism=-1 opt_type=adamw quantization=fp8_full "
               "use_qwix_quantization=True mu_dtype=bfloat16 use_tokamax_splash=True use_max_logit_estimate=-1 "
               "sa_block_kv=2048 sa_block_kv_compute=256 sa_block_q=1024 sa_block_kv_dkv=2048 "
               "sa_block_kv_dkv_compute=1024 sa_block_q_dkv=2048 sa_k_layout=SEQ_MINOR sa_q_layout=HEAD_DIM_MINOR "
               "sa_v_layout=SEQ_MINOR attention=flash sa_use_fused_bwd_kernel=True max_target_length=8192 " + FP8_FIXED)),
    Recipe(name="deepseek3-671b-v5p-1024", slice="v5p-1024", step_s=90.668,
           measured="90.668 s/step (step 11), 152.415 TFLOP/s/device, 542.108 tokens/s/device",
           script="training/v5p/DeepSeek3-671B-MaxText/README.md; MaxText 3eb77db "
           "benchmarks/maxtext_v5p_model_configs.py::deepseek3_671b_v5p_1024",
           commit="3eb77db", versions="MaxText 3eb77db, jax 0.7.0 (stable)",
           configuration="DeepSeek-V3 671B, v5p-1024 (512 chips), FSDP 512, megablox, 6 x 8192 a device, f32 "
           "weights, decoder input and attention output offloaded",
           overrides=_o(
               "model_name=deepseek3-671b ici_fsdp_parallelism=-1 ici_tensor_parallelism=1 per_device_batch_size=6 "
               "max_target_length=8192 dtype=bfloat16 weight_dtype=float32 megablox=True sparse_matmul=True "
               "scan_layers=True use_custom_sort_vjp=True sa_block_q=2048 sa_block_kv=2048 sa_block_kv_compute=2048 "
               "sa_block_q_dkv=2048 sa_block_kv_dkv=2048 sa_block_kv_dkv_compute=2048 sa_block_q_dq=2048 "
               "sa_block_kv_dq=2048 remat_policy=custom decoder_layer_input=offload out_proj=offload "
               "tile_batch_seq=512 tile_embed_dim=1024 tile_mlp_dim=1024 sa_use_fused_bwd_kernel=False")),
)
BY_NAME = {r.name: r for r in RECIPES}

# Each run's XLA flags as its recipe passes them (LIBTPU_INIT_ARGS='${XLA_FLAGS}' in run_recipe.sh at the
# commit above; the v5p run's are MaxText 3eb77db's benchmarks/xla_flags_library.py sets its config names).
# Flags several runs' recipes pass alike (one family's script at two slices, or bf16 and fp8).
_QWEN3_235B_FLAGS = (
    "--xla_tpu_scoped_vmem_limit_kib=61440 --xla_tpu_enable_sparse_core_collective_offload_all_gather=true "
    "--xla_tpu_enable_sparse_core_collective_offload_all_reduce=true "
    "--xla_tpu_use_single_sparse_core_for_all_gather_offload=true "
    "--xla_tpu_enable_all_experimental_scheduler_features=true "
    "--xla_tpu_enable_scheduler_memory_pressure_tracking=true --xla_tpu_host_transfer_overlap_limit=24 "
    "--xla_tpu_aggressive_opt_barrier_removal=ENABLED --xla_lhs_prioritize_async_depth_over_stall=ENABLED "
    "--xla_tpu_enable_ag_backward_pipelining=true --xla_should_allow_loop_variant_parameter_in_chain=ENABLED "
    "--xla_should_add_loop_invariant_op_in_chain=ENABLED --xla_max_concurrent_host_send_recv=100 "
    "--xla_tpu_scheduler_percent_shared_memory_limit=100 --xla_latency_hiding_scheduler_rerun=2")
_GPT_OSS_120B_FLAGS = (
    "--xla_tpu_scoped_vmem_limit_kib=65536 --xla_tpu_impure_enable_packed_bf16_math_ops=true "
    "--xla_tpu_enable_sparse_core_reduce_scatter_v2=true "
    "--xla_tpu_enable_sparse_core_collective_offload_all_gather=true "
    "--xla_tpu_enable_sparse_core_collective_offload_2d_all_gather=true "
    "--xla_tpu_enable_all_gather_offload_tracing=true --xla_tpu_use_tc_device_shape_on_sc=True "
    "--xla_sc_disable_megacore_partitioning=True --xla_tpu_enable_async_collective_fusion_fuse_all_gather=false "
    "--xla_enable_async_all_gather=true --xla_tpu_prefer_async_allgather_to_allreduce=true "
    "--xla_tpu_enable_sparse_core_collective_offload_all_reduce=true "
    "--xla_tpu_enable_sparse_core_collective_offload_reduce_scatter=true "
    "--xla_tpu_enable_sparse_core_collective_offload_3d_all_gather=true "
    "--xla_tpu_use_single_sparse_core_for_all_gather_offload=true "
    "--xla_tpu_enable_concurrent_sparse_core_offloading=true --xla_max_concurrent_async_all_gathers=2 "
    "--xla_max_concurrent_async_reduce_scatters=2 --xla_tpu_aggressive_opt_barrier_removal=true "
    "--xla_tpu_enable_offloading_gather_to_sparsecore=true --xla_tpu_sparse_core_all_gather_latency_multiplier=1 "
    "--xla_tpu_sparse_core_reduce_scatter_latency_multiplier=3 "
    "--xla_tpu_enable_sparse_core_collective_aggregator=true --xla_tpu_enable_latency_hiding_layer_scheduler=true "
    "--xla_tpu_scheduler_percent_shared_memory_limit=150 "
    "--xla_tpu_enable_layer_scheduler_for_dependent_collectives=true "
    "--xla_tpu_enable_sparse_core_collective_offload_nd_reduce_scatter=true "
    "--xla_tpu_pcie_bandwidth_multiplier=0.03 --xla_tpu_enable_multi_compute_overlap_in_layer_scheduler=true")
_GEMMA4_26B_FLAGS = (
    "--xla_tpu_scoped_vmem_limit_kib=65536 --xla_tpu_bf16_emission_mode=NATIVE_EMISSION "
    "--xla_tpu_enable_sparse_core_reduce_scatter_v2=true "
    "--xla_tpu_enable_sparse_core_collective_offload_all_gather=true "
    "--xla_tpu_enable_sparse_core_collective_offload_2d_all_gather=true "
    "--xla_tpu_use_single_sparse_core_for_all_gather_offload=true "
    "--xla_tpu_enable_sparse_core_collective_offload_all_reduce=true "
    "--xla_tpu_enable_sparse_core_collective_offload_reduce_scatter=true "
    "--xla_tpu_enable_sparse_core_collective_offload_3d_all_gather=true "
    "--xla_tpu_enable_all_gather_offload_tracing=true --xla_tpu_use_tc_device_shape_on_sc=True "
    "--xla_sc_disable_megacore_partitioning=True --xla_enable_async_all_gather=true "
    "--xla_tpu_prefer_async_allgather_to_allreduce=true --xla_tpu_enable_latency_hiding_layer_scheduler=true "
    "--xla_tpu_scheduler_percent_shared_memory_limit=150 "
    "--xla_tpu_enable_layer_scheduler_for_dependent_collectives=true "
    "--xla_tpu_enable_sparse_core_collective_offload_nd_reduce_scatter=true "
    "--xla_tpu_enable_sparse_core_collective_aggregator=true")
_GEMMA4_SMALL_FLAGS = (
    "--xla_tpu_scoped_vmem_limit_kib=65536 --xla_tpu_bf16_emission_mode=NATIVE_EMISSION "
    "--xla_tpu_enable_sparse_core_reduce_scatter_v2=true "
    "--xla_tpu_enable_sparse_core_collective_offload_all_gather=true "
    "--xla_tpu_enable_sparse_core_collective_offload_2d_all_gather=true "
    "--xla_tpu_enable_sparse_core_collective_offload_3d_all_gather=true "
    "--xla_tpu_enable_sparse_core_collective_offload_nd_reduce_scatter=true "
    "--xla_tpu_enable_sparse_core_collective_offload_all_reduce=true "
    "--xla_tpu_enable_sparse_core_collective_offload_reduce_scatter=true "
    "--xla_tpu_use_single_sparse_core_for_all_gather_offload=true --xla_tpu_use_tc_device_shape_on_sc=true "
    "--xla_sc_disable_megacore_partitioning=true --xla_enable_async_all_gather=true "
    "--xla_tpu_prefer_async_allgather_to_allreduce=true --xla_tpu_enable_latency_hiding_layer_scheduler=true "
    "--xla_tpu_enable_layer_scheduler_for_dependent_collectives=true "
    "--xla_tpu_scheduler_percent_shared_memory_limit=150 --xla_tpu_enable_sparse_core_collective_aggregator=true "
    "--xla_tpu_enable_all_gather_offload_tracing=true")
_LLAMA31_70B_8K_FLAGS = (
    "--xla_tpu_scoped_vmem_limit_kib=61440 --xla_tpu_bf16_emission_mode=NATIVE_EMISSION "
    "--xla_tpu_enable_sparse_core_collective_offload_all_reduce=true "
    "--xla_tpu_use_single_sparse_core_for_all_gather_offload=true")
_LLAMA31_70B_128K_FLAGS = (
    "--xla_tpu_scoped_vmem_limit_kib=65536 --xla_tpu_bf16_emission_mode=NATIVE_EMISSION "
    "--xla_tpu_enable_sparse_core_reduce_scatter_v2=true "
    "--xla_tpu_enable_sparse_core_collective_offload_all_gather=true "
    "--xla_tpu_enable_sparse_core_collective_offload_2d_all_gather=true "
    "--xla_tpu_enable_all_gather_offload_tracing=true --xla_tpu_use_tc_device_shape_on_sc=True "
    "--xla_sc_disable_megacore_partitioning=True --xla_tpu_enable_async_collective_fusion_fuse_all_gather=false "
    "--xla_enable_async_all_gather=true --xla_tpu_prefer_async_allgather_to_allreduce=true "
    "--xla_tpu_enable_sparse_core_collective_offload_all_reduce=true "
    "--xla_tpu_enable_sparse_core_collective_offload_reduce_scatter=true "
    "--xla_tpu_enable_sparse_core_collective_offload_3d_all_gather=true "
    "--xla_tpu_use_single_sparse_core_for_all_gather_offload=true")

XLA_FLAGS: dict[str, str] = {
    "deepseek3-671b-tpu7x-4x4x8-bf16": (
        "--xla_tpu_scoped_vmem_limit_kib=65536 --xla_tpu_bf16_emission_mode=NATIVE_EMISSION "
        "--xla_tpu_enable_sparse_core_reduce_scatter_v2=true "
        "--xla_tpu_enable_sparse_core_collective_offload_all_gather=true "
        "--xla_tpu_enable_sparse_core_collective_offload_2d_all_gather=true "
        "--xla_tpu_enable_all_gather_offload_tracing=true --xla_tpu_use_tc_device_shape_on_sc=True "
        "--xla_sc_disable_megacore_partitioning=True --xla_tpu_enable_async_collective_fusion_fuse_all_gather=false "
        "--xla_enable_async_all_gather=true --xla_tpu_prefer_async_allgather_to_allreduce=true "
        "--xla_tpu_enable_sparse_core_collective_offload_all_reduce=true "
        "--xla_tpu_enable_sparse_core_collective_offload_reduce_scatter=true "
        "--xla_tpu_enable_sparse_core_collective_offload_3d_all_gather=true "
        "--xla_tpu_use_single_sparse_core_for_all_gather_offload=true "
        "--xla_tpu_enable_concurrent_sparse_core_offloading=true --xla_tpu_aggressive_opt_barrier_removal=true "
        "--xla_tpu_enable_offloading_gather_to_sparsecore=true --xla_tpu_sparse_core_all_gather_latency_multiplier=1 "
        "--xla_tpu_sparse_core_reduce_scatter_latency_multiplier=3 "
        "--xla_tpu_enable_sparse_core_collective_aggregator=true --xla_tpu_enable_latency_hiding_layer_scheduler=true "
        "--xla_tpu_scheduler_percent_shared_memory_limit=150 "
        "--xla_tpu_enable_layer_scheduler_for_dependent_collectives=true "
        "--xla_tpu_enable_sparse_core_collective_offload_nd_reduce_scatter=true "
        "--xla_tpu_pcie_bandwidth_multiplier=0.03 --xla_tpu_enable_sparse_core_offload_queuing_in_lhs=true "
        "--xla_tpu_enable_multi_compute_overlap_in_layer_scheduler=false "
        "--xla_tpu_enable_3d_reduce_scatter_decomposer=false"),
    "deepseek3-671b-tpu7x-4x4x8-fp8": (
        "--xla_tpu_scoped_vmem_limit_kib=65536 --xla_tpu_bf16_emission_mode=NATIVE_EMISSION "
        "--xla_tpu_enable_sparse_core_reduce_scatter_v2=true "
        "--xla_tpu_enable_sparse_core_collective_offload_all_gather=true "
        "--xla_tpu_enable_sparse_core_collective_offload_2d_all_gather=true "
        "--xla_tpu_enable_all_gather_offload_tracing=true --xla_tpu_use_tc_device_shape_on_sc=True "
        "--xla_sc_disable_megacore_partitioning=True --xla_tpu_enable_async_collective_fusion_fuse_all_gather=false "
        "--xla_enable_async_all_gather=true --xla_tpu_prefer_async_allgather_to_allreduce=true "
        "--xla_tpu_enable_sparse_core_collective_offload_all_reduce=true "
        "--xla_tpu_enable_sparse_core_collective_offload_reduce_scatter=true "
        "--xla_tpu_enable_sparse_core_collective_offload_3d_all_gather=true "
        "--xla_tpu_use_single_sparse_core_for_all_gather_offload=true "
        "--xla_tpu_enable_concurrent_sparse_core_offloading=true --xla_tpu_aggressive_opt_barrier_removal=true "
        "--xla_tpu_enable_offloading_gather_to_sparsecore=true --xla_tpu_accumulate_into_mrb=true "
        "--xla_tpu_mosaic_fusion=false --xla_tpu_pcie_bandwidth_multiplier=0.03 "
        "--xla_tpu_enable_layer_scheduler_for_dependent_collectives=true "
        "--xla_tpu_enable_sparse_core_collective_aggregator=true --xla_tpu_enable_latency_hiding_layer_scheduler=true "
        "--xla_tpu_enable_multi_compute_overlap_in_layer_scheduler=false "
        "--xla_tpu_enable_sparse_core_offload_queuing_in_lhs=true "
        "--xla_tpu_sparse_core_all_reduce_offload_min_size_in_bytes=204800 "
        "--xla_tpu_enable_sparse_core_collective_offload_nd_reduce_scatter=true "
        "--xla_tpu_enable_3d_reduce_scatter_decomposer=false --xla_max_concurrent_async_all_gathers=1 "
        "--xla_tpu_scheduler_percent_shared_memory_limit=140 --xla_tpu_enable_collective_pipeliner=true "
        "--xla_tpu_enable_tree_use_collective_pipeliner=true --xla_latency_hiding_scheduler_rerun=0 "
        "--xla_tpu_host_transfer_overlap_limit=1"),
    "deepseek3-671b-tpu7x-4x8x8-bf16": (
        "--xla_tpu_scoped_vmem_limit_kib=65536 --xla_tpu_bf16_emission_mode=NATIVE_EMISSION "
        "--xla_tpu_enable_sparse_core_reduce_scatter_v2=true "
        "--xla_tpu_enable_sparse_core_collective_offload_all_gather=true "
        "--xla_tpu_enable_sparse_core_collective_offload_2d_all_gather=true "
        "--xla_tpu_enable_all_gather_offload_tracing=true --xla_tpu_use_tc_device_shape_on_sc=True "
        "--xla_sc_disable_megacore_partitioning=True --xla_tpu_enable_async_collective_fusion_fuse_all_gather=false "
        "--xla_enable_async_all_gather=true --xla_tpu_prefer_async_allgather_to_allreduce=true "
        "--xla_tpu_enable_sparse_core_collective_offload_all_reduce=true "
        "--xla_tpu_enable_sparse_core_collective_offload_reduce_scatter=true "
        "--xla_tpu_enable_sparse_core_collective_offload_3d_all_gather=true "
        "--xla_tpu_use_single_sparse_core_for_all_gather_offload=true "
        "--xla_tpu_enable_concurrent_sparse_core_offloading=true --xla_tpu_aggressive_opt_barrier_removal=true "
        "--xla_tpu_enable_offloading_gather_to_sparsecore=true --xla_tpu_sparse_core_all_gather_latency_multiplier=1 "
        "--xla_tpu_sparse_core_reduce_scatter_latency_multiplier=3 "
        "--xla_tpu_enable_sparse_core_collective_aggregator=true --xla_tpu_enable_latency_hiding_layer_scheduler=true "
        "--xla_tpu_scheduler_percent_shared_memory_limit=150 "
        "--xla_tpu_enable_layer_scheduler_for_dependent_collectives=true --xla_tpu_pcie_bandwidth_multiplier=0.03 "
        "--xla_tpu_enable_multi_compute_overlap_in_layer_scheduler=false "
        "--xla_tpu_enable_sparse_core_offload_queuing_in_lhs=true "
        "--xla_tpu_enable_sparse_core_collective_offload_nd_reduce_scatter=true "
        "--xla_tpu_enable_3d_reduce_scatter_decomposer=false"),
    "deepseek3-671b-tpu7x-4x8x8-fp8": (
        "--xla_tpu_scoped_vmem_limit_kib=65536 --xla_tpu_bf16_emission_mode=NATIVE_EMISSION "
        "--xla_tpu_enable_sparse_core_reduce_scatter_v2=true "
        "--xla_tpu_enable_sparse_core_collective_offload_all_gather=true "
        "--xla_tpu_enable_sparse_core_collective_offload_2d_all_gather=true "
        "--xla_tpu_enable_all_gather_offload_tracing=true --xla_tpu_use_tc_device_shape_on_sc=True "
        "--xla_sc_disable_megacore_partitioning=True --xla_tpu_enable_async_collective_fusion_fuse_all_gather=false "
        "--xla_enable_async_all_gather=true --xla_tpu_prefer_async_allgather_to_allreduce=true "
        "--xla_tpu_enable_sparse_core_collective_offload_all_reduce=true "
        "--xla_tpu_enable_sparse_core_collective_offload_reduce_scatter=true "
        "--xla_tpu_enable_sparse_core_collective_offload_3d_all_gather=true "
        "--xla_tpu_use_single_sparse_core_for_all_gather_offload=true "
        "--xla_tpu_enable_concurrent_sparse_core_offloading=true --xla_tpu_aggressive_opt_barrier_removal=true "
        "--xla_tpu_enable_offloading_gather_to_sparsecore=true --xla_tpu_accumulate_into_mrb=true "
        "--xla_tpu_mosaic_fusion=false --xla_tpu_pcie_bandwidth_multiplier=0.03 "
        "--xla_tpu_enable_sparse_core_collective_offload_nd_reduce_scatter=true "
        "--xla_tpu_enable_layer_scheduler_for_dependent_collectives=true "
        "--xla_tpu_enable_sparse_core_collective_aggregator=true --xla_tpu_enable_latency_hiding_layer_scheduler=true "
        "--xla_tpu_enable_multi_compute_overlap_in_layer_scheduler=false "
        "--xla_tpu_enable_sparse_core_offload_queuing_in_lhs=true "
        "--xla_tpu_sparse_core_all_reduce_offload_min_size_in_bytes=204800 --xla_max_concurrent_async_all_gathers=1 "
        "--xla_tpu_scheduler_percent_shared_memory_limit=140 --xla_tpu_data_parallel_opt_different_sized_ops=true "
        "--xla_tpu_enable_collective_pipeliner=true --xla_tpu_enable_ici_rs_pipelining=false "
        "--xla_tpu_enable_tree_use_collective_pipeliner=true --xla_latency_hiding_scheduler_rerun=0 "
        "--xla_tpu_host_transfer_overlap_limit=1 --xla_tpu_ici_rs_pipelining_threshold_kib=1048576 "
        "--xla_tpu_impure_use_lmr_on_gxc=true --xla_tpu_dot_dot_fusion_duplicated=true --xla_tpu_rwb_fusion=false "
        "--xla_tpu_order_dot_after_layout=true --xla_tpu_prefetch_interval_picker_size_override=0 "
        "--xla_tpu_async_copy_bandwidth_scaling_factor=0.5"),
    "qwen3-235b-a22b-tpu7x-4x8x8-bf16": _QWEN3_235B_FLAGS,
    "qwen3-235b-a22b-tpu7x-4x8x8-fp8": _QWEN3_235B_FLAGS,
    "gpt-oss-120b-tpu7x-4x4x4-bf16": _GPT_OSS_120B_FLAGS,
    "gpt-oss-120b-tpu7x-4x8x8-bf16": _GPT_OSS_120B_FLAGS,
    "gemma4-26b-tpu7x-4x4x4-bf16": _GEMMA4_26B_FLAGS,
    "gemma4-26b-tpu7x-4x8x8-bf16": _GEMMA4_26B_FLAGS,
    "gemma4-2b-tpu7x-4x4x4-bf16": _GEMMA4_SMALL_FLAGS,
    "gemma4-4b-tpu7x-4x4x4-bf16": _GEMMA4_SMALL_FLAGS,
    "gemma4-31b-tpu7x-4x4x4-bf16": (
        "--xla_tpu_scoped_vmem_limit_kib=65536 --xla_tpu_bf16_emission_mode=NATIVE_EMISSION "
        "--xla_tpu_enable_sparse_core_collective_offload_all_gather=true "
        "--xla_tpu_enable_sparse_core_collective_offload_2d_all_gather=true "
        "--xla_tpu_enable_sparse_core_collective_offload_3d_all_gather=true "
        "--xla_tpu_enable_sparse_core_collective_offload_nd_reduce_scatter=true "
        "--xla_tpu_enable_sparse_core_collective_offload_all_reduce=true "
        "--xla_tpu_enable_sparse_core_collective_offload_reduce_scatter=true "
        "--xla_tpu_enable_sparse_core_reduce_scatter_v2=true "
        "--xla_tpu_use_single_sparse_core_for_all_gather_offload=true --xla_tpu_use_tc_device_shape_on_sc=true "
        "--xla_sc_disable_megacore_partitioning=true --xla_enable_async_all_gather=true "
        "--xla_tpu_prefer_async_allgather_to_allreduce=true --xla_tpu_enable_latency_hiding_layer_scheduler=true "
        "--xla_tpu_enable_layer_scheduler_for_dependent_collectives=true "
        "--xla_tpu_scheduler_percent_shared_memory_limit=150 --xla_tpu_enable_sparse_core_collective_aggregator=true "
        "--xla_tpu_enable_all_gather_offload_tracing=true"),
    "llama3.1-70b-tpu7x-4x4x4-bf16": _LLAMA31_70B_8K_FLAGS,
    "llama3.1-70b-tpu7x-4x4x4-fp8": _LLAMA31_70B_8K_FLAGS,
    "llama3.1-70b-tpu7x-4x8x8-bf16": _LLAMA31_70B_8K_FLAGS,
    "llama3.1-70b-tpu7x-4x8x8-fp8": _LLAMA31_70B_8K_FLAGS,
    "llama3.1-70b-128k-tpu7x-4x8x8-bf16": _LLAMA31_70B_128K_FLAGS,
    "llama3.1-70b-128k-tpu7x-4x8x8-fp8": _LLAMA31_70B_128K_FLAGS,
    "llama3.1-405b-tpu7x-4x8x8-bf16": (
        "--xla_tpu_bf16_emission_mode=NATIVE_EMISSION --xla_tpu_enable_sparse_core_reduce_scatter_v2=true "
        "--xla_tpu_use_single_sparse_core_for_all_gather_offload=true "
        "--xla_tpu_enable_sparse_core_collective_offload_all_gather=true "
        "--xla_tpu_enable_sparse_core_collective_offload_2d_all_gather=true "
        "--xla_tpu_enable_sparse_core_collective_offload_3d_all_gather=true "
        "--xla_tpu_enable_all_gather_offload_tracing=true --xla_tpu_use_tc_device_shape_on_sc=True "
        "--xla_sc_disable_megacore_partitioning=True --xla_tpu_enable_async_collective_fusion_fuse_all_gather=false "
        "--xla_enable_async_all_gather=true --xla_tpu_prefer_async_allgather_to_allreduce=true "
        "--xla_tpu_enable_sparse_core_collective_offload_all_reduce=true "
        "--xla_tpu_enable_sparse_core_collective_offload_reduce_scatter=true --xla_tpu_scoped_vmem_limit_kib=65536 "
        "--xla_tpu_enable_sparse_core_offload_queuing_in_lhs=true --xla_tpu_enable_ici_ar_pipelining=true"),
    "llama3.1-405b-tpu7x-4x8x8-fp8": (
        "--xla_tpu_bf16_emission_mode=NATIVE_EMISSION --xla_tpu_enable_sparse_core_reduce_scatter_v2=true "
        "--xla_tpu_use_single_sparse_core_for_all_gather_offload=true "
        "--xla_tpu_enable_sparse_core_collective_offload_all_gather=true "
        "--xla_tpu_enable_sparse_core_collective_offload_2d_all_gather=true "
        "--xla_tpu_enable_sparse_core_collective_offload_3d_all_gather=true "
        "--xla_tpu_enable_all_gather_offload_tracing=true --xla_tpu_use_tc_device_shape_on_sc=True "
        "--xla_sc_disable_megacore_partitioning=True --xla_tpu_enable_async_collective_fusion_fuse_all_gather=false "
        "--xla_enable_async_all_gather=true --xla_tpu_prefer_async_allgather_to_allreduce=true "
        "--xla_tpu_enable_sparse_core_collective_offload_all_reduce=true "
        "--xla_tpu_enable_sparse_core_collective_offload_reduce_scatter=true --xla_tpu_scoped_vmem_limit_kib=65536"),
    "deepseek3-671b-v5p-1024": (
        "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=false "
        "--xla_tpu_enable_async_collective_fusion_fuse_all_reduce=false "
        "--xla_tpu_enable_async_collective_fusion_fuse_reduce_scatter=false "
        "--xla_tpu_enable_sparse_core_collective_offload_all_gather=true "
        "--xla_tpu_enable_sparse_core_collective_offload_reduce_scatter=true "
        "--xla_tpu_enable_sparse_core_collective_offload_all_reduce=true "
        "--xla_tpu_enable_all_gather_offload_tracing=true --xla_tpu_enable_reduce_scatter_offload_tracing=true "
        "--xla_tpu_enable_all_reduce_offload_tracing=true --xla_tpu_use_tc_device_shape_on_sc=true "
        "--xla_sc_enable_instruction_fusion=false --xla_sc_disjoint_spmem=false "
        "--xla_sc_disable_megacore_partitioning=true --2a886c8_chip_config_name=megachip_tccontrol "
        "--xla_tpu_enable_all_experimental_scheduler_features=true "
        "--xla_tpu_enable_scheduler_memory_pressure_tracking=true --xla_tpu_host_transfer_overlap_limit=24 "
        "--xla_tpu_aggressive_opt_barrier_removal=ENABLED --xla_lhs_prioritize_async_depth_over_stall=ENABLED "
        "--xla_tpu_enable_ag_backward_pipelining=true --xla_should_allow_loop_variant_parameter_in_chain=ENABLED "
        "--xla_should_add_loop_invariant_op_in_chain=ENABLED --xla_max_concurrent_host_send_recv=100 "
        "--xla_tpu_scheduler_percent_shared_memory_limit=100 --xla_latency_hiding_scheduler_rerun=2 "
        "--xla_tpu_use_minor_sharding_for_major_trivial_input=true "
        "--xla_tpu_relayout_group_size_threshold_for_reduce_scatter=1 --xla_tpu_assign_all_reduce_scatter_layout=true "
        "--xla_tpu_enable_data_parallel_all_reduce_opt=true --xla_tpu_data_parallel_opt_different_sized_ops=true "
        "--xla_tpu_scoped_vmem_limit_kib=81920 --xla_tpu_megacore_fusion_allow_ags=false "
        "--xla_enable_async_collective_permute=true"),
}


def for_maxtext(overrides: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
  """``overrides`` as MaxText 0.2.5 takes them, and what changed (one phrase each): renamed keys
  under their new name, removed keys left out."""
  kept, changed = [], []
  experts = any(o.startswith("ici_expert_parallelism=") and o.split("=")[1] not in ("1", "-1") for o in overrides)
  for item in overrides:
    key, _, value = item.partition("=")
    if key in WITHOUT_EXPERT_AXIS and not experts and value.lower() == "true":
      changed.append(f"{key} left out (MaxText 0.2.5 takes it with an expert axis only: learned routing instead)")
    elif key in RENAMED:
      kept.append(f"{RENAMED[key]}={value}")
      changed.append(f"{key} passed as {RENAMED[key]}")
    elif key in REMOVED or key.endswith(REMOVED_SUFFIX):
      changed.append(f"{key} left out (not in MaxText 0.2.5)")
    else:
      kept.append(item)
  return tuple(kept), tuple(changed)
