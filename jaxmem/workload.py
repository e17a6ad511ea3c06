"""One typed description of a workload, taken by every entry point.

``compare``, ``explain``, ``fit``, ``scale``, ``plan``, ``validate`` (and ``infer``, with its own
extra fields) take a :class:`Workload` and keyword overrides of its fields, so
``jaxmem.compare(model="tiny", batch=2)`` and ``jaxmem.compare(Workload(model="tiny"), batch=2)``
mean the same. The CLI builds one from its shared flags (a flag per field, named after it).

A new field is one line here (with its default and how it is normalised) and its flag in
``jaxmem/cli/_common.py``: the planner, the row cache's key and the worker processes carry the
whole workload, so nothing in between changes.

>>> w = Workload(model="tiny", remat="full,dots_saveable", mesh="data=2,fsdp=4")
>>> w.remat, w.mesh
(('full', 'dots_saveable'), ('data=2,fsdp=4',))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from jaxmem.errors import JaxmemError
from jaxmem.program.sharding import format_mesh
from jaxmem.program.step import step_spec
from jaxmem.records import Record

if TYPE_CHECKING:  # only for annotations: a workload may carry a resolved config or target
  from jaxmem.compiler.targets import Target
  from jaxmem.models import ModelConfig

DEFAULT_REMAT = ("none", "dots_saveable", "full")
# The precision options (jaxmem.program.precision), each a sweep axis of optional dtypes.
PRECISION_AXES = ("master_dtype", "moments_dtype", "grad_reduce_dtype")
# The options that change the model's config or the whole step's layout: each is one value, or a
# tuple of values, which jaxmem.planning.plan.plan sweeps as a plan per combination.
OUTER_AXES = ("param_dtype", "dtype", "dropout", "sequence_parallel", "pipeline_microbatches", "pipeline_repeats")


def names(v: str | Sequence[str] | None) -> tuple[str, ...]:
  """A sweep axis as a tuple of names: ``"a,b"``, ``["a", "b,c"]`` and ``None`` (empty) alike."""
  if v is None:
    return ()
  parts = [v] if isinstance(v, str) else list(v)
  return tuple(n.strip() for p in parts for n in str(p).split(",") if n.strip())


def ints(v: int | str | Sequence[int | str] | None) -> tuple[int | str, ...]:
  """A sweep axis of whole numbers (``"1,4"``, ``4``, ``[1, "4"]``) as a tuple; entries that are
  not whole numbers stay as written, for :func:`jaxmem.planning.plan.plan` to refuse in one line."""
  if v is None:
    return ()
  parts = [v] if isinstance(v, (int, str)) else list(v)
  out: list[int | str] = []
  for n in names([str(p) for p in parts]):
    out.append(int(n) if n.lstrip("-").isdigit() else n)
  return tuple(out)


# How an optional dtype axis (``master_dtype``, ``moments_dtype``, ``grad_reduce_dtype``) writes
# its default (no master copy; the dtype the optimizer updates in; the parameters' dtype) in a list.
DEFAULT_DTYPE_NAMES = ("none", "default")


def optional_names(v: str | Sequence[str | None] | None) -> tuple[str | None, ...]:
  """An optional dtype's sweep axis: :func:`names`, with ``None`` (and ``none`` or ``default``
  in a list, as in ``"none,float32"``) for the field's default; ``None`` alone is ``(None,)``."""
  if v is None:
    return (None,)
  parts = [v] if isinstance(v, str) else list(v)
  out: list[str | None] = []
  for p in parts:
    out += [None] if p is None else [None if n.lower() in DEFAULT_DTYPE_NAMES else n for n in names(p)]
  return tuple(dict.fromkeys(out))


def several(values: tuple[Any, ...], what: str) -> Any:
  """An axis of the sweep's outer product (:data:`OUTER_AXES`): one value as itself (so a
  workload of one configuration reads as before), several as a tuple."""
  if not values:
    raise JaxmemError(f"`{what}` is empty; give values separated by commas")
  return values[0] if len(values) == 1 else values


def _listed(v: Any) -> bool:
  return isinstance(v, (str, list, tuple))


def switches(v: Any, what: str) -> tuple[bool, ...]:
  """A sweep axis of on/off values: ``True``, ``"off,on"``, ``[False, True]``."""
  out = []
  for p in ([v] if not isinstance(v, (list, tuple)) else list(v)):
    if isinstance(p, bool):
      out.append(p)
      continue
    for n in names(str(p)):
      if n.lower() not in _SWITCH:
        raise JaxmemError(f"`{what}` takes on or off, comma separated, got {n!r}")
      out.append(_SWITCH[n.lower()])
  return tuple(dict.fromkeys(out))


_SWITCH = {"on": True, "true": True, "yes": True, "1": True, "off": False, "false": False, "no": False, "0": False}


def numbers(v: float | str | Sequence[float | str] | None, what: str, takes: str = "numbers separated by commas") -> tuple[float, ...]:
  """A sweep axis of numbers: ``"1,1.25"``, ``1.25``, ``[1, "1.25,2"]`` and ``None`` (empty);
  ``takes`` says what an item that is not a number should have been."""
  if v is None:
    return ()
  parts = [v] if isinstance(v, (str, int, float)) else list(v)
  out = []
  for p in parts:
    for n in str(p).split(","):
      if not n.strip():
        continue
      try:
        out.append(float(n))
      except ValueError:
        raise JaxmemError(f"`{what}` takes {takes}, got {n.strip()!r}") from None
  return tuple(dict.fromkeys(out))


def meshes(v: Any) -> tuple[str, ...]:
  """Meshes as written (``"data=2,fsdp=4"`` is one mesh: its commas separate axes, not meshes):
  a string, a sequence of strings, or ``(axis, size)`` pairs; ``None`` for the default mesh."""
  if v is None:
    return ()
  if isinstance(v, str):
    return (v,)
  items = list(v)
  if items and all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], int) for x in items):
    return (format_mesh(tuple(items)),)  # one mesh as (axis, size) pairs
  return tuple(x if isinstance(x, str) else format_mesh(x) for x in items)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BaseWorkload(Record):
  """What every workload names, training or inference: the model, the global batch, where it
  runs (``target``, TPU ``slices``, ``mesh``), the compute dtype, how attention is computed, and
  a mixture of experts' variant. Only fields both kinds fill live here; :class:`Workload` (a
  train step) and :class:`jaxmem.inference.workload.InferWorkload` add their own.

  ``mesh``, ``attention``, ``qk_dtype``, ``moe_impl`` and ``capacity_factor`` are sweep axes: tuples (a
  comma-separated string or a list is accepted and normalised). ``mesh`` empty means FSDP over
  every device of the target. ``attention`` names how attention is computed
  (:data:`jaxmem.models.ATTENTION_NAMES`; ``auto`` is the target's production kernel);
  ``qk_dtype`` names the dtypes of ``dot`` attention's scores: ``bfloat16`` (MaxText's default
  ``float32_qk_product=False``: scores in the compute dtype) and/or ``float32``. ``dtype`` ``None``
  keeps the model's (bfloat16). ``model`` may be a preset name or a
  :class:`~jaxmem.models.ModelConfig`; ``target`` a name or a
  :class:`~jaxmem.compiler.targets.Target`.
  """

  model: str | ModelConfig = "gpt2-small"
  batch: int = 8  # global
  target: str | Target = "cpu"
  slices: int = 1  # TPU slices (multi-slice over DCN)
  # GPU targets: the share of device memory JAX's allocator takes; None reads the environment
  # (XLA_CLIENT_MEM_FRACTION, or its old name), else JAX's 0.75 (compiler.targets.gpu_mem_fraction).
  mem_fraction: float | None = None
  mesh: tuple[str, ...] = ()
  dtype: str | None | tuple[str | None, ...] = None  # one, or several: an outer axis of a train step's sweep
  attention: tuple[str, ...] = ("auto",)
  qk_dtype: tuple[str, ...] = ("bfloat16",)
  # --- mixture of experts (issue 11): sweep axes, for MoE models only (an error otherwise) ---
  # moe_impl: dropless and/or capacity; empty means the model's own (dropless), except on GPU
  # targets, where capacity (jaxmem.planning.plan.moe_config says why), and except when only
  # capacity factors are given, which imply capacity. capacity_factor: the capacity path's slots
  # per expert over its fair share; empty means the model's (1.25).
  moe_impl: tuple[str, ...] = ()
  capacity_factor: tuple[float, ...] = ()

  def __post_init__(self):
    # Normalised in place (frozen): axes to tuples of names, so equal workloads compare equal.
    object.__setattr__(self, "mesh", meshes(self.mesh))
    object.__setattr__(self, "attention", names(self.attention))
    object.__setattr__(self, "qk_dtype", names(self.qk_dtype))
    if _listed(self.dtype):
      object.__setattr__(self, "dtype", several(optional_names(self.dtype), "dtype"))
    object.__setattr__(self, "moe_impl", names(self.moe_impl))
    object.__setattr__(self, "capacity_factor", numbers(self.capacity_factor, "capacity_factor"))

  def replace(self, **fields: Any) -> BaseWorkload:
    """A copy with ``fields`` replaced (normalised like the constructor's arguments)."""
    return dataclasses.replace(self, **fields) if fields else self

  @classmethod
  def of(cls, workload: BaseWorkload | None = None, defaults: Mapping[str, Any] | None = None, **fields: Any):
    """What an entry point works on: ``workload`` (else one with the entry point's own
    ``defaults``), with ``fields`` replaced. ``None`` values are ignored, so a caller can pass
    optional arguments through. A workload of another kind gives the fields both have."""
    fields = {k: v for k, v in fields.items() if v is not None}
    base = workload if workload is not None else cls(**(defaults or {}))
    if not isinstance(base, cls):
      base = cls(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.name in _field_names(cls)})
    return base.replace(**fields)

  @property
  def model_name(self) -> str:
    return self.model if isinstance(self.model, str) else self.model.name

  @property
  def target_name(self) -> str:
    return self.target if isinstance(self.target, str) else self.target.name


@dataclasses.dataclass(frozen=True, kw_only=True)
class Workload(BaseWorkload):
  """A train step to compile, or a sweep of them: the shared fields (:class:`BaseWorkload`)
  and a train step's own.

  ``remat``, ``optimizer``, ``microbatches``, ``vocab_tiles``, ``context_strategy`` and the three
  precision dtypes are sweep axes too. ``remat`` names may include
  ``all``, and ``none`` (no remat, the baseline) is always compiled too.

  The step itself (issue 9): ``microbatches`` splits the global batch for gradient
  accumulation (MaxText's ``gradient_accumulation_steps``); ``vocab_tiles`` computes the output
  projection and loss in that many tiles (MaxText's ``num_vocab_tiling``). ``param_dtype``
  ``None`` keeps the model's (float32).

  Precision (issue 20; :mod:`jaxmem.program.precision`): ``master_dtype`` keeps a master copy of
  the parameters in that dtype in the optimizer state (``float32`` beside ``param_dtype``
  ``bfloat16``: ZeRO's 2 + 2 + 12 bytes per parameter; it must be wider than the parameters);
  ``moments_dtype`` stores the optimizer's moments in that dtype (adam, adamw, momentum,
  nesterov, lion); ``grad_reduce_dtype`` is the dtype the gradients are formed and reduced in
  over the data axes. ``None`` (``none`` or ``default`` in a list): the dtype of the parameters the
  optimizer updates. Each is a tuple of such values (``"none,float32"``), and the sweep takes every
  combination.

  Pipeline parallelism (issue 20; :mod:`jaxmem.program.pipelining`), on meshes with a ``stage``
  axis: ``pipeline_microbatches`` (MaxText's ``num_pipeline_microbatches``; ``None``: as many as
  the stages) cuts each accumulation microbatch for the pipeline, ``pipeline_repeats`` (MaxText's
  ``num_pipeline_repeats``) is the circular schedule's layer groups per stage.

  Korthikanti et al. 2022 (issue 20): ``sequence_parallel`` splits the residual stream, norms and
  dropouts along the sequence over the ``tensor`` axis (Megatron's sequence parallelism; the mesh
  needs a tensor axis that divides ``seq``); ``dropout`` is the model's dropout probability
  (0: none, the program unchanged). Remat ``selective`` is their selective recomputation.

  ``param_dtype``, ``dtype``, ``dropout``, ``sequence_parallel``, ``pipeline_microbatches`` and
  ``pipeline_repeats`` (:data:`OUTER_AXES`) are each one value, or several (a tuple, or
  ``"bfloat16,float32"``): the sweep is then planned once per combination of them
  (:func:`jaxmem.planning.plan.plan`), each its own rows.
  """

  seq: int = 1024
  remat: tuple[str, ...] = DEFAULT_REMAT
  optimizer: tuple[str, ...] = ("adamw",)
  param_dtype: str | None | tuple[str | None, ...] = None  # an outer axis (OUTER_AXES), as the four below
  master_dtype: tuple[str | None, ...] = (None,)
  moments_dtype: tuple[str | None, ...] = (None,)
  grad_reduce_dtype: tuple[str | None, ...] = (None,)
  sequence_parallel: bool | tuple[bool, ...] = False
  dropout: float | tuple[float, ...] = 0.0
  # Your own step instead of the model's (issue 10): a factory make_step(*, batch, seq, remat)
  # -> (fn, args, jit_kwargs), by import path "pkg.mod:make_step" or "path/file.py:make_step"
  # (a function is accepted and turned into its path; see jaxmem.program.step). model,
  # optimizer and the dtypes are then the step's own.
  step: str | None = None
  # --- the step people train (issue 9): gradient accumulation, vocabulary tiling ---
  microbatches: tuple[int, ...] = (1,)
  vocab_tiles: tuple[int, ...] = (1,)
  # --- pipeline parallelism over a `stage` mesh axis (issue 20; jaxmem.program.pipelining) ---
  pipeline_microbatches: int | None | tuple[int | None, ...] = None  # None: as many as the stages
  pipeline_repeats: int | tuple[int, ...] = 1  # MaxText's circular schedule: R non-adjacent layer groups per stage
  # --- long context (issue 19): how attention crosses a context-sharded sequence, a sweep axis
  # (jaxmem.models.context_attention.STRATEGIES); it applies to meshes with a context axis.
  context_strategy: tuple[str, ...] = ("all_gather",)

  def __post_init__(self):
    super().__post_init__()
    object.__setattr__(self, "context_strategy", names(self.context_strategy))
    object.__setattr__(self, "remat", names(self.remat))
    object.__setattr__(self, "optimizer", names(self.optimizer))
    for name in PRECISION_AXES:
      object.__setattr__(self, name, optional_names(getattr(self, name)))
    if self.step is not None:
      object.__setattr__(self, "step", step_spec(self.step))
    object.__setattr__(self, "microbatches", ints(self.microbatches))
    object.__setattr__(self, "vocab_tiles", ints(self.vocab_tiles))
    # The outer axes: one value, or several as a tuple (the flags give "a,b").
    if _listed(self.param_dtype):
      object.__setattr__(self, "param_dtype", several(optional_names(self.param_dtype), "param_dtype"))
    if _listed(self.dropout):
      object.__setattr__(self, "dropout", several(numbers(self.dropout, "dropout", "a probability in [0, 1) (several: separated by commas)"), "dropout"))
    if _listed(self.sequence_parallel):
      object.__setattr__(self, "sequence_parallel", several(switches(self.sequence_parallel, "sequence_parallel"), "sequence_parallel"))
    if _listed(self.pipeline_microbatches):
      values = tuple(None if n is None else ints(n)[0] for n in optional_names(self.pipeline_microbatches))
      object.__setattr__(self, "pipeline_microbatches", several(values, "pipeline_microbatches"))
    if _listed(self.pipeline_repeats):
      object.__setattr__(self, "pipeline_repeats", several(tuple(dict.fromkeys(ints(self.pipeline_repeats))), "pipeline_repeats"))


def _field_names(cls: type) -> set[str]:
  return {f.name for f in dataclasses.fields(cls)}
