"""A plan's answer as a launch: the MaxText command-line overrides for a compiled configuration.

:func:`maxtext_overrides` maps a :class:`~jaxmem.planning.search.PlanResult`'s recommendation
(or any compiled row) to MaxText's ``key=value`` overrides of its ``configs/base.yml``, the
spelling ``python -m maxtext.trainers.pre_train.train`` and ``train_compile`` take after the
config file, through the one table ``--maxtext`` reads (:mod:`jaxmem.maxtext.table`): what this
writes, ``compare --maxtext base.yml <the overrides>`` takes. A choice MaxText has no spelling
for is never dropped in silence: it is left out of the overrides and named in ``notes`` in the
words ``--maxtext`` refuses it with (:class:`~jaxmem.maxtext.table.NoMaxTextMapping`).

What maps (the table says how): the model (``model_name`` where MaxText has jaxmem's preset
under its name, else a plain Llama-style decoder's dimensions on MaxText's ``llama2`` block), a
GPU target (``hardware``), the mesh (``ici_*`` and ``dcn_*``: the slices from the mesh's leading
axes), the batch (``per_device_batch_size`` over the devices and microbatches) and
``gradient_accumulation_steps``, ``max_target_length``, the remat policy (``remat_policy``, or
``custom`` with each tensor's place), attention, ``num_vocab_tiling``, a stage axis's pipeline
schedule, the optimizer and dtypes, the moments' dtype (``mu_dtype``), a mixture of experts' path,
dropout and the context strategy.

A plan of MaxText's own step (``plan --maxtext``) is in MaxText's names already: its launch is
the plan's overrides with its choices (mesh, batch, microbatches, remat, attention) after them,
spelt through the same rows.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxmem.errors import JaxmemError
from jaxmem.maxtext import table as t
from jaxmem.maxtext import step as mx
from jaxmem.mesh import parse_mesh
from jaxmem.models import get_config
from jaxmem.records import Configuration, Record

# Configuration fields that describe the row rather than choose (the model is spelt first, apart).
_DESCRIBED = {"model", "num_devices", "stages", "bubble_fraction"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class MaxTextLaunch(Record):
  """A configuration as MaxText overrides: ``overrides`` (key -> value, in the order written),
  ``notes`` (each choice of jaxmem's with no MaxText spelling, and how the others were spelled
  where it is not plain) and ``configuration`` (the row's, in a few words)."""

  configuration: str
  overrides: dict[str, Any]
  notes: tuple[str, ...] = ()

  def line(self) -> str:
    """The overrides as one command-line tail, ``key=value key=value ...``."""
    return " ".join(f"{k}={t.text(v)}" for k, v in self.overrides.items())


def maxtext_overrides(result: Any, *, layers: int | None = None) -> MaxTextLaunch:
  """MaxText's overrides for ``result``: a :class:`~jaxmem.planning.search.PlanResult` (its
  recommendation) or a compiled row. ``layers``: the model's decoder layers, needed only for a
  pipeline's ``num_layers_per_pipeline_stage`` (read from the model's preset where omitted)."""
  row = _recommended(result) if hasattr(result, "recommended") else result
  if getattr(result, "maxtext", None):
    return _maxtext_plan_launch(result.maxtext, row)
  cfg = getattr(row, "config", row)
  if not isinstance(cfg, Configuration) and not all(hasattr(cfg, f) for f in ("mesh", "remat", "batch", "seq")):
    raise JaxmemError(f"maxtext_overrides takes a plan or a compiled row, not {type(result).__name__}")
  model = _model_config(cfg.model)
  out: dict[str, Any] = {}
  notes: list[str] = []
  try:
    out.update(t.model_settings(cfg.model, model))
    notes += t.model_notes(cfg.model)
  except t.NoMaxTextMapping as e:
    notes.append(e.note)
  values = {name: getattr(cfg, name, None) for name in t.ROWS} | {"mesh": parse_mesh(cfg.mesh)}
  settings, said = t.spell(tuple(t.ROWS), values, at_of(cfg, layers if layers is not None else
                                                      getattr(model, "num_layers", None)))
  out.update(settings)
  notes += said + [e.note for e in _unmapped(cfg)]
  words = f"{cfg.mesh} {cfg.remat} mb{cfg.microbatches} {cfg.attention or ''}".strip()
  return MaxTextLaunch(configuration=words, overrides=out, notes=tuple(notes))


def at_of(cfg: Any, layers: int | None) -> t.At:
  """What the table's spellings of ``cfg`` depend on, from the configuration itself."""
  try:
    kernel = t.attention(cfg.attention)
  except t.NoMaxTextMapping:
    kernel = None
  return t.At(mesh=parse_mesh(cfg.mesh), devices=cfg.num_devices, slices=_slices(cfg.target),
              microbatches=cfg.microbatches or 1, attention=kernel, param_dtype=cfg.param_dtype,
              optimizer=cfg.optimizer, capacity_factor=getattr(cfg, "capacity_factor", None), layers=layers,
              gpu=(cfg.target or "").startswith("gpu:"))


def _maxtext_plan_launch(args: tuple[str, ...], row: Any) -> MaxTextLaunch:
  """A plan of MaxText's own step (``plan --maxtext``): its overrides, then the options the
  plan chose for ``row``, in MaxText's names already (the rows its compile used)."""
  micro = row.microbatches or 1
  mesh = parse_mesh(row.mesh)
  at = t.At(mesh=mesh, devices=row.num_devices, microbatches=micro)
  chosen = {**t.per_device_batch(row.batch, at), "max_target_length": row.seq, "gradient_accumulation_steps": micro,
            **t.maxtext_remat(row.remat), "attention": row.attention, **t.mesh_settings(mesh, at)}
  out = {**mx.overrides(args), **chosen}
  words = f"{row.mesh} {row.remat} mb{micro} {row.attention}"
  return MaxTextLaunch(configuration=words, overrides=out, notes=(
      f"MaxText config {args[0]}: these overrides follow it (the plan's own, then what it chose)",))


def _model_config(name: str) -> Any:
  try:
    return get_config(name)
  except JaxmemError:  # a name this machine cannot resolve now (a Hub id offline): the notes say so
    return None


def _recommended(result: Any) -> Any:
  if result.recommended is None:
    raise JaxmemError("the plan has no configuration that fits, so there is no launch to write; "
                      "raise the compile budget, lower the batch or the sequence, or use a larger target")
  return result.recommended


def _slices(target: str) -> int:
  """The slices of a multi-slice TPU target's name (``tpu:v5p-16x2slices``, as
  jaxmem.hardware.targets names it); 1 for any other."""
  import re

  m = re.search(r"x(\d+)slices$", target or "")
  return int(m.group(1)) if m else 1


def _unmapped(cfg: Any) -> list[t.NoMaxTextMapping]:
  """Every other choice the configuration made away from its default, as the table refuses or
  spells it (a row the launch does not write: refused, in ``--maxtext``'s words)."""
  out = []
  for f in dataclasses.fields(Configuration):
    if f.name in t.ROWS or f.name in t.SPELT_WITH or f.name in _DESCRIBED or f.default is dataclasses.MISSING:
      continue
    v = getattr(cfg, f.name, f.default)
    if v is not None and v != f.default:
      try:
        t.row(f.name).write(v, t.At())
      except t.NoMaxTextMapping as e:
        out.append(e)
  return out
