"""Serving engines' capacity rules: :data:`ENGINES` (``--engine``) and :func:`engine_capacity`.

Each engine is one module with one :class:`Engine` (:mod:`.vllm`, :mod:`.jetstream`), read from
its source; what they share (the terms, the result in the engine's units, the compiled programs)
is :mod:`.base`. An engine's emitter writes its result as its serve command
(:data:`EMITTERS`, gathered by the CLI with the other layers' into one ``--emit`` registry).
"""

from __future__ import annotations

import math
from typing import Any

from jaxmem.errors import JaxmemError
from jaxmem.inference.engines.base import (
    COMPILER, ENGINE, TARGET, UNMODELLED, Engine, EngineCapacity, EngineRequest, EngineSettings, Term,
)
from jaxmem.inference.engines.jetstream import JetStream
from jaxmem.inference.engines.vllm import Vllm
from jaxmem.inference.workload import InferWorkload, _ints, plan_infer
from jaxmem.options import RunOptions
from jaxmem.registry import Registry
from jaxmem.program import sharding as shd
from jaxmem.resolve import resolve_meshes, resolve_target
from jaxmem.hardware.startup import start_jax

ENGINES: Registry[Engine] = Registry("serving engine", {e.name: e for e in (Vllm(), JetStream())}, field="engine")
EMITTERS = tuple(e.emitter() for e in ENGINES.values())
# The infer fields an engine answer has no use for: it compiles the engine's own programs.
NOT_AN_ENGINE_FIELD = ("prompt", "phase")


def engine_capacity(
    workload: InferWorkload | None = None,
    /,
    *,
    engine: str = "vllm",
    settings: EngineSettings | None = None,
    run: RunOptions | None = None,
    **fields: Any,
) -> list[EngineCapacity]:
  """A serving engine's capacity for ``workload`` (``fields`` replaced), one answer per (mesh,
  weight format, context): ``engine_capacity(model="llama3-8b", target="tpu:v6e-4",
  mesh="tensor=4", engine="vllm", context=4096)``. ``batch``: the concurrent sequences asked
  (vLLM's ``max_num_seqs``, JetStream's slots; whether they fit), or ``None`` for the most that
  fit; ``context``: the longest sequences, comma separated or a sequence (``max_model_len``,
  ``max_target_length``; when not given, vLLM's default, the model's positions, or JetStream's,
  2048); ``settings``: the engine's own (:class:`EngineSettings`), or their fields as keywords.
  ``run``: ``on_row`` is told of each compiled program (or ``on_row=`` as a keyword); ``jobs``,
  ``scheduler`` and ``cache`` are refused."""
  run = RunOptions.of(run, fields)
  run.refuse("an engine's capacity", "it compiles its programs one after another, in this process",
             "jobs", "scheduler", "cache")
  given = {k: fields.pop(k) for k in EngineSettings.__dataclass_fields__ if k in fields}
  given = {k: v for k, v in given.items() if v is not None}
  settings = EngineSettings(**{**(settings.given() if settings else {}), **given})
  e = ENGINES.get(engine)
  for name in NOT_AN_ENGINE_FIELD:
    if fields.get(name) is not None:
      raise JaxmemError(f"`{name}` is infer's; engine {e.name} compiles its own programs (its settings set them)")
  w = InferWorkload.of(workload, **fields)
  batch = None if fields.get("batch") is None else _ints([fields["batch"]], "batch")[0]
  start_jax()
  t = resolve_target(w)
  if not w.mesh:  # the engine's parallelism over every device: vLLM's tensor parallel size, MaxText's ICI tensor axis
    w = w.replace(mesh=(f"tensor={t.num_devices}",))
  # The template plan: decode, so no prefill kernel is checked at a length the engine does not use,
  # at the smallest batch every mesh's data axes divide (the engine's programs set their own).
  least = math.lcm(*[shd.data_parallel_size(m) for m in resolve_meshes(w, t)])
  p = plan_infer(w.replace(batch=least, phase=("decode",)))
  ctx = _ints(w.context, "context") if fields.get("context") is not None else (e.default_context(p.cfg),)
  run.start(None, p.cfg)
  request = EngineRequest(plan=p, workload=w, contexts=ctx, max_seqs=batch, settings=settings, on_row=run.on_row)
  return e.capacity(request)


__all__ = [
    "COMPILER", "EMITTERS", "ENGINE", "ENGINES", "TARGET", "UNMODELLED", "Engine", "EngineCapacity", "EngineRequest",
    "EngineSettings", "JetStream", "Term", "Vllm", "engine_capacity",
]
