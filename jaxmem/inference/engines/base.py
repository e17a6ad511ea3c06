"""What every serving engine shares: the terms of its capacity, the answer in its units, and the
compiled programs the compiler decides.

An engine (vLLM, JetStream) decides a server's capacity by its own rule: how much of the device it
gives the KV cache, in what pages, after which programs. jaxmem's part is what the compiler
decides: the stored weights per device, the temporaries of the forward pass an engine sizes its
budget around, the programs' code. The engine's part is its arithmetic, each step read from its
source and cited where it is written (:mod:`jaxmem.inference.engines.vllm`, ``.jetstream``). Every
byte of the answer is one :class:`Term`, named, with where it comes from:

- :data:`COMPILER`: a figure of a program jaxmem compiled (the row that carries it is the result's
  ``row``);
- :data:`ENGINE`: the engine's arithmetic on the other terms, as its source does it;
- :data:`TARGET`: the device's own figure (its memory as the runtime reports it);
- :data:`UNMODELLED`: a term the engine counts that cannot be had without the device (its size is
  ``None`` and the note says what it is).

An engine is an :class:`Engine` in :data:`jaxmem.inference.engines.ENGINES` (one module each, as
optax's aliases are entries, not branches); :func:`jaxmem.inference.engines.engine_capacity` is the
entry point.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

from jaxmem.errors import JaxmemError
from jaxmem.inference import quant
from jaxmem.inference.run import InferRow, run_infer_config
from jaxmem.inference.workload import InferPlan, InferWorkload
from jaxmem.launch import Emitter
from jaxmem.program import sharding as shd
from jaxmem.records import Record

COMPILER, ENGINE, TARGET, UNMODELLED = "compiler", "engine", "target", "not modelled"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Term(Record):
  """One term of an engine's capacity: ``bytes`` per device (``None``: not known here), its
  ``origin`` (:data:`COMPILER`, :data:`ENGINE`, :data:`TARGET` or :data:`UNMODELLED`), the
  ``source`` of its rule (a file and function, a PR) and ``what`` it is."""

  name: str
  bytes: int | None
  origin: str
  source: str
  what: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineSettings(Record):
  """The engine settings a caller may give (``None``: the engine's default, as its source sets
  it). Each engine reads some (:attr:`Engine.settings`) and refuses the rest by name.

  ``gpu_memory_utilization``: vLLM's share of the device; ``block_size``: vLLM's tokens a block;
  ``max_num_batched_tokens``: the tokens of vLLM's largest forward pass (its profiling batch);
  ``max_prefill_length``: JetStream's prompt length (MaxText's ``max_prefill_predict_length``)."""

  # Each field's metadata: the engine it is for and its flag's help (the CLI adds a flag for each).
  gpu_memory_utilization: float | None = dataclasses.field(default=None, metadata={
      "engine": "vllm", "help": "its share of each device (TPU and GPU); default 0.9"})
  block_size: int | None = dataclasses.field(default=None, metadata={
      "engine": "vllm", "help": "tokens a KV block; default vLLM's (GPU 16; TPU from max_model_len, 16 to 256)"})
  max_num_batched_tokens: int | None = dataclasses.field(default=None, metadata={
      "engine": "vllm", "help": "the tokens of its largest forward pass (the pass it profiles); default vLLM's for "
      "the device"})
  max_prefill_length: int | None = dataclasses.field(default=None, metadata={
      "engine": "jetstream", "help": "the longest prompt (MaxText's max_prefill_predict_length); default 64"})

  def given(self) -> dict[str, Any]:
    return {f.name: v for f in dataclasses.fields(self) if (v := getattr(self, f.name)) is not None}


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineCapacity(Record):
  """An engine's capacity for one (mesh, weight format) at one context, in the engine's units.

  ``settings``: the engine's settings as its flags name them, defaults resolved. ``context``: the
  longest sequence (vLLM's ``max_model_len``, JetStream's ``max_target_length``); ``max_seqs`` the
  concurrent sequences asked (``infer``) or the most that fit (``fit``; vLLM's ``max_num_seqs``,
  JetStream's slots), ``fits`` whether that many of that length fit. ``kv_bytes``: the KV budget
  summed over the devices; ``page_bytes`` a block of every layer's cache as the engine counts it,
  ``kernel_page_bytes`` as the attention kernel lays it out (they differ where the kernel pads:
  tpu-inference PR #757); ``engine_blocks`` the blocks the engine's own count gives,
  ``num_blocks`` those allocated (the kernel's); ``kv_tokens`` the tokens they hold. ``pairs``:
  (context, the most concurrent sequences of that length that fit) for contexts up to the model's
  positions. ``max_utilization``: the largest share of the device at which the engine's programs
  still load beside its cache (TPU); ``loads`` whether the asked one is within it. ``terms``: every
  byte, named (:class:`Term`); ``row``: the compiled program the compiler's terms come from."""

  engine: str
  model: str
  target: str
  mesh: str
  weights: str
  kv_cache_dtype: str
  num_devices: int
  settings: dict[str, Any]
  context: int
  max_seqs: int | None
  fits: bool | None
  block_size: int | None = None
  kv_bytes: int | None = None
  page_bytes: int | None = None
  kernel_page_bytes: int | None = None
  engine_blocks: int | None = None
  num_blocks: int | None = None
  kv_tokens: int | None = None
  max_concurrency: float | None = None
  pairs: tuple[tuple[int, int], ...] = ()
  max_utilization: float | None = None
  loads: bool | None = None
  terms: tuple[Term, ...] = ()
  notes: tuple[str, ...] = ()
  row: InferRow | None = dataclasses.field(default=None, compare=False)

  def term(self, name: str) -> Term | None:
    return next((t for t in self.terms if t.name == name), None)

  def as_dict(self) -> dict[str, Any]:
    d = super().as_dict()
    d["row"] = None if self.row is None else {k: self.row.as_dict().get(k) for k in ROW_FIELDS}
    return d


# What a result says of its compiled program (the rest is infer's row, printed by infer).
ROW_FIELDS = ("phase", "batch", "context", "weight_bytes_per_device", "argument_size_in_bytes", "temp_size_in_bytes",
              "generated_code_size_in_bytes", "peak_memory_in_bytes", "compile_seconds", "error", "versions")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineRequest:
  """What an engine is asked: the planned workload (model, target, mesh, weight formats, KV
  dtype) and the workload itself, the contexts, the concurrent sequences (``None``: the most that fit), its settings,
  and ``on_row`` told of each compiled program."""

  plan: InferPlan
  workload: InferWorkload
  contexts: tuple[int, ...]
  max_seqs: int | None
  settings: EngineSettings
  on_row: Callable[[InferRow], None] | None = None


class Engine:
  """A serving engine's capacity rule. ``name`` is ``--engine``'s word for it; ``settings`` the
  :class:`EngineSettings` fields it reads; :meth:`capacity` answers one request per (mesh,
  weight format, context); :meth:`emitter` writes a result as the engine's serve command."""

  name: ClassVar[str]
  description: ClassVar[str]
  settings: ClassVar[tuple[str, ...]] = ()

  def check(self, request: EngineRequest) -> None:
    """One line for a setting this engine does not read."""
    for name in request.settings.given():
      if name not in self.settings:
        takes = ", ".join(f"`{s}`" for s in self.settings) or "none"
        raise JaxmemError(f"`{name}` is not an engine {self.name} setting (it takes {takes})")

  def default_context(self, cfg: Any) -> int:
    """The longest sequence where none is given (the engine's own default)."""
    raise NotImplementedError

  def capacity(self, request: EngineRequest) -> list[EngineCapacity]:
    raise NotImplementedError

  def emitter(self) -> Emitter:
    raise NotImplementedError


def one_mesh_axis(plan: InferPlan, axis: str, engine: str) -> None:
  """One line for a mesh with an axis other than ``axis`` of more than one device: the engine's
  parallelism is that axis alone (vLLM's tensor parallelism)."""
  for mesh in plan.meshes:
    others = [f"{a}={n}" for a, n in mesh if a != axis and n > 1]
    if others:
      raise JaxmemError(
          f"`mesh` {shd.format_mesh(mesh)}: engine {engine} shards over {axis} only (its tensor parallel size); "
          f"give {axis}={plan.target.num_devices}, or a target of as many devices as it uses"
      )


def compile_program(plan: InferPlan, mesh: shd.MeshSpec, fmt: quant.WeightFormat, *, phase: str, batch: int,
                    context: int, on_row: Callable[[InferRow], None] | None = None) -> InferRow:
  """One inference program compiled for the engine (infer's, :func:`run_infer_config`): prefill
  of ``batch`` prompts of ``context`` tokens, or decode at ``batch`` sequences of ``context``."""
  p = dataclasses.replace(plan, batch=batch, prompt=context, contexts=(context,), phases=(phase,))
  row = run_infer_config(p, mesh, fmt, phase, context)
  if on_row is not None:
    on_row(row)
  return row


def cdiv(a: int, b: int) -> int:
  return -(-a // b)


def ladder(longest: int, shortest: int = 1024) -> tuple[int, ...]:
  """The contexts a result's pairs are given for: powers of two from ``shortest`` up to the
  model's positions (and the longest itself)."""
  out, n = [], shortest
  while n < longest:
    out.append(n)
    n *= 2
  return (*out, longest)


def compiled_bytes(row: InferRow, *fields: str) -> int | None:
  """The sum of a compiled row's figures (``None`` where the compile gave none)."""
  values = [getattr(row, f, None) for f in fields]
  return None if row.error or any(v is None for v in values) else int(sum(values))


def no_row_note(row: InferRow) -> str | None:
  if row.error:
    return f"the profiling program did not compile: {row.error.splitlines()[0][:160]}"
  return None
