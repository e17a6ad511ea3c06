"""JetStream serving MaxText's engine (MaxEngine): decode slots and the prefill length.

The rule, read from MaxText's source:

- **Slots**: ``MaxEngine.max_concurrent_decodes`` is ``per_device_batch_size * jax.device_count()``
  (``src/maxtext/inference/maxengine/maxengine.py``): the decode state holds that many sequences'
  KV caches of ``max_target_length`` positions each, allocated whole when the engine starts
  (``init_decode_state``), beside the weights, for the server's life. There is no utilization
  fraction: on TPU the runtime's HBM limit is the budget (the compiler checks each program
  against it), on GPU the share of the device JAX's allocator takes (``XLA_PYTHON_CLIENT_MEM_FRACTION``;
  MLPerf's H100 run sets 0.94, ``src/maxtext/inference/mlperf/gpu/benchmarks_llama2-70b-h100_8.sh``).
- **Prefill**: one prompt of up to ``max_prefill_predict_length`` tokens is prefilled at a time
  (``MaxEngine.prefill``; MaxText's ``configs/base.yml`` default 64) into a cache of its own, then
  inserted into the decode state, which stays resident meanwhile.

So the capacity is compiled, not counted: the decode step (``generate``) at ``slots`` sequences of
``max_target_length`` is the program that holds the decode state, and jaxmem's decode fit
(:func:`jaxmem.inference.serving.fit_serving`) finds the most slots whose compiled step fits; the
prefill program at ``max_prefill_predict_length`` must fit beside the decode state's cache too
(its temporaries and prompt cache compiled, the state's bytes from its shapes). Quantized KV
caches (``quantize_kvcache``, ``kv_quant_dtype`` int8 or int4) also keep a scale a token and head,
which jaxmem does not store (a note says so).
"""

from __future__ import annotations

from typing import Any, ClassVar

from jaxmem.errors import JaxmemError
from jaxmem.inference import quant
from jaxmem.inference.engines.base import (
    COMPILER, ENGINE, TARGET, Engine, EngineCapacity, EngineRequest, Term, compile_program, compiled_bytes,
)
from jaxmem.inference.run import InferRow
from jaxmem.inference.serving import fit_serving
from jaxmem.inference.workload import DEFAULT_CONTEXT
from jaxmem.launch import Emitter, Launch
from jaxmem.options import RunOptions
from jaxmem.program import sharding as shd

DEFAULT_PREFILL_LENGTH = 64  # MaxText configs/base.yml, max_prefill_predict_length
# jaxmem's weight format -> MaxText's quantization (configs/base.yml: "int8", "fp8", "int4"); bf16
# weights are MaxText's weight_dtype=bfloat16 with no quantization.
QUANTIZATION = {"int8": "int8", "fp8": "fp8", "int4": "int4"}
KV_QUANT = {"int8": "int8", "int4": "int4", "fp8": "fp8"}  # MaxText's kv_quant_dtype
# jaxmem's mesh axis -> MaxText's ICI parallelism key (configs/base.yml).
MESH_KEYS = {"data": "ici_data_parallelism", "fsdp": "ici_fsdp_parallelism", "tensor": "ici_tensor_parallelism",
             "expert": "ici_expert_parallelism"}


class JetStream(Engine):
  """JetStream over MaxText's MaxEngine: slots of ``max_target_length`` beside the weights."""

  name: ClassVar[str] = "jetstream"
  description: ClassVar[str] = ("JetStream with MaxText's engine: decode slots of max_target_length, prompts of "
                                 "max_prefill_predict_length")
  settings: ClassVar[tuple[str, ...]] = ("max_prefill_length",)

  def default_context(self, cfg: Any) -> int:
    """max_target_length: infer's default context (MaxText's own default is its config's)."""
    return int(DEFAULT_CONTEXT[0])

  def capacity(self, request: EngineRequest) -> list[EngineCapacity]:
    self.check(request)
    p = request.plan
    if p.target.capacity_bytes is None:
      raise JaxmemError(f"engine jetstream sizes a device's memory; {p.target.name} has none (use tpu:... or gpu:...)")
    given = request.settings.max_prefill_length
    prefill = DEFAULT_PREFILL_LENGTH if given is None else given
    if prefill < 1:
      raise JaxmemError(f"`max_prefill_length` must be at least 1 (got {prefill})")
    for mesh in p.meshes:
      other = [a for a, n in mesh if n > 1 and a not in MESH_KEYS]
      if other:
        raise JaxmemError(f"`mesh` {shd.format_mesh(mesh)}: engine jetstream maps {', '.join(MESH_KEYS)} onto "
                          f"MaxText's ICI axes, not {other[0]}")
    out = []
    for mesh in p.meshes:
      for fmt in p.formats:
        pre = compile_program(p, mesh, fmt, phase="prefill", batch=1, context=prefill, on_row=request.on_row)
        for ctx in request.contexts:
          if prefill > ctx:
            raise JaxmemError(f"`max_prefill_length` {prefill} exceeds the context {ctx} (max_target_length)")
          out.append(self._answer(request, mesh, fmt, ctx, prefill, pre))
    return out

  def _answer(self, request: EngineRequest, mesh: shd.MeshSpec, fmt: quant.WeightFormat, ctx: int, prefill: int,
              pre: InferRow) -> EngineCapacity:
    p = request.plan
    decode, nxt, search_note = self._decode(request, mesh, fmt, ctx)
    slots = None if decode is None else decode.batch
    per_slot = None if decode is None else decode.kv_cache_bytes_per_device // max(1, decode.batch)
    cap = p.target.capacity_bytes
    notes = [n for n in (search_note,) if n]
    pre_need = compiled_bytes(pre, "required_bytes")
    if slots is not None and pre_need is not None:
      # The prefill program beside the decode state's cache (its own cache of one prompt included).
      room = (cap - pre_need) // per_slot if per_slot else slots
      if room < slots:
        notes.append(f"the prefill program at {prefill} tokens needs {pre_need / 2**30:.2f} GiB beside the decode "
                     f"state: {max(0, room)} slots leave it room, not {slots}")
        slots = max(0, room)
    if p.kv.name in ("int8", "int4"):
      notes.append(f"{p.kv.name} KV cache: MaxText keeps a scale a token and head beside it (kv_quant_axis), not "
                   "stored here; the slots that fit are an upper bound by those bytes")
    fits = None
    asked = request.max_seqs
    if asked is not None and decode is not None:
      fits = bool(decode.fits) and (pre_need is None or pre_need + per_slot * asked <= cap)
    elif slots is not None:
      fits = slots >= 1
    terms = self._terms(p, decode, pre, prefill, ctx, slots if asked is None else asked, per_slot)
    n = p.target.num_devices
    answer = asked if asked is not None else slots
    per_device = None if answer is None else (answer // n if answer % n == 0 else answer / n)
    settings = {"per_device_batch_size": per_device,
                "max_prefill_predict_length": prefill, "max_target_length": ctx,
                **{MESH_KEYS[a]: size for a, size in mesh if a in MESH_KEYS}}
    return EngineCapacity(
        engine=self.name, model=p.cfg.name, target=p.target.name, mesh=shd.format_mesh(mesh), weights=fmt.name,
        kv_cache_dtype=p.kv.name, num_devices=n, settings=settings, context=ctx, max_seqs=answer, fits=fits,
        kv_bytes=None if decode is None else decode.kv_cache_bytes_per_device * n,
        kv_tokens=None if answer is None else answer * ctx,
        pairs=() if slots is None else ((ctx, slots),), terms=terms, notes=tuple(dict.fromkeys(notes)), row=decode,
    )

  def _decode(self, request: EngineRequest, mesh: shd.MeshSpec, fmt: quant.WeightFormat,
              ctx: int) -> tuple[InferRow | None, InferRow | None, str | None]:
    """The compiled decode step: at the asked slots, or at the most that fit (the decode fit)."""
    p = request.plan
    if request.max_seqs is not None:
      return compile_program(p, mesh, fmt, phase="decode", batch=request.max_seqs, context=ctx,
                             on_row=request.on_row), None, None
    w = request.workload.replace(mesh=(shd.format_mesh(mesh),), weights=(fmt.name,))
    (r,) = fit_serving(w, phase="decode", over="batch", context=ctx, run=RunOptions(on_row=request.on_row))
    return r.row, r.next, r.note

  def _terms(self, p: Any, decode: InferRow | None, pre: InferRow, prefill: int, ctx: int, slots: int | None,
             per_slot: int | None) -> tuple[Term, ...]:
    state = None if per_slot is None or slots is None else per_slot * slots
    return (
        Term(name="capacity", bytes=p.target.capacity_bytes, origin=TARGET,
             what=p.target.capacity_note or "the device's memory a program may use", source="jaxmem's target"),
        Term(name="weights", bytes=None if decode is None or decode.error else decode.weight_bytes_per_device,
             origin=COMPILER, what="the stored weights a device", source="jaxmem's compiled decode step"),
        Term(name="decode state", bytes=state, origin=ENGINE,
             what=f"{slots} slots x {ctx} positions of KV cache (per_device_batch_size x devices slots)",
             source="maxengine.py MaxEngine.max_concurrent_decodes, init_decode_state"),
        Term(name="generate temporaries",
             bytes=None if decode is None else compiled_bytes(decode, "temp_size_in_bytes"), origin=COMPILER,
             what="the decode step's temporaries at the slots", source="jaxmem's compiled decode step"),
        Term(name="prefill program", bytes=compiled_bytes(pre, "temp_size_in_bytes"), origin=COMPILER,
             what=f"the prefill step's temporaries at one prompt of {prefill} tokens (its prompt cache is an argument)",
             source="MaxEngine.prefill; jaxmem's compiled prefill step"),
    )

  def emitter(self) -> Emitter:
    return Emitter(name=self.name, help="MaxText's maxengine_server overrides for the answer", takes=EngineCapacity,
                   what="a JetStream capacity (infer or fit --phase decode with --engine jetstream)", write=launch)


def launch(r: EngineCapacity) -> Launch:
  """MaxText's JetStream server (``maxtext.inference.maxengine.maxengine_server``) with its
  ``configs/base.yml`` and the answer's overrides."""
  if r.engine != JetStream.name:
    raise JaxmemError(f"`emit` jetstream writes a JetStream capacity; this one is engine {r.engine}'s")
  if not r.fits or not r.max_seqs:
    raise JaxmemError(f"no slot of {r.context} tokens fits, so there is no jetstream launch to write")
  s = r.settings
  keys = {"model_name": r.model, "per_device_batch_size": f"{s['per_device_batch_size']:g}",
          "max_prefill_predict_length": s["max_prefill_predict_length"], "max_target_length": s["max_target_length"],
          **{k: v for k, v in s.items() if k.startswith("ici_")}}
  if r.weights in QUANTIZATION:
    keys.update(quantization=QUANTIZATION[r.weights])
  else:
    keys.update(weight_dtype="bfloat16" if r.weights == "bf16" else "float16")
  if r.kv_cache_dtype in KV_QUANT:
    keys.update(quantize_kvcache="True", kv_quant_dtype=KV_QUANT[r.kv_cache_dtype])
  argv = ["python3", "-m", "maxtext.inference.maxengine.maxengine_server", "src/maxtext/configs/base.yml",
          *(f"{k}={v}" for k, v in keys.items())]
  notes = ("model_name is jaxmem's model name: give MaxText's name for it, and load_parameters_path for the "
           "checkpoint",)
  return Launch(tool="jetstream", argv=tuple(argv), notes=notes)

