"""One typed description of a workload, taken by every entry point.

``compare``, ``explain``, ``fit``, ``scale``, ``plan``, ``validate`` (and ``infer``, with its own
extra fields) take a :class:`Workload` and keyword overrides of its fields, so
``jaxmem.compare(model="tiny", batch=2)`` and ``jaxmem.compare(Workload(model="tiny"), batch=2)``
mean the same. The CLI builds one from its shared flags (a flag per field, named after it).

Every sweep axis (``mesh``, ``remat``, the dtypes, the step's options...) is declared once, in
:mod:`jaxmem.axes`: its field here (default and normalisation), its flag, its record field,
label and column derive from that declaration. The fields here are the rest (the model, the
batch, where it runs). The planner, the row cache's key and the worker processes carry the whole
workload, so an axis needs nothing in between.

>>> w = Workload(model="tiny", remat="full,dots_saveable", mesh="data=2,fsdp=4")
>>> w.remat, w.mesh
(('full', 'dots_saveable'), ('data=2,fsdp=4',))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from jaxmem.axes import AXES, declared, with_fields
from jaxmem.errors import BadValue, JaxmemError, UnknownField
from jaxmem.inputs import Fraction, Size, Text, Whole, maxtext_args, optional
from jaxmem.maxtext.step import SPEC as MAXTEXT_STEP
from jaxmem.program.step import step_spec
from jaxmem.records import Record

if TYPE_CHECKING:  # only for annotations: a workload may carry a resolved config or target
  from jaxmem.hardware.targets import Target
  from jaxmem.models import ModelConfig

DEFAULT_REMAT = AXES["remat"].default
# A train step's batch and sequence where none is given. The workload holds None (not given)
# until it is planned: the planner chooses them where it knows the model and the meshes
# (jaxmem.resolve.fitted_defaults: these, or the nearest that fit them); a MaxText step's are
# its config's (per_device_batch_size x devices, max_target_length: jaxmem.maxtext.plan).
DEFAULT_BATCH, DEFAULT_SEQ = 8, 1024


@dataclasses.dataclass(frozen=True, kw_only=True)
@with_fields("workload")
class BaseWorkload(Record):
  """What every workload names, training or inference: the model, the global batch, where it
  runs (``target``, TPU ``slices``, the bytes ``resident`` on each device beside it: a size
  such as ``"14.5GiB"``), and the sweep axes both kinds take (:mod:`jaxmem.axes`,
  ``training`` False: the mesh, the compute dtype, how attention is computed, a mixture of
  experts' variant). :class:`Workload` (a train step) and
  :class:`jaxmem.inference.workload.InferWorkload` add their own.

  An axis is a tuple of values (a comma-separated string or a list is accepted and
  normalised); an outer axis one value, or a tuple of several. ``model`` may be a preset name or
  a :class:`~jaxmem.models.ModelConfig`; ``target`` a name or a
  :class:`~jaxmem.hardware.targets.Target`.
  """

  WHAT: ClassVar[str] = "a workload"  # what one is, in messages

  model: str | ModelConfig = "gpt2-small"
  batch: int | None = None  # global; None: not given, the plan's choice (each kind's default, fitted)
  target: str | Target = "cpu"
  slices: int = 1  # TPU slices (multi-slice over DCN)
  # Bytes per device another program holds on the device beside this one (an RL sampler's weights
  # and KV cache): the capacity the program is judged against drops by it, and a TPU compile is
  # capped to match (jaxmem.hardware.targets.with_resident). One value, not a sweep axis.
  resident: int = 0
  # GPU targets: the share of device memory JAX's allocator takes; None reads the environment
  # (XLA_CLIENT_MEM_FRACTION, or its old name), else JAX's 0.75 (hardware.targets.gpu_mem_fraction).
  mem_fraction: float | None = None
  # Compile even where the arguments' shapes alone exceed the capacity (jaxmem.compiler.figures
  # otherwise answers such a configuration from its shapes, without the compile): the row is then
  # the compiler's own verdict and figures, at the cost of the compile.
  always_compile: bool = False
  # (and the sweep axes every workload has: jaxmem.axes, training False)

  def __post_init__(self):
    _parse_fields(self, _BASE_FIELDS)
    _normalise(self, training=False)

  def replace(self, **fields: Any) -> BaseWorkload:
    """A copy with ``fields`` replaced (normalised like the constructor's arguments)."""
    return dataclasses.replace(self, **fields) if fields else self

  @classmethod
  def of(cls, workload: BaseWorkload | None = None, defaults: Mapping[str, Any] | None = None, **fields: Any):
    """What an entry point works on: ``workload`` (else one with the entry point's own
    ``defaults``), with ``fields`` replaced. ``None`` values are ignored, so a caller can pass
    optional arguments through. A workload of another kind gives the fields both have."""
    fields = {k: v for k, v in fields.items() if v is not None}
    unknown = sorted(set(fields) - _field_names(cls))
    if unknown:
      raise UnknownField(f"`{unknown[0]}` is not a field of {cls.WHAT} ({cls.__name__}); its fields: "
                        f"{', '.join(f.name for f in dataclasses.fields(cls))}")
    if workload is None:  # made in one go, so a field left unset stays so (a MaxText step's batch)
      return cls(**{**(defaults or {}), **fields})
    base = workload
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
@with_fields("training")
class Workload(BaseWorkload):
  """A train step to compile, or a sweep of them: the shared fields (:class:`BaseWorkload`),
  the sequence length, a user's own ``step``, and a train step's sweep axes (:mod:`jaxmem.axes`,
  ``training`` True: the remat policies, optimizers, how the step is computed, its precision and
  layout; each declaration's help says what it does). ``remat`` names may include ``all``, and
  ``none`` (no remat, the baseline) is always compiled too. The outer axes are each one value, or
  several (a tuple, or ``"bfloat16,float32"``): the sweep is then planned once per combination of
  them (:func:`jaxmem.resolve.plan`), each its own rows; the others' every combination is a
  task of one plan.
  """

  WHAT: ClassVar[str] = "a train step"

  # None: not given; the plan chooses them (DEFAULT_BATCH and DEFAULT_SEQ where they fit the
  # model and the meshes, a MaxText step's own).
  batch: int | None = None  # global
  seq: int | None = None
  # Your own step instead of the model's: a factory make_step(*, batch, seq, remat)
  # -> (fn, args, jit_kwargs), by import path "pkg.mod:make_step" or "path/file.py:make_step"
  # (a function is accepted and turned into its path; see jaxmem.program.step). model,
  # optimizer and the dtypes are then the step's own.
  step: str | None = None
  # MaxText's own train step instead: its config and overrides, ("base.yml", "key=value", ...)
  # or one string "base.yml key=value ..." (jaxmem.maxtext, the `maxtext` extra). The
  # step is then MaxText's factory; the axes jaxmem varies map onto MaxText's options.
  maxtext: tuple[str, ...] | None = None
  # (and a train step's sweep axes: jaxmem.axes, training True)

  def __post_init__(self):
    super().__post_init__()
    _parse_fields(self, _TRAIN_FIELDS)
    _normalise(self, training=True)
    object.__setattr__(self, "maxtext", maxtext_args(self.maxtext))
    if self.maxtext is not None:
      if self.step is not None and self.step != MAXTEXT_STEP:
        raise JaxmemError("give `step` (your own factory) or `maxtext` (MaxText's step), not both")
      object.__setattr__(self, "step", MAXTEXT_STEP)
    if self.step is not None:
      object.__setattr__(self, "step", step_spec(self.step))


def _model(v: Any, subject: str) -> Any:
  from jaxmem.models import ModelConfig

  return v if isinstance(v, ModelConfig) else Text(expected="a model's name, config.json path or Hub id, or a ModelConfig")(v, subject)


def _target(v: Any, subject: str) -> Any:
  from jaxmem.hardware.targets import Target

  return v if isinstance(v, Target) else Text(expected="a target's name (tpu:v5e-8, gpu:h100x8, cpu) or a Target")(v, subject)


def _flag(v: Any, subject: str) -> bool:
  if not isinstance(v, bool):
    raise BadValue(subject, "True or False", v)
  return v


# Each field's parser (jaxmem.inputs), applied as a workload is made: what a keyword of an entry
# point, or the CLI's flag, gave becomes the typed value the planner works on. None: not given
# (the entry point's default), where a field allows it.
_BASE_FIELDS: dict[str, Any] = {
    "model": _model, "target": _target, "batch": lambda v, s: optional(Whole(), v, s), "slices": Whole(),
    "resident": Size(optional=True), "mem_fraction": lambda v, s: optional(Fraction(), v, s), "always_compile": _flag,
}
_TRAIN_FIELDS: dict[str, Any] = {"seq": lambda v, s: optional(Whole(), v, s)}


def _parse_fields(w: BaseWorkload, parsers: Mapping[str, Any]) -> None:
  for name, parse in parsers.items():
    object.__setattr__(w, name, parse(getattr(w, name), f"`{name}`"))


def _normalise(w: BaseWorkload, *, training: bool) -> None:
  """The declared axes' values in their normal form, in place (the workload is frozen), so equal
  workloads compare equal: lists to tuples, ``"a,b"`` split, a bad value refused in one line."""
  for axis in declared(training=training):
    object.__setattr__(w, axis.name, axis.normalise(getattr(w, axis.name)))


def _field_names(cls: type) -> set[str]:
  return {f.name for f in dataclasses.fields(cls)}
