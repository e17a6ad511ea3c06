"""vLLM's KV cache sizing, on TPU (its JAX backend, vllm-project/tpu-inference) and on GPU.

The rule, read from each backend's source (each constant below cites where it is set):

- **TPU** (tpu-inference ``tpu_inference/worker/tpu_worker.py``, ``TPUWorker.determine_available_memory``):
  no forward pass is profiled. After the weights load, the KV budget is summed over the devices:
  ``sum(bytes_limit * gpu_memory_utilization - bytes_in_use)``, ``bytes_limit`` the runtime's HBM
  limit (the compiler's available HBM, v6e: 31.25 GiB, the figure tpu-inference PR #145 logs) and
  ``bytes_in_use`` the stored weights (jaxmem's compiled arguments). (At PR #145's commit the rule
  was ``utilization x (limit - used)``, changed to this one by PR #734.)
- **GPU** (vLLM ``vllm/v1/worker/gpu_worker.py``, ``Worker.determine_available_memory``): a forward
  pass of ``max_num_batched_tokens`` tokens is profiled (``GPUModelRunner.profile_run``, attention
  skipped), then per worker ``total * gpu_memory_utilization - (weights + peak activation +
  non-torch memory)`` (``vllm/utils/mem_utils.py``, ``memory_profiling``'s ``non_kv_cache_memory``).
  jaxmem compiles that forward pass (a prefill of ``max_num_batched_tokens`` tokens) and takes its
  temporaries as the peak activation; the sampler's logits (``_dummy_sampler_run``: one float32 row
  of the vocabulary per request) are added by the engine's arithmetic; the CUDA context, NCCL and
  cuBLAS memory vLLM measures as non-torch memory cannot be had without the GPU (not counted).
- **Blocks** (``vllm/v1/core/kv_cache_utils.py``, ``get_num_blocks``): ``budget // page_size //
  num_layers``, a page being one layer's ``block_size`` tokens; the tokens are ``num_blocks *
  block_size`` (``_report_kv_cache_config``, "GPU KV cache size: N tokens"), and a request of
  ``max_model_len`` needs ``cdiv(max_model_len, block_size)`` blocks
  (``get_max_concurrency_for_kv_cache_config``). vLLM's page is ``2 * block_size * num_kv_heads *
  head_size * dtype_size`` (``vllm/v1/kv_cache_interface.py``, ``AttentionSpec.page_size_bytes``);
  on TPU the ragged paged attention kernel's page is its cache array for one page
  (``tpu_inference/runner/kv_cache.py``, ``get_kv_cache_shape_with_mesh``; the kernel's
  ``get_kv_cache_shape``: ``(pages, page_size, align(kv_heads_per_device * 2, packing) // packing,
  packing, align(head_dim, 128))``, ``packing = 32 // bits``), which pads where a device holds
  fewer combined k and v heads than a 32-bit word packs: PR #757 (Llama 3.1 70B w8a8, TP 8, fp8 KV:
  one kv head a device, two fp8 values in a word of four, so twice vLLM's page and half its
  blocks: 8,676 -> 4,338). tpu-inference counts with the kernel's page (PR #757's
  ``num_gpu_blocks_override``; now the spec's ``page_size_padded``, PR #1395); PR #1285 pads a
  hybrid attention model's pages further (not modelled: local-attention models are refused).
- **Block size**: GPU, ``CacheConfig.DEFAULT_BLOCK_SIZE`` (16, ``vllm/config/cache.py``); TPU,
  ``PallasAttentionBackend.get_page_size`` (``tpu_inference/layers/vllm/backends/flash_attn.py``:
  16 past a ``max_model_len`` of 8192, else ``next_power_of_2(max_model_len) // 16`` within 16 to
  256) raised to ``get_min_page_size`` (the block table in half of the 1 MiB SMEM), as
  ``TPUPlatform.check_and_update_config`` applies them.
- **Batch defaults** (``vllm/engine/arg_utils.py``, ``EngineArgs``' batch defaults for
  ``vllm serve``, the OpenAI server's usage context): ``max_num_batched_tokens`` 8192 and
  ``max_num_seqs`` 1024 on a GPU of 70 GiB or more that is not an A100, else 2048 and 256; on TPU
  1024 tokens on v6e, 512 on v5e, 256 on v5p.
- **Headroom** (TPU): what the budget leaves, ``(1 - utilization) * limit`` a device, must hold
  the programs the runtime loads beside the cache, in one contiguous reservation: tpu-recipes #151
  (GPT-OSS on tpu7x: "Attempting to reserve 6.14G at the bottom of memory" at 0.93, starts at
  0.83), tpu-inference PR #3408 (Gemma 4 on tpu7x fails to load ``jit__forward`` at 0.98). jaxmem
  compiles the forward at ``max_num_batched_tokens`` and gives the largest utilization at which
  its temporaries and code still fit: an upper bound (the reservation must also be contiguous).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

from jaxmem.errors import JaxmemError
from jaxmem.hardware.targets import Target
from jaxmem.inference import quant
from jaxmem.inference.engines.base import (
    COMPILER, ENGINE, TARGET, UNMODELLED, Engine, EngineCapacity, EngineRequest, Term, cdiv, compile_program,
    compiled_bytes, ladder, no_row_note, one_mesh_axis,
)
from jaxmem.inference.kv import KvCacheDtype
from jaxmem.launch import Emitter, Launch
from jaxmem.models import ModelConfig
from jaxmem.program import sharding as shd

# vLLM's default share of the device (CacheConfig.gpu_memory_utilization): 0.9 through the
# releases tpu-inference's published runs used (PR #145's; vLLM v0.6.4's engine arguments:
# "If unspecified, will use the default value of 0.9"); vLLM main's vllm/config/cache.py now
# defaults to 0.92. --emit vllm always writes the value used, so a launch never rests on it.
DEFAULT_UTILIZATION = 0.9
GPU_BLOCK_SIZE = 16  # vllm/config/cache.py, CacheConfig.DEFAULT_BLOCK_SIZE
# tpu_inference/layers/vllm/backends/flash_attn.py, PallasAttentionBackend.get_page_size and
# get_min_page_size: the block table must fit in half of the 1 MiB SMEM ("up to v6e").
TPU_LONG_CONTEXT, TPU_MIN_BLOCK, TPU_MAX_BLOCK, TPU_SMEM_BYTES = 8192, 16, 256, 1 << 20
# vllm/engine/arg_utils.py, the OpenAI server's defaults (vllm serve's usage context).
LARGE_GPU_BYTES = 70 * 2**30
GPU_BATCH_DEFAULTS = {True: (8192, 1024), False: (2048, 256)}  # large GPU -> (batched tokens, seqs)
TPU_BATCHED_TOKENS = {"v6e": 1024, "v5e": 512, "v5p": 256}
SAMPLER_LOGIT_BYTES = 4  # float32 logits (GPUModelRunner._dummy_sampler_run computes them so)
# jaxmem's KV dtype -> vLLM's --kv-cache-dtype (vllm/config/cache.py, CacheDType).
KV_FLAGS = {"bf16": "bfloat16", "fp16": "float16", "fp8": "fp8"}
# jaxmem's weight format -> what vLLM's checkpoint or --quantization holds (a note: vLLM reads
# the format from the checkpoint it is given).
WEIGHT_NOTES = {
    "fp8": "fp8 weights: serve an fp8 checkpoint, or pass --quantization fp8 to quantize bf16 weights at load",
    "int8": "int8 weights: serve an int8 (w8a8 or w8a16) checkpoint; vLLM reads its format from the checkpoint",
    "int4": "int4 weights: serve an int4 (AWQ or GPTQ) checkpoint; vLLM reads its format from the checkpoint",
}


@dataclasses.dataclass(frozen=True)
class Geometry:
  """One model's KV cache as vLLM lays it out on a mesh of ``tp`` devices: per layer, per block."""

  layers: int
  kv_heads: int  # the model's, before padding
  head_dim: int
  tp: int
  kv: KvCacheDtype
  platform: str

  @property
  def padded_heads(self) -> int:
    """tpu_inference/utils.py, get_padded_num_heads: fewer kv heads than the TP size are
    replicated up to it; GPU vLLM replicates them too (ModelConfig.get_num_kv_heads: at least one
    a worker)."""
    return max(self.kv_heads, self.tp)

  @property
  def padded_head_dim(self) -> int:
    """tpu_inference/utils.py, get_padded_head_dim: a multiple of 128, but 64 stays (its own kernel)."""
    if self.platform != "tpu" or self.head_dim == 64:
      return self.head_dim
    return cdiv(self.head_dim, 128) * 128

  def spec_page(self, block: int) -> int:
    """vLLM's page of one layer over the whole engine: 2 * block * kv_heads * head_size * bytes
    (AttentionSpec.page_size_bytes; a GPU worker's spec holds its share of the heads, so summed
    over the workers it is the same)."""
    return int(2 * block * self.padded_heads * self.padded_head_dim * self.kv.bits // 8)

  def kernel_page(self, block: int) -> int:
    """The page the attention kernel allocates, one layer over the whole engine: on TPU the ragged
    paged attention kernel's cache shape for one page, its heads axis times the TP size
    (get_kv_cache_shape_with_mesh); on GPU vLLM's own."""
    if self.platform != "tpu":
      return self.spec_page(block)
    packing = 32 // self.kv.bits
    per_device = self.padded_heads // self.tp
    if self.head_dim == 64:  # kernels/ragged_paged_attention/v3/kernel_hd64.py: k and v side by side in 128 lanes
      rows, lanes = cdiv(per_device, packing), 128
    else:
      rows, lanes = cdiv(per_device * 2, packing), cdiv(self.head_dim, 128) * 128
    return int(block * rows * packing * lanes * self.kv.bits // 8 * self.tp)


def geometry(cfg: ModelConfig, tp: int, kv: KvCacheDtype, platform: str) -> Geometry:
  """The model's cache geometry; one line for a cache vLLM's full-attention page does not describe."""
  if cfg.is_mla:
    raise JaxmemError(f"engine vllm: {cfg.name}'s latent (MLA) cache has its own page geometry, not modelled here; "
                      "use the engine jetstream or none")
  if cfg.sliding_window is not None:
    raise JaxmemError(
        f"engine vllm: {cfg.name} has local-attention layers, whose pages vLLM groups and pads apart "
        "(tpu-inference PR #1285), not modelled here; use the engine jetstream or none"
    )
  return Geometry(layers=cfg.num_layers, kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, tp=tp, kv=kv,
                  platform=platform)


def tpu_block_size(max_model_len: int, max_num_seqs: int) -> int:
  """PallasAttentionBackend.get_page_size, raised to get_min_page_size as
  TPUPlatform.check_and_update_config does."""
  if max_model_len > TPU_LONG_CONTEXT:
    block = TPU_MIN_BLOCK
  else:
    block = min(max(_next_power_of_2(max_model_len) // 16, TPU_MIN_BLOCK), TPU_MAX_BLOCK)
  pages_per_request = TPU_SMEM_BYTES // 2 // max_num_seqs // 4
  smallest = _next_power_of_2(cdiv(max_model_len, max(1, pages_per_request)))
  return max(block, smallest)


def _next_power_of_2(n: int) -> int:
  return 1 << (max(1, n) - 1).bit_length()


def batch_defaults(target: Target) -> tuple[int, int]:
  """(max_num_batched_tokens, max_num_seqs) as vllm serve sets them for ``target``'s devices."""
  large = (target.hbm_bytes or 0) >= LARGE_GPU_BYTES and "a100" not in target.device_kind.lower()
  tokens, seqs = GPU_BATCH_DEFAULTS[large]
  if target.platform == "tpu":
    generation = getattr(target.kind, "generation", "")
    tokens = TPU_BATCHED_TOKENS.get(generation, tokens)
  return tokens, seqs


class Vllm(Engine):
  """vLLM: its KV budget, pages and blocks on TPU (tpu-inference) and GPU (module docstring)."""

  name: ClassVar[str] = "vllm"
  description: ClassVar[str] = ("vLLM (vllm serve): KV blocks from gpu_memory_utilization, on TPU (tpu-inference) "
                                 "and GPU")
  settings: ClassVar[tuple[str, ...]] = ("gpu_memory_utilization", "block_size", "max_num_batched_tokens")

  def default_context(self, cfg: ModelConfig) -> int:
    """max_model_len defaults to the model's positions (vLLM's ModelConfig derives its maximum)."""
    return cfg.max_seq_len

  def capacity(self, request: EngineRequest) -> list[EngineCapacity]:
    self.check(request)
    p = request.plan
    if p.target.platform not in ("tpu", "gpu") or p.target.capacity_bytes is None:
      raise JaxmemError(f"engine vllm sizes a TPU's or a GPU's memory; {p.target.name} is neither "
                        "(use tpu:... or gpu:...)")
    if p.kv.name not in KV_FLAGS:
      raise JaxmemError(f"engine vllm: a {p.kv.name} KV cache (`kv_cache_dtype`, else the compute `dtype`) keeps a "
                        f"scale a token and head, which jaxmem does not store; use `kv_cache_dtype` {', '.join(KV_FLAGS)}")
    one_mesh_axis(p, "tensor", self.name)
    for mesh in p.meshes:  # a cache this rule does not describe is refused before any compile
      geometry(p.cfg, dict(mesh).get("tensor", 1), p.kv, p.target.platform)
    given = request.settings
    util = DEFAULT_UTILIZATION if given.gpu_memory_utilization is None else given.gpu_memory_utilization
    if not 0 < util <= 1:
      raise JaxmemError(f"`gpu_memory_utilization` must be a fraction in (0, 1] (got {util})")
    block = request.settings.block_size
    if block is not None and block < 1:
      raise JaxmemError(f"`block_size` must be at least 1 (got {block})")
    default_tokens, default_seqs = batch_defaults(p.target)
    tokens = default_tokens if given.max_num_batched_tokens is None else given.max_num_batched_tokens
    if tokens < 1:
      raise JaxmemError(f"`max_num_batched_tokens` must be at least 1 (got {tokens})")
    out = []
    for mesh in p.meshes:
      for fmt in p.formats:
        # The profiling forward pass, compiled once per (mesh, weights): every context's answer uses it.
        row = compile_program(p, mesh, fmt, phase="prefill", batch=1, context=tokens, on_row=request.on_row)
        for ctx in request.contexts:
          out.append(_Answer(self, p, mesh, fmt, row, util=util, block=block, tokens=tokens,
                             seqs=request.max_seqs, default_seqs=default_seqs, context=ctx).result())
    return out

  def emitter(self) -> Emitter:
    return Emitter(name=self.name, help="vllm serve's flags for the answer", takes=EngineCapacity,
                   what="a vLLM capacity (infer or fit --phase decode with --engine vllm)", write=launch)


@dataclasses.dataclass
class _Answer:
  """One (mesh, weights, context) answered by vLLM's rule."""

  engine: Vllm
  plan: Any
  mesh: shd.MeshSpec
  fmt: quant.WeightFormat
  row: Any
  util: float
  block: int | None
  tokens: int
  seqs: int | None
  default_seqs: int
  context: int

  def result(self) -> EngineCapacity:
    p, cfg, t = self.plan, self.plan.cfg, self.plan.target
    tp = dict(self.mesh).get("tensor", 1)
    geo = geometry(cfg, tp, p.kv, t.platform)
    notes: list[str] = [n for n in (no_row_note(self.row),) if n]
    seqs_for_rules = self.seqs or self.default_seqs
    block = self._block(self.context, seqs_for_rules)
    terms, budget = self._terms(geo, seqs_for_rules)
    kernel_page, spec_page = geo.kernel_page(block), geo.spec_page(block)
    num_blocks = None if budget is None else max(0, budget // kernel_page // geo.layers)
    engine_blocks = None if budget is None else max(0, budget // spec_page // geo.layers)
    per_request = cdiv(self.context, block)
    fits = most = None
    if num_blocks is not None:
      most = num_blocks // per_request
      fits = most >= (self.seqs or 1) and num_blocks >= per_request  # check_enough_kv_cache_memory: one request
      if self.seqs is None:
        most = self._capped(most, notes)
    if kernel_page != spec_page:
      notes.append(
          f"the TPU attention kernel's page is {kernel_page:,} bytes a layer against vLLM's {spec_page:,} (kv heads "
          f"padded to the {32 // geo.kv.bits} values a 32-bit word packs): tpu-inference counts blocks with the "
          f"kernel's, {num_blocks} instead of {engine_blocks} (PR #757)"
      )
    max_util, loads = self._headroom(terms, notes)
    if self.context > cfg.max_seq_len:
      notes.append(f"max_model_len {self.context} is beyond {cfg.name}'s {cfg.max_seq_len} positions; vLLM refuses it "
                   "unless told to (VLLM_ALLOW_LONG_MAX_MODEL_LEN)")
    settings = {"gpu_memory_utilization": self.util, "block_size": block, "max_num_batched_tokens": self.tokens,
                "max_num_seqs": self.seqs if self.seqs is not None else most, "max_model_len": self.context,
                "tensor_parallel_size": tp, "kv_cache_dtype": KV_FLAGS[p.kv.name]}
    return EngineCapacity(
        engine=self.engine.name, model=cfg.name, target=t.name, mesh=shd.format_mesh(self.mesh), weights=self.fmt.name,
        kv_cache_dtype=p.kv.name, num_devices=t.num_devices, settings=settings, context=self.context,
        max_seqs=self.seqs if self.seqs is not None else most, fits=fits, block_size=block, kv_bytes=budget,
        page_bytes=spec_page, kernel_page_bytes=kernel_page, engine_blocks=engine_blocks, num_blocks=num_blocks,
        kv_tokens=None if num_blocks is None else num_blocks * block,
        max_concurrency=None if num_blocks is None else num_blocks / per_request,
        pairs=self._pairs(geo, budget, seqs_for_rules), max_utilization=max_util, loads=loads, terms=tuple(terms),
        notes=tuple(dict.fromkeys(notes)), row=self.row,
    )

  def _block(self, context: int, seqs: int) -> int:
    if self.block is not None:
      return self.block
    return tpu_block_size(context, seqs) if self.plan.target.platform == "tpu" else GPU_BLOCK_SIZE

  def _capped(self, most: int, notes: list[str]) -> int:
    """vLLM requires max_num_batched_tokens >= max_num_seqs (SchedulerConfig's check)."""
    if most > self.tokens:
      notes.append(f"{most} sequences fit, but vLLM takes at most max_num_batched_tokens ({self.tokens}) of them "
                   "(SchedulerConfig); raise max_num_batched_tokens to admit more")
      return self.tokens
    return most

  def _terms(self, geo: Geometry, seqs: int) -> tuple[list[Term], int | None]:
    """The budget's terms per device and the budget over all devices (None where a compiled term is missing)."""
    t, row = self.plan.target, self.row
    n = t.num_devices
    weights = None if row.error else row.weight_bytes_per_device
    temp = compiled_bytes(row, "temp_size_in_bytes")
    code = compiled_bytes(row, "generated_code_size_in_bytes")
    if t.platform == "tpu":
      limit = t.capacity_bytes
      terms = [
          Term(name="hbm limit", bytes=limit, origin=TARGET,
               what="the runtime's bytes_limit a device (the TPU compiler's available HBM)",
               source="tpu_inference/utils.py hbm_usage_bytes (memory_stats bytes_limit)"),
          Term(name="utilization cap", bytes=int(limit * self.util), origin=ENGINE,
               what=f"gpu_memory_utilization {self.util} x the limit",
               source="tpu_inference/worker/tpu_worker.py TPUWorker.determine_available_memory"),
          Term(name="weights", bytes=weights, origin=COMPILER,
               what="the stored weights a device: bytes_in_use after load",
               source="jaxmem's compiled program (argument bytes of the weights)"),
          Term(name="program reservation", bytes=None if temp is None or code is None else temp + code, origin=COMPILER,
               what=f"temporaries and code of the forward pass at max_num_batched_tokens ({self.tokens}): out of the "
               "headroom the cap leaves, not the budget (tpu-inference profiles none)",
               source="jaxmem's compiled prefill program; tpu-recipes #151, tpu-inference PR #3408"),
      ]
      budget = None if weights is None else int(n * (limit * self.util) - n * weights)
    else:
      total = t.hbm_bytes
      logits = min(seqs, self.tokens) * self.plan.cfg.vocab_size * SAMPLER_LOGIT_BYTES
      terms = [
          Term(name="device memory", bytes=total, origin=TARGET, what="the CUDA driver's total (cudaMemGetInfo)",
               source="vllm/v1/worker/gpu_worker.py Worker.determine_available_memory (requested_memory)"),
          Term(name="utilization cap", bytes=int(total * self.util), origin=ENGINE,
               what=f"gpu_memory_utilization {self.util} x the device's memory",
               source="vllm/v1/worker/gpu_worker.py Worker.determine_available_memory"),
          Term(name="weights", bytes=weights, origin=COMPILER, what="the stored weights a device",
               source="jaxmem's compiled program (argument bytes of the weights)"),
          Term(name="peak activation", bytes=temp, origin=COMPILER,
               what=f"temporaries of the forward pass at max_num_batched_tokens ({self.tokens}) tokens",
               source="GPUModelRunner.profile_run; jaxmem's compiled prefill program"),
          Term(name="sampler logits", bytes=logits, origin=ENGINE,
               what=f"min(max_num_seqs, max_num_batched_tokens) = {min(seqs, self.tokens)} float32 rows of the "
               "vocabulary",
               source="GPUModelRunner._dummy_sampler_run"),
          Term(name="non-torch memory", bytes=None, origin=UNMODELLED,
               what="CUDA context, NCCL and cuBLAS buffers vLLM measures during profiling: not counted, so the budget "
               "here is an upper bound by that much (a few hundred MiB to a few GiB)",
               source="vllm/utils/mem_utils.py memory_profiling (non_torch_increase)"),
      ]
      budget = None if weights is None or temp is None else int((total * self.util - (weights + temp + logits)) * n)
    return terms, budget

  def _headroom(self, terms: list[Term], notes: list[str]) -> tuple[float | None, bool | None]:
    """TPU: the largest utilization at which the forward pass's reservation still fits what the
    budget leaves; GPU: none (vLLM's profile counts the activation, the rest is CUDA graphs)."""
    t = self.plan.target
    if t.platform != "tpu":
      notes.append("the share the utilization leaves on a GPU holds CUDA graphs and non-torch memory, which vLLM "
                   "does not subtract from the budget (not modelled)")
      return None, None
    reservation = next(x.bytes for x in terms if x.name == "program reservation")
    if reservation is None:
      return None, None
    most = math.floor(1000 * (1 - reservation / t.capacity_bytes)) / 1000
    loads = self.util <= most
    notes.append(
        f"headroom: at gpu_memory_utilization above {most} the forward pass's {reservation / 2**30:.2f} GiB "
        "(temporaries and code) no longer fit beside the cache; the runtime reserves it contiguously, so its "
        "limit can be lower (tpu-recipes #151: a 6.14 GiB reservation failed at 0.93 on tpu7x, 0.83 started)"
    )
    return most, loads

  def _pairs(self, geo: Geometry, budget: int | None, seqs: int) -> tuple[tuple[int, int], ...]:
    """(max_model_len, the most sequences of it that fit) up to the model's positions."""
    if budget is None:
      return ()
    out = []
    for ctx in ladder(self.plan.cfg.max_seq_len):
      block = self._block(ctx, seqs)
      blocks = budget // geo.kernel_page(block) // geo.layers
      most = min(blocks // cdiv(ctx, block), self.tokens)
      if most >= 1:
        out.append((ctx, most))
    return tuple(out)


def launch(r: EngineCapacity) -> Launch:
  """``vllm serve MODEL`` with the flags of ``r``'s answer (each flag as vllm/engine/arg_utils.py
  EngineArgs.add_cli_args names it)."""
  if r.engine != Vllm.name:
    raise JaxmemError(f"`emit` vllm writes a vLLM capacity; this one is engine {r.engine}'s")
  s = r.settings
  seqs = r.max_seqs
  if not r.fits or not seqs:
    raise JaxmemError(f"no {r.max_seqs or ''} sequences of {r.context} tokens fit, so there is no vllm launch to write")
  argv = ["vllm", "serve", r.model,
          "--tensor-parallel-size", str(s["tensor_parallel_size"]),
          "--max-model-len", str(s["max_model_len"]),
          "--max-num-seqs", str(seqs),
          "--max-num-batched-tokens", str(s["max_num_batched_tokens"]),
          "--gpu-memory-utilization", f"{s['gpu_memory_utilization']:g}",
          "--kv-cache-dtype", s["kv_cache_dtype"],
          "--block-size", str(s["block_size"])]
  notes = ["MODEL is jaxmem's model name: give vllm serve the checkpoint's Hub id or path"]
  if r.weights in WEIGHT_NOTES:
    notes.append(WEIGHT_NOTES[r.weights])
  if r.loads is False:
    notes.append(f"gpu_memory_utilization {s['gpu_memory_utilization']} leaves too little for the forward pass's "
                 f"program (at most {r.max_utilization}); lower it")
  return Launch(tool="vllm", argv=tuple(argv), notes=tuple(notes))
