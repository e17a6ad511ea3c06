"""The sweep axes, each declared once: an option that shapes the compiled program and that a
sweep may vary (``--dropout 0,0.1`` compiles both).

An :class:`Axis` says everything the rest of jaxmem derives from it: the :class:`~jaxmem.workload.Workload`
field of its name (its default and how a value is normalised, ``"0,0.1"`` to ``(0.0, 0.1)``,
refusing a bad one in one line), the CLI flag (``--dropout``) and its help, whether the sweep
plans once per value (``outer``: the model's config or the step's layout changes) or makes a
task per value within one plan, whether only a train step takes it, how a result records it
(the field of :class:`~jaxmem.records.Configuration`, fit's and scale's summaries), the words
that label a row with it, its column in the result tables (:class:`Shown`), and the checks that
a command which takes one configuration got one value of it. The cache key is the whole
workload, so a new axis is keyed with no more said. Its hooks say the rest of the way from flag
to program: the names it takes, as the models publish them (``valid``); where it applies
(``applies``: a context strategy where the mesh has a context axis; elsewhere one task, and a
record of ``None``); the field it sets in what the model is built with, its config
(``configures``: the dtypes) or how the step runs it (``chooses``: dropout, the experts'
implementation and capacity), both in one place, :func:`configured`; and what it refuses in a
configuration before anything compiles (``check``, seeing a :class:`Setting`).

Every axis takes one path: the planner (:func:`jaxmem.resolve.plan`) makes a task per
combination of the inner axes' values (:func:`combinations`), a task's workload holds one value
of each, and the program reads them by name (:func:`one_each`, the train program's ``options``).
A new axis is one entry in :data:`AXES` (its declaration) and, where it changes the program, the
program code that reads ``options[<name>]``. An axis of another package's is declared the same
way, as an entry point in the group ``jaxmem.axes`` naming an :class:`Axis`
(``[project.entry-points."jaxmem.axes"] toy = "mypkg.axes:TOY"``): the records' fields are made
when jaxmem is imported, so an axis must be known by then.

>>> AXES["dropout"].parse("0,0.1", "dropout")
(0.0, 0.1)
>>> AXES["qk_dtype"].parse("bfloat16, float32", "qk_dtype")
('bfloat16', 'float32')
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any

from jaxmem import compilers
from jaxmem.errors import JaxmemError, StagesRefused
from jaxmem.inputs import Number, Whole
from jaxmem.mesh import MeshSpec, parse_mesh
from jaxmem.registry import published

# --- how a value is written: the parsers the axes declare ---


def _parts(v: Any) -> list[Any]:
  """A value written as a list (a list or a tuple) as its items; anything else as one item."""
  return list(v) if isinstance(v, (list, tuple)) else [v]


def names(v: str | Sequence[str] | None) -> tuple[str, ...]:
  """A sweep axis as a tuple of names: ``"a,b"``, ``["a", "b,c"]`` and ``None`` (empty) alike
  (a number, as in ``(2, 4)``, as its text)."""
  if v is None:
    return ()
  return tuple(n.strip() for p in _parts(v) for n in str(p).split(",") if n.strip())


def ints(v: int | str | Sequence[int | str] | None) -> tuple[int | str, ...]:
  """A sweep axis of whole numbers (``"1,4"``, ``4``, ``[1, "4"]``) as a tuple; entries that are
  not whole numbers stay as written, for :func:`jaxmem.resolve.plan` to refuse in one line."""
  if v is None:
    return ()
  out: list[int | str] = []
  for n in names([str(p) for p in _parts(v)]):
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
  out: list[str | None] = []
  for p in _parts(v):
    out += [None] if p is None else [None if n.lower() in DEFAULT_DTYPE_NAMES else n for n in names(p)]
  return tuple(dict.fromkeys(out))


def several(values: tuple[Any, ...], what: str) -> Any:
  """An outer axis's values: one value as itself (so a workload of one configuration reads as
  before), several as a tuple."""
  if not values:
    raise JaxmemError(f"`{what}` is empty; give values separated by commas")
  return values[0] if len(values) == 1 else values


def switches(v: Any, what: str) -> tuple[bool, ...]:
  """A sweep axis of on/off values: ``True``, ``"off,on"``, ``[False, True]``."""
  out = []
  for p in _parts(v):
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
  out = []
  for p in _parts(v):
    for n in str(p).split(","):
      if not n.strip():
        continue
      try:
        out.append(Number()(n))
      except JaxmemError:  # not a number, or not a finite one
        raise JaxmemError(f"`{what}` takes {takes}, got {n.strip()!r}") from None
  return tuple(dict.fromkeys(out))


def meshes(v: Any) -> tuple[str, ...]:
  """Meshes as written (``"data=2,fsdp=4"`` is one mesh: its commas separate axes, not meshes):
  a string, a sequence of strings, or ``(axis, size)`` pairs; ``None`` for the default mesh.
  Each is checked as a mesh (:func:`jaxmem.mesh.parse_mesh`) and kept as written."""
  if v is None:
    return ()
  if isinstance(v, str):
    return (_mesh_checked(v),)
  if not isinstance(v, (list, tuple)):
    raise JaxmemError(f"`mesh` takes meshes such as data=2,fsdp=4 (a string, a list of them, or (axis, size) pairs), "
                      f"got {v!r}")
  items = list(v)
  if items and all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], int) for x in items):
    return (_mesh_checked(_mesh_text(tuple(items))),)  # one mesh as (axis, size) pairs
  return tuple(_mesh_checked(x if isinstance(x, str) else _mesh_text(x)) for x in items)


def _mesh_text(pairs: Any) -> str:
  # As jaxmem.program.sharding.format_mesh writes a mesh (this module sits below it).
  if not isinstance(pairs, (list, tuple)) or not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in pairs):
    raise JaxmemError(f"`mesh` takes meshes such as data=2,fsdp=4 or (axis, size) pairs, got {pairs!r}")
  return ",".join(f"{a}={s}" for a, s in pairs)


def _mesh_checked(text: str) -> str:
  parse_mesh(text)
  return text


def listed(v: Any) -> bool:
  """Whether an outer axis's value is written as a list (``"a,b"``, a list, a tuple) rather than one value."""
  return isinstance(v, (str, list, tuple))


def _names(v: Any, name: str) -> tuple[str, ...]:
  return names(v)


def _ints(v: Any, name: str) -> tuple[int | str, ...]:
  return ints(v)


def _optional(v: Any, name: str) -> tuple[str | None, ...]:
  return optional_names(v)


def _meshes(v: Any, name: str) -> tuple[str, ...]:
  return meshes(v)


def _numbers(v: Any, name: str) -> tuple[float, ...]:
  return numbers(v, name)


def outer(parse: Callable[[Any, str], tuple[Any, ...]]) -> Callable[[Any, str], Any]:
  """An outer axis's parser from a list parser: a value written as a list (``"a,b"``) becomes one
  value or a tuple of several (:func:`several`); one value as given is checked the same way and
  stays one value."""
  def parse_outer(v: Any, name: str) -> Any:
    return several(parse(v if listed(v) else [v], name), name)
  return parse_outer


def _count(n: Any, name: str) -> int:
  return Whole()(n, f"`{name}`")


def _optional_ints(v: Any, name: str) -> tuple[int | None, ...]:
  return tuple(None if n is None else _count(ints(n)[0], name) for n in optional_names(v))


def _distinct_ints(v: Any, name: str) -> tuple[int, ...]:
  return tuple(dict.fromkeys(_count(n, name) for n in ints(v)))


def _probabilities(v: Any, name: str) -> tuple[float, ...]:
  out = numbers(v, name, "a probability in [0, 1) (several: separated by commas)")
  for p in out:
    if not 0 <= p < 1:
      raise JaxmemError(f"`{name}` must be a probability in [0, 1), got {p!r}")
  return out


def _positive(v: Any, name: str) -> tuple[float, ...]:
  out = numbers(v, name)
  for f in out:
    if not f > 0:
      raise JaxmemError(f"`{name}` must be > 0 (got {f:g})")
  return out


def counts(example: str) -> Callable[[Any, str], tuple[int, ...]]:
  """A parser of whole numbers of at least 1, each once (``"1,4"``); none at all, or anything
  else, is refused in one line (``example`` shows a list)."""
  def parse(v: Any, name: str) -> tuple[int, ...]:
    got = ints(v)
    if not got:
      raise JaxmemError(f"`{name}` is empty; give whole numbers separated by commas, e.g. {example}")
    for n in got:
      if not isinstance(n, int) or n < 1:
        raise JaxmemError(f"`{name}` must be whole numbers of at least 1 (got {n!r})")
    return tuple(dict.fromkeys(got))
  return parse


# The dtypes dot attention can form its scores in: the compute dtype (MaxText's default) or float32.
QK_DTYPES = ("bfloat16", "float32")


def one_of(valid: Sequence[str], what: str = "names") -> Callable[[Any, str], tuple[str, ...]]:
  """A parser of names each one of ``valid``, each once: an unknown one or none at all is
  refused in one line that lists the valid ones (``what`` says what the items are)."""
  def parse(v: Any, name: str) -> tuple[str, ...]:
    got = names(v)
    if not got:
      raise JaxmemError(f"`{name}` is empty; give {what} separated by commas from {', '.join(valid)}")
    for n in got:
      if n not in valid:
        raise JaxmemError(f"unknown `{name}` {n!r}; valid: {', '.join(valid)}")
    return tuple(dict.fromkeys(got))
  return parse


# --- the declaration ---


@dataclasses.dataclass(frozen=True, kw_only=True)
class Recorded:
  """How a result records an axis: the field's annotation (as written in source) and default."""

  annotation: str = "str | None"
  default: Any = None
  required: bool = False  # a configuration must give it (no default)
  doc: str = ""  # what the field holds, where it is not the value asked
  # Its place in a configuration's record (the JSON's and CSV's order): after the field ``after``
  # (None: the recorded axis declared before it), followed by the record's own fields ``then``.
  after: str | None = None
  then: tuple[str, ...] = ()


# When a result table shows an axis's column (Shown.when), given its rows: always; where the
# values differ between them; where some row has one; where some row's says something (is not
# one of the axis's ``quiet`` values).
ALWAYS, VARIES, GIVEN, SAID = "always", "varies", "given", "said"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Shown:
  """An axis's column in the result tables (:mod:`jaxmem.render.columns` lays them out from
  these): shown ``when`` (:data:`ALWAYS`, :data:`VARIES`, :data:`GIVEN`, :data:`SAID`, or a test
  of the rows), headed ``header`` (its name in words unless given), a number written as ``1.25``
  where ``number``. ``place``: where among the axes' columns, left to right (equal places in
  declared order; the configuration's own columns sit between: the pipeline's stages at 85, its
  bubble at 95). ``identity``: the column names what a summary (fit's answers, scale's exponents)
  is for, so a summary's table always shows it."""

  when: str | Callable[[Sequence[Any]], bool] = VARIES
  header: str | None = None
  number: bool = False
  place: int = 70
  identity: bool = False


class Apart(str):
  """An axis's heading format shown as its own part of compare's heading, not in the list of
  dtypes (``dropout 0.1``, ``sequence parallel``)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Setting:
  """One configuration as an axis's ``check`` sees it before anything is built: its value of
  every axis (one each, by name; ``None`` where the axis does not apply to it; the mesh as
  written), the model's config with these values (``None`` for a user's step; :func:`configured`),
  the target's platform and the optimizer (a :class:`jaxmem.program.optimizers.Optimizer`)."""

  values: Mapping[str, Any]
  cfg: Any = None
  platform: str = "cpu"
  optimizer: Any = None

  @property
  def mesh(self) -> MeshSpec:
    return parse_mesh(self.values["mesh"])


@dataclasses.dataclass(frozen=True, kw_only=True)
class Axis:
  """One sweep axis. ``name`` is the workload's field, the result records' field, the JSON key
  and (``--`` and dashes) the flag. ``parse(value, name)`` normalises what a user gives (a string
  from the flag, a value or a list from Python) to what the workload holds: a tuple of values, or
  for an ``outer`` axis one value or a tuple of several; it raises :class:`JaxmemError` (one line,
  naming the field in backticks) for a value it can tell is bad. What needs the models or the
  target to check (a kernel name, a dtype the step cannot take) is checked by the planner.

  ``outer``: each value is its own plan (it changes the model's config or the whole step's
  layout); otherwise each value is a task of one plan. ``training``: only a train step takes it
  (inference refuses it, ``fit --phase`` too).

  The flag: ``help`` (``None``: the command declares the flag itself), its default as a string
  ``flag_default`` (``None``: the library's choice, said as ``shown``), ``listed`` (the help says
  it sweeps and its default), ``list_note`` (said only where it sweeps), ``flag_options`` (more
  argparse settings), ``group`` (the CLI's group of flags it is added with: ``workload``,
  ``step``, ``precision``, ``parallelism``).

  The sweep: ``nest``, its place in the nesting of a plan's tasks (and so of the rows), outermost
  first (equal places nest in declared order). ``valid``: the kind of names it takes, as the
  models publish them (:func:`jaxmem.registry.published`), checked when a sweep is planned.
  ``applies``: a test of a configuration's values (one each, by name, the mesh as written) for
  where it means something (a context strategy on meshes with a context axis); elsewhere the
  configuration is planned once, with the axis at its default, and records ``None``, and a value
  given that applies to no configuration of the sweep is refused (``applies_to`` says where it
  applies, in the refusal). ``configures``: the field of the model's config it sets (the
  parameters' dtype); ``chooses``: the field of how the step runs the model it sets (a
  :class:`jaxmem.models.StepChoices`: the dropout rate); both applied in one place,
  :func:`configured`, where a value is given. ``check(value, setting)``: refuses a value that
  cannot be built in this configuration (:class:`Setting`), in one line, before any compile.

  The result: ``record`` (the field of :class:`~jaxmem.records.Configuration`; ``None`` where a
  record declares its own, as the placement's mesh), ``summary`` (fit's and scale's summaries
  carry it under its own name; ``False`` where they name it their own way), ``baseline`` (rows
  compared with a no-remat row share it).

  Columns: ``column`` (a :class:`Shown`), how the result tables show it; ``None``: no column.

  Labels: ``word`` names it in a row's label where its value is not one of ``quiet`` (nor equal
  to the field ``same_as``: the moments in the parameters' dtype); ``heading`` is the format of
  compare's heading where every row shares it (an :class:`Apart`: its own part, not in the dtype
  list).
  """

  name: str
  parse: Callable[[Any, str], Any] = _names
  default: Any = ()
  outer: bool = False
  training: bool = True
  # the flag
  help: str | None = None
  flag_default: Any = None
  shown: str | None = None
  listed: bool = True
  list_note: str = ""
  flag_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  group: str = "step"
  # A user's own step (Workload.step) takes it (the mesh, the policies) or brings its own in its
  # place (the optimizer, the dtypes); every other axis is refused beside a step.
  step: bool = False
  # What one layer saves for the backward pass, on one device, unsharded, before the optimizer
  # (compare --residuals: jaxmem.buffers.residuals) depends on it (the policies, the attention,
  # the microbatch, the dtypes, what the step runs the layer with); every other axis is refused there.
  layer: bool = False
  # the sweep
  nest: int = 30
  valid: str | None = None
  applies: Callable[[Mapping[str, Any]], bool] | None = None
  applies_to: str = ""
  configures: str | None = None
  chooses: str | None = None
  check: Callable[[Any, Setting], None] | None = None
  # A value that frees memory where the axis is at its default: one of the changes explain tries
  # for a configuration the compiler refuses for memory (jaxmem.planning.refusal); None: none.
  relief: Any = None
  # the result
  record: Recorded | None = Recorded()
  summary: bool = True
  baseline: bool = True
  # labels and columns
  word: str | None = None
  quiet: tuple[Any, ...] = (None, False)
  same_as: str | None = None
  heading: str | Apart | None = None
  column: Shown | None = Shown()

  @property
  def column_header(self) -> str:
    """Its column's header in the result tables (its name in words unless declared)."""
    return (self.column and self.column.header) or self.name.replace("_", " ")

  @property
  def unset(self) -> Any:
    """What the workload holds where none is given (its default, normalised)."""
    return self.normalise(self.default)

  def applies_to_values(self, values: Mapping[str, Any]) -> bool:
    """Whether it means something in a configuration of these values (one each, by name)."""
    return self.applies is None or bool(self.applies(values))

  @property
  def flag(self) -> str:
    return "--" + self.name.replace("_", "-")

  @property
  def flag_type(self) -> FlagValue:
    """Its flag's parser (argparse's ``type=``)."""
    return FlagValue(self.name)

  def normalise(self, value: Any) -> Any:
    """``value`` as the workload holds it."""
    return self.parse(value, self.name)

  def values(self, w: Any) -> tuple[Any, ...]:
    """The workload's values of this axis, as a tuple (an outer axis's one value as one)."""
    return self.values_of(getattr(w, self.name))

  @staticmethod
  def values_of(v: Any) -> tuple[Any, ...]:
    """A normalised value as a tuple of values (an outer axis's one value as one)."""
    return v if isinstance(v, tuple) else (v,)

  def first(self, w: Any) -> Any:
    """The value a workload of one configuration holds (its first; ``None`` where it has none)."""
    values = self.values(w)
    return values[0] if values else None

  def label(self, r: Any) -> str | None:
    """The words naming a result's value of this axis, or ``None`` where they say nothing (a
    value of ``None``, unset, never does)."""
    v = getattr(r, self.name, None)
    if self.word is None or v is None or v in self.quiet or (self.same_as and v == getattr(r, self.same_as, None)):
      return None
    return self.word if v is True else f"{self.word} {v:g}" if isinstance(v, float) else f"{self.word} {v}"


@dataclasses.dataclass(frozen=True)
class FlagValue:
  """An axis's flag's parser (its argparse ``type=``): the text is checked by the axis's own
  parser, and its names against the names of the kind it takes (``valid``), when the command
  line is read, so a bad value is refused before anything starts; the flag holds the text, which
  the workload's field parses (:meth:`Axis.normalise`)."""

  axis: str

  def __call__(self, text: str) -> str:
    a = AXES[self.axis]
    check_valid(a, a.values_of(a.normalise(text)))
    return text


def _registry(*axes: Axis) -> dict[str, Axis]:
  return {a.name: a for a in axes}


_PRECISION_NOTE = "; `none` or `default` in a list for the default"


# --- the hooks the declarations below use ---


def _on_mesh_axis(axis: str) -> Callable[[Mapping[str, Any]], bool]:
  """Applies where the configuration's mesh splits over ``axis`` (more than one device)."""
  def applies(values: Mapping[str, Any]) -> bool:
    mesh = values.get("mesh")
    return mesh is not None and dict(parse_mesh(mesh)).get(axis, 1) > 1
  return applies


def _capacity_path(values: Mapping[str, Any]) -> bool:
  """A capacity factor applies to ``moe_impl`` capacity, which a factor alone implies."""
  return values.get("moe_impl") in (None, "capacity")


def _experts_only(value: Any, s: Setting) -> None:
  if value is not None and s.cfg is not None and not s.cfg.is_moe:
    raise JaxmemError(
        f"`moe_impl` and `capacity_factor` apply to mixture-of-experts models; {s.cfg.name} has no experts (drop them)"
    )


def _kernel_of_experts(value: Any, s: Setting) -> None:
  if value not in (None, "auto") and s.cfg is not None and not s.cfg.is_moe:
    raise JaxmemError(f"`moe_kernel` applies to mixture-of-experts models; {s.cfg.name} has no experts (drop it)")


def _experts_to_shard(value: Any, s: Setting) -> None:
  if value and s.cfg is not None and not s.cfg.is_moe:
    raise JaxmemError(f"`fsdp_shard_on_exp` shards routed experts' weights; {s.cfg.name} has no experts (drop it)")


def _quantized_layers(value: Any, s: Setting) -> None:
  # fp8_full is built for the decoder's own attention and MLP projections (models/fp8.py); a model
  # whose layers bring their own matmuls (routed experts' grouped matmuls, latent attention, Gemma
  # 4's) would be quantized in part, so it is refused, and MaxText's own step quantizes them all.
  cfg = s.cfg
  if value in (None, "none") or cfg is None:
    return
  own = [what for what, yes in (("routed experts", cfg.is_moe), ("latent attention", cfg.is_mla),
                                ("Gemma 4 layers", cfg.gemma4 != type(cfg.gemma4)())) if yes]
  if own:
    raise JaxmemError(f"`quantization` {value} is built for dense attention and MLP projections; {cfg.name} has "
                      f"{' and '.join(own)} (drop it, or run MaxText's step: `maxtext`)")


def _unstaged(value: Any, s: Setting) -> None:
  if value and dict(s.mesh).get("stage", 1) > 1:
    raise StagesRefused(
        f"`dropout` with a stage axis (mesh {s.values['mesh']}) is not built: the pipeline's iterations carry no "
        "dropout keys; set dropout 0 or drop the stage axis", reason="dropout with a stage axis is not built",
    )


def _optimizer_with_moments(value: Any, s: Setting) -> None:
  refusal = None if value is None or s.optimizer is None else s.optimizer.moments_refusal()
  if refusal is not None:
    raise JaxmemError(f"`moments_dtype` {refusal}")


def _compilers(v: Any, name: str) -> tuple[str, ...]:
  return compilers.parse(v, name)


def _compiler_here(value: Any, s: Setting) -> None:
  # Before anything compiles: the release is for the target's platform and can be had (fetched
  # now where it is neither installed nor fetched before), else one line.
  if value is not None:
    compilers.check(value, s.platform)


def _mesh_shown(rows: Sequence[Any]) -> bool:
  # Where meshes differ, or one mesh spreads over several devices (a single device's says nothing).
  return len({r.mesh for r in rows}) > 1 or (rows[0].num_devices or 1) > 1


# Every axis, in the order fit's and scale's summaries carry them, labels name them, compare's
# headings and flags follow and a sweep nests its outer axes (the inner ones nest by ``nest``); a
# configuration's record orders its fields by ``record.after``, the tables their columns by
# ``column.place``.
AXES: dict[str, Axis] = _registry(
    Axis(name="mesh", parse=_meshes, default=(), training=False, group="workload", record=None, summary=False,
         step=True, flag_options={"action": "append"}, listed=False, nest=50,
         column=Shown(when=_mesh_shown, place=10, identity=True),
         help="mesh axes, e.g. data=4 or fsdp=2,tensor=2; repeat for one row group per mesh (default: fsdp over all "
         "devices)"),
    Axis(name="remat", layer=True, default=("none", "dots_saveable", "full"), record=Recorded(annotation="str", required=True),
         summary=False, baseline=False, step=True, nest=90, column=Shown(when=ALWAYS, place=100, identity=True)),
    Axis(name="optimizer", default=("adamw",), record=Recorded(annotation="str", required=True, then=("seq",)),
         summary=False, step=True, nest=60, column=Shown(place=20, identity=True)),
    Axis(name="moe_impl", layer=True, default=(), training=False, group="workload", summary=False, listed=False,
         valid="MoE implementation", chooses="moe_impl", nest=10, check=_experts_only, column=Shown(when=GIVEN, header="moe", place=80),
         record=Recorded(after="qk_dtype", doc="how a mixture of experts' routed experts ran; None for a dense model"),
         help="mixture-of-experts models: how routed experts run, dropless (tokens sorted by expert, grouped matmuls) "
         "and/or capacity (GShard dispatch; copies past capacity dropped), comma separated; default dropless, "
         "capacity on GPU targets"),
    Axis(name="capacity_factor", layer=True, parse=_positive, default=(), training=False, group="workload", summary=False,
         listed=False, chooses="capacity_factor", nest=10, applies=_capacity_path, applies_to="`moe_impl` capacity; add capacity to `moe_impl`",
         check=_experts_only, column=Shown(when=GIVEN, header="capacity factor", number=True, place=80),
         record=Recorded(annotation="float | None", doc="the capacity path's factor; None for dropless or a dense model"),
         help="capacity path: slots per expert over its fair share, comma separated (implies --moe-impl capacity); "
         "default 1.25"),
    # A row records the kernel run (gmm where auto was asked on TPU), None where no dropless
    # experts ran; the program refuses one the target cannot compile.
    Axis(name="moe_kernel", default=("auto",), group="workload", valid="MoE kernel", check=_kernel_of_experts,
         flag_default="auto", listed=False, word="moe kernel", quiet=(None, "auto"),
         record=Recorded(after="capacity_factor", doc="the grouped matmul the dropless experts ran (gmm where auto "
                         "was asked on TPU); None for capacity or a dense model"),
         help="mixture-of-experts models, dropless: the experts' grouped matmul, gmm (megablox's Pallas TPU kernel, "
         "MaxText's sparse_matmul path) or ragged_dot (jax.lax.ragged_dot, which XLA's TPU and GPU compilers expand "
         "into a dense matmul over all experts), comma separated; default auto: gmm on TPU targets, ragged_dot "
         "elsewhere"),
    # A row records it where it applies to the experts' weights (None for a dense model, or a mesh
    # without an fsdp axis); the program shards by it (jaxmem.program.sharding.param_rules).
    # Nested inside the mesh, so one mesh's two placements sit side by side; fit's and scale's
    # summaries say it in their `moe` (jaxmem.program.train.moe_summary).
    Axis(name="fsdp_shard_on_exp", parse=switches, default=(False,), group="parallelism", nest=55, summary=False,
         check=_experts_to_shard, applies=_on_mesh_axis("fsdp"),
         applies_to="meshes with an fsdp axis (e.g. fsdp=4); no mesh here has one",
         column=Shown(when=SAID, header="experts on fsdp", place=80), word="experts on fsdp",
         record=Recorded(annotation="bool | None", default=None, after="moe_kernel",
                         doc="whether the routed experts' weights were split on their expert dimension over fsdp "
                         "(MaxText's fsdp_shard_on_exp); None for a dense model or a mesh without an fsdp axis"),
         flag_options={"nargs": "?", "const": "on", "metavar": "off,on"}, shown="off",
         help="mixture-of-experts models on a mesh with an fsdp axis: split the routed experts' weights on their "
         "expert dimension over fsdp (and expert, context) instead of d_model over fsdp, MaxText's "
         "fsdp_shard_on_exp (the experts must divide by those axes); the flag alone is on, off,on compiles both"),
    Axis(name="param_dtype", layer=True, parse=outer(_optional), default=None, outer=True, group="workload", step=True,
         configures="param_dtype",
         record=Recorded(annotation="str", required=True, after="seq"), help="parameter dtype", shown="float32",
         word="params", quiet=(None, "float32"), heading="{} params"),
    Axis(name="dtype", layer=True, parse=outer(_optional), default=None, outer=True, training=False, group="workload", step=True,
         configures="dtype",
         record=Recorded(annotation="str", required=True), help="compute dtype (infer: one)", shown="bfloat16",
         word="compute", quiet=(None, "bfloat16"), heading="{} compute"),
    # The flag's help lists the models' kernels, which the CLI gives (jaxmem.models.attention_help);
    # the target and mesh's kernels are the program's to refuse (jaxmem.program.train.pick_attention).
    Axis(name="attention", layer=True, default=("auto",), training=False, group="workload", summary=False, valid="attention",
         flag_default="auto", listed=False, nest=70, column=Shown(when=GIVEN, place=30, identity=True),
         record=Recorded(doc="the implementation used (splash where auto was asked on TPU); None where not "
                         "recorded (a user's step)")),
    Axis(name="dropout", layer=True, parse=outer(_probabilities), default=0.0, outer=True, group="parallelism", chooses="dropout",
         check=_unstaged, record=Recorded(annotation="float", default=0.0, after="sequence_parallel"), shown="0",
         help="the models' dropout probability (embeddings, attention probabilities under --attention dot, both "
         "sub-blocks' outputs; masks are one byte each)",
         word="dropout", quiet=(None, False, 0.0), heading=Apart("dropout {:g}")),
    Axis(name="sequence_parallel", parse=outer(switches), default=False, outer=True, group="parallelism",
         record=Recorded(annotation="bool", default=False, after="bubble_fraction"), listed=False,
         flag_options={"nargs": "?", "const": "on", "metavar": "off,on"},
         help="Megatron sequence parallelism: split the residual stream, norms and dropouts along the sequence over "
         "the tensor axis (all-gather before, reduce-scatter after the tensor-parallel matmuls); needs --mesh "
         "tensor=N; the flag alone is on, off,on compiles both",
         word="sequence parallel", heading=Apart("sequence parallel")),
    Axis(name="microbatches", layer=True, parse=counts("1,4"), default=(1,), nest=80,
         record=Recorded(annotation="int", default=1, after="attention"), summary=False, flag_default="1",
         column=Shown(when=SAID, place=50),
         help="gradient accumulation: split the global batch into N microbatches run in sequence",
         word="microbatches", quiet=(1,)),
    Axis(name="vocab_tiles", parse=counts("1,8"), default=(1,), nest=40, record=Recorded(annotation="int", default=1),
         flag_default="1", relief=8, column=Shown(when=SAID, place=60),
         help="compute the output projection and loss in N tiles of the tokens (MaxText's num_vocab_tiling)",
         word="vocab tiles", quiet=(1,)),
    Axis(name="context_strategy", default=("all_gather",), flag_default="all_gather",
         valid="context strategy", nest=100, applies=_on_mesh_axis("context"),
         applies_to="meshes with a context axis (e.g. context=2,fsdp=4); no mesh here has one",
         column=Shown(when=GIVEN, place=40),
         record=Recorded(after="dropout", doc="None on a mesh without a context axis over the sequence"),
         help="how attention crosses a sequence split over a context mesh axis: all_gather (MaxText's default: "
         "keys and values gathered, causal load balanced) or ring (ppermute of key/value blocks, online softmax)"),
    Axis(name="pipeline_microbatches", parse=outer(_optional_ints), default=None, outer=True,
         applies=_on_mesh_axis("stage"), applies_to="meshes with a stage axis (e.g. stage=4,fsdp=2); no mesh here has one",
         column=Shown(when=GIVEN, header="pipeline mb", place=90),
         record=Recorded(annotation="int | None", after="stages", doc="the schedule's (None without stages)"),
         shown="the stage count",
         help="meshes with a stage axis: cut each batch (or --microbatches microbatch) into N pipeline "
         "microbatches (MaxText's num_pipeline_microbatches; at least the stages; none for the stage count)"),
    # An int flag default: fit --phase tells a given flag by its default.
    Axis(name="pipeline_repeats", parse=outer(_distinct_ints), default=1, outer=True, quiet=(None, 1),
         applies=_on_mesh_axis("stage"), applies_to="meshes with a stage axis (e.g. stage=4,fsdp=2); no mesh here has one",
         column=Shown(when=SAID, header="repeats", place=90),
         record=Recorded(annotation="int | None", then=("bubble_fraction",), doc="the schedule's (None without stages)"),
         flag_default=1, listed=False,
         help="meshes with a stage axis: MaxText's circular schedule, R non-adjacent layer groups per stage; "
         "comma separated to sweep; default 1"),
    Axis(name="qk_dtype", layer=True, parse=one_of(QK_DTYPES, "dtypes"), default=("bfloat16",), training=False, group="workload", flag_default="bfloat16",
         record=Recorded(annotation="str", default="bfloat16", after="vocab_tiles"),
         help="dot attention's scores (prefill's, in infer): bfloat16 (MaxText's default: the compute dtype) or float32",
         word="qk", quiet=(None, "bfloat16")),
    Axis(name="master_dtype", parse=_optional, default=(None,), group="precision", shown="none", nest=20,
         record=Recorded(after="moe_kernel", doc="the optimizer state's master copy of the parameters (None: none)"),
         help="keep a master copy of the parameters in this dtype in the optimizer state (float32 with "
         "--param-dtype bfloat16: ZeRO's 2 + 2 + 12 bytes per parameter)", list_note=_PRECISION_NOTE,
         word="master", heading="{} master copy"),
    Axis(name="moments_dtype", parse=_optional, default=(None,), group="precision", nest=20, check=_optimizer_with_moments,
         record=Recorded(doc="the dtype the optimizer's moments are stored in, as resolved (None: no moments)"),
         shown="the dtype the optimizer updates in (the master copy's, else the parameters')",
         help="store the optimizer's moments in this dtype (adam, adamw, momentum, nesterov, lion)",
         list_note=_PRECISION_NOTE, word="moments", same_as="param_dtype", heading="{} moments"),
    Axis(name="grad_reduce_dtype", parse=_optional, default=(None,), group="precision", shown="the parameters' dtype",
         nest=20, record=Recorded(then=("stages",), doc="the dtype gradients were asked to be formed and reduced in "
                                  "(None: the parameters')"),
         help="form and reduce the gradients over the data axes in this dtype", list_note=_PRECISION_NOTE,
         word="grad reduce", heading="{} gradient reduction"),
    Axis(name="quantization", default=("none",), valid="quantization", chooses="quantization",
         nest=20, check=_quantized_layers, flag_default="none", word="quantization", quiet=(None, "none"),
         column=Shown(when=SAID, place=65),
         record=Recorded(annotation="str", default="none", after="grad_reduce_dtype",
                         doc="the layers' matmuls: none, or fp8_full (MaxText's quantization=fp8_full)"),
         help="the layers' projections (attention's q/k/v/o, the MLP's) as MaxText's quantization=fp8_full runs "
         "them through qwix: operands in float8_e4m3fn at the recipes' fixed -224,224 scale, gradients in "
         "float8_e5m2; none or fp8_full, comma separated to sweep (targets with an fp8 matmul: TPU v5p, v7x; NVIDIA "
         "from Ada and Hopper)"),
    # Innermost, so the releases of one configuration sit side by side.
    Axis(name="compiler", parse=_compilers, default=(), nest=110, check=_compiler_here, summary=True, step=True,
         column=Shown(when=GIVEN, place=5, identity=True),
         record=Recorded(after="remat", doc="the compiler release it was compiled under, in a worker process that "
                         "loads it (libtpu==0.0.52); None: the one this process loads (its versions say which)"),
         help="compile each configuration under these compiler releases, one row each: libtpu==X for TPU targets, "
         "jax-cuda12-plugin==X for GPU ones (fetched once from the package index, each compiled in a worker process "
         "that loads it); comma separated", listed=False, word="compiler"),
)


def register(axis: Axis) -> Axis:
  """Adds ``axis`` to :data:`AXES` (after jaxmem's own). Only before the records and the
  workload are made, so: from an entry point (see the module's docstring)."""
  if axis.name in AXES:
    raise ValueError(f"axis {axis.name!r} is declared twice")
  AXES[axis.name] = axis
  return axis


def _plugins() -> None:
  for ep in entry_points(group="jaxmem.axes"):
    register(ep.load())


_plugins()


# --- what the rest of jaxmem derives ---


def declared(*, training: bool | None = None) -> Iterator[Axis]:
  """The axes, in order; ``training`` True or False: a train step's own, or every workload's."""
  return (a for a in AXES.values() if training is None or a.training == training)


def outer_axes() -> tuple[str, ...]:
  """The axes swept a plan per value (the model's config, the step's layout)."""
  return tuple(a.name for a in AXES.values() if a.outer)


def recorded() -> tuple[Axis, ...]:
  """The axes a configuration records under their own name."""
  return tuple(a for a in AXES.values() if a.record is not None)


def swept_fields() -> tuple[str, ...]:
  """The recorded axes that fit's and scale's summaries carry under their own name."""
  return tuple(a.name for a in recorded() if a.summary)


def training_only() -> tuple[str, ...]:
  """The axes only a train step takes."""
  return tuple(a.name for a in AXES.values() if a.training)


def baseline_fields() -> tuple[str, ...]:
  """What a row shares with the no-remat row it is compared with: the placement's target, mesh,
  batch and sequence, and every recorded axis but the policy."""
  return ("target", "mesh", "batch", "seq", *(a.name for a in recorded() if a.baseline))


def group_fields() -> tuple[str, ...]:
  """What the rows of one configuration share across a grid of batches and sequences."""
  return ("mesh", *(a.name for a in recorded()))


def key(r: Any, fields: Sequence[str]) -> tuple:
  """``r``'s values of ``fields`` (a row, or its dict from JSON)."""
  get = r.get if isinstance(r, dict) else lambda k: getattr(r, k, None)
  return tuple(get(k) for k in fields)


def labels(r: Any) -> list[str]:
  """The words naming a result's axes where they say something (``microbatches 4``, ``dropout 0.1``)."""
  return [w for a in AXES.values() if (w := a.label(r)) is not None]


def one_value_each(w: Any, what: str, *, only: Sequence[str] | None = None, skip: Sequence[str] = ()) -> None:
  """A one-line error where ``w`` gives several values of an axis (of ``only``, else every axis
  it has but those in ``skip``) to ``what``, which takes one configuration of them."""
  for a in AXES.values():
    chosen = a.name in only if only is not None else a.name not in skip
    if chosen and hasattr(w, a.name) and len(values := a.values(w)) > 1:
      got = ", ".join(map(str, values))
      raise JaxmemError(f"{what} takes one `{a.name}` (got {got}); run it once per value")


# --- a sweep's configurations, as the planner makes and checks them ---


def inner_axes(w: Any) -> tuple[Axis, ...]:
  """The axes of ``w`` (a workload) that a plan makes a task per value of, in their nesting
  order (``nest``; equal places in declared order), outermost first."""
  return tuple(sorted((a for a in AXES.values() if not a.outer and hasattr(w, a.name)), key=lambda a: a.nest))


def one_each(w: Any) -> dict[str, Any]:
  """The value of every axis ``w`` (a workload of one configuration) has, by name: its one value,
  ``None`` where it gives none or where the axis does not apply to the configuration. What the
  program reads its options from, and a configuration records as asked."""
  values = {a.name: a.first(w) for a in AXES.values() if hasattr(w, a.name)}
  return {n: v if AXES[n].applies_to_values(values) else None for n, v in values.items()}


def combinations(inner: Mapping[str, tuple[Any, ...]], fixed: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
  """Every configuration of the inner axes' values ``inner`` (by name, in nesting order), each
  as a task's workload holds it: one value of each axis, ``(v,)``, or the axis's unset value
  where it has none or does not apply to the configuration (:attr:`Axis.applies`, tested on its
  values with ``fixed``, the plan's one value of each outer axis); each configuration once, in
  the order of the first of its kind."""
  out: dict[tuple, dict[str, Any]] = {}
  for combo in itertools.product(*(tuple((v,) for v in vs) or ((),) for vs in inner.values())):
    chosen = dict(zip(inner, combo, strict=True))
    one = {**(fixed or {}), **{n: v[0] if v else None for n, v in chosen.items()}}
    for n in inner:
      if not AXES[n].applies_to_values(one):
        chosen[n] = AXES[n].unset
    out.setdefault(tuple(chosen.items()), chosen)
  return list(out.values())


def values_of(combo: Mapping[str, tuple[Any, ...]], fixed: Mapping[str, Any] | None = None) -> dict[str, Any]:
  """A configuration as :func:`combinations` gives it, as one value of every axis (``fixed``: the
  outer axes'), ``None`` where it has none or the axis does not apply: what its program reads and
  its checks see (:func:`one_each` of its task's workload)."""
  one = {**(fixed or {}), **{n: v[0] if v else None for n, v in combo.items()}}
  return {n: v if AXES[n].applies_to_values(one) else None for n, v in one.items()}


def check_names(w: Any) -> None:
  """Each axis's names against the names of the kind it takes (``valid``, as published): one line
  naming the first unknown, with the valid ones. None at all is refused, unless none is the axis's
  default (the model's choice)."""
  for a in AXES.values():
    if a.valid is not None and hasattr(w, a.name):
      check_valid(a, a.values(w))


def check_valid(a: Axis, got: tuple[Any, ...]) -> None:
  """``got``, the axis's values, against the names of the kind it takes (``valid``; nothing to
  check for an axis that takes no registry's names)."""
  if a.valid is None:
    return
  valid = published(a.valid)
  if not got and a.unset != ():
    raise JaxmemError(f"`{a.name}` is empty; give names separated by commas from {', '.join(valid)}")
  for n in got:
    if n not in valid:
      raise JaxmemError(f"unknown `{a.name}` {n!r}; valid: {', '.join(valid)}")


def check_applies(w: Any, configurations: Sequence[Mapping[str, Any]]) -> None:
  """A one-line error for a value given to an axis (not its default) that applies to none of the
  sweep's ``configurations`` (their values, one each, by name): it would change nothing, and
  silently so."""
  for a in AXES.values():
    if a.applies is None or not hasattr(w, a.name) or getattr(w, a.name) == a.unset:
      continue
    if not any(a.applies(c) for c in configurations):
      raise JaxmemError(f"`{a.name}` applies to {a.applies_to}")


def check_setting(s: Setting) -> None:
  """Each axis's ``check`` of its value in the configuration ``s``: one line where it cannot be
  built there."""
  for a in AXES.values():
    if a.check is not None and a.name in s.values:
      a.check(s.values[a.name], s)


def configured(cfg: Any, choices: Any, values: Mapping[str, Any]) -> tuple[Any, Any]:
  """What the model is built with, given each axis's value (``values``: one each, by name): the
  model's config ``cfg`` with the value of each axis that configures it (``configures``) and the
  step's choices ``choices`` (a :class:`jaxmem.models.StepChoices`) with the value of each axis
  that chooses how the step runs it (``chooses``). The one place where an axis's value becomes
  what the model is built from; an axis left at its default leaves the config's or choices' own."""
  given = [a for a in AXES.values() if values.get(a.name) not in (None, a.unset)]
  model = {a.configures: values[a.name] for a in given if a.configures is not None}
  step = {a.chooses: values[a.name] for a in given if a.chooses is not None}
  return (dataclasses.replace(cfg, **model) if model else cfg,
          dataclasses.replace(choices, **step) if step else choices)


def as_configured(cfg: Any, choices: Any) -> dict[str, Any]:
  """The value of each axis that configures the model or chooses how the step runs it, as the
  config ``cfg`` and the choices ``choices`` hold it, by the axis's name (what a row records: the
  model's own where the workload left it)."""
  return {a.name: configured_value(cfg, choices, a.name) for a in AXES.values()
          if a.configures is not None or a.chooses is not None}


def configured_value(cfg: Any, choices: Any, name: str) -> Any:
  """The value of the axis ``name`` (one that configures the model or chooses how the step runs
  it) as ``cfg`` or ``choices`` holds it."""
  axis = AXES[name]
  return getattr(cfg, axis.configures) if axis.configures is not None else getattr(choices, axis.chooses)


# --- the fields records and workloads are made with ---


def with_fields(kind: str) -> Callable[[type], type]:
  """A class decorator, applied under ``@dataclass``, that adds the axes' fields to the class
  body's: ``kind`` ``"workload"`` (every workload's axes, with their defaults), ``"training"`` (a
  train step's), ``"record"`` (what a configuration records, ordered by each axis's
  ``record.after`` and ``record.then``, so the fields, the JSON's and CSV's, read as a
  configuration's), ``"summary"`` (fit's and scale's summaries: the recorded axes, ``None`` where
  unknown). The class body's own fields come first unless an axis places them."""

  def add(cls: type) -> type:
    own = dict(inspect.get_annotations(cls))
    fields = _fields(kind)
    types = {**own, **{name: annotation for name, annotation, _ in fields}}
    order = _layout(list(own), [name for name, _, _ in fields]) if kind == "record" else [*own, *(n for n, _, _ in fields)]
    for name, _, default in fields:
      if default is not dataclasses.MISSING:
        setattr(cls, name, default)
    cls.__annotations__ = {n: types[n] for n in order}
    return cls

  return add


def with_optional_fields(axes: Sequence[Axis], *, after: str) -> Callable[[type], type]:
  """A class decorator, applied under ``@dataclass``: a field for each of ``axes`` (its recorded
  annotation, optional; default ``None``), in order, after the class body's field ``after``."""

  def add(cls: type) -> type:
    own = dict(inspect.get_annotations(cls))
    added = {a.name: _optional_annotation(a.record.annotation if a.record else "Any") for a in axes}
    order = list(own)
    at = order.index(after) + 1
    order[at:at] = list(added)
    for name in added:
      setattr(cls, name, None)
    cls.__annotations__ = {n: {**own, **added}[n] for n in order}
    return cls

  return add


def _layout(own: list[str], names: list[str]) -> list[str]:
  """A record's field order: each recorded axis after its ``record.after`` (else the axis
  before it), each followed by the own fields it names in ``record.then``; the own fields no axis
  places first. An axis whose place is not yet laid out waits for it."""
  placed = {n for name in names for n in AXES[name].record.then}
  order = [n for n in own if n not in placed]
  waiting = list(names)
  while waiting:
    progress = False
    for name in list(waiting):
      rec = AXES[name].record
      i = names.index(name)
      anchor = rec.after if rec.after is not None else (names[i - 1] if i else None)
      if anchor is not None and anchor not in order:
        continue
      at = order.index(anchor) + 1 if anchor is not None else len(order)
      order[at:at] = [name, *(n for n in rec.then if n in own)]
      waiting.remove(name)
      progress = True
    if not progress:
      raise ValueError(f"axes {waiting} follow fields this record does not have")
  return order


def _fields(kind: str) -> list[tuple[str, str, Any]]:
  if kind in ("workload", "training"):
    return [(a.name, "Any", a.default) for a in declared(training=kind == "training")]
  if kind == "record":
    return [(a.name, a.record.annotation, dataclasses.MISSING if a.record.required else a.record.default)
            for a in recorded()]
  if kind == "summary":
    return [(a.name, _optional_annotation(a.record.annotation), None) for a in recorded() if a.summary]
  raise ValueError(f"unknown kind of fields {kind!r}")


def _optional_annotation(annotation: str) -> str:
  return annotation if "None" in annotation else f"{annotation} | None"
