"""The pipeline options of a train step, checked against a mesh and a model, and a row's fields.

``pipeline_microbatches`` (MaxText's ``num_pipeline_microbatches``) is how many pieces the
(accumulation) microbatch is cut into for the pipeline; it is not ``microbatches``, which stays
gradient accumulation, and the two compose (the batch is split by both). ``pipeline_repeats``
is MaxText's ``num_pipeline_repeats`` (the circular schedule). Both apply to meshes with a
``stage`` axis; a sweep may mix meshes with and without one, and a mesh without one runs the
layers unpipelined. The schedule itself is :mod:`jaxmem.models.pipeline`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from jaxmem.errors import JaxmemError, StagesRefused
from jaxmem.models.pipeline import bubble_fraction, in_flight_1f1b

STAGE = "stage"


@dataclasses.dataclass(frozen=True, kw_only=True)
class PipelineOptions:
  """``microbatches`` ``None``: as many as the mesh has stages (the least a schedule can take)."""

  microbatches: int | None = None
  repeats: int = 1

  @classmethod
  def of(cls, options: Mapping[str, Any]) -> PipelineOptions:
    """The options one configuration gives (``None`` where not given, or where the mesh has no
    stage axis)."""
    repeats = options.get("pipeline_repeats")
    return cls(microbatches=options.get("pipeline_microbatches"), repeats=1 if repeats is None else repeats)

  @property
  def given(self) -> bool:
    return self.microbatches is not None or self.repeats != 1

  def check(self) -> None:
    for name, v in (("pipeline_microbatches", self.microbatches), ("pipeline_repeats", self.repeats)):
      if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
        raise JaxmemError(f"`{name}` must be a whole number of at least 1 (got {v!r})")

  def schedule(self, mesh: Any) -> tuple[int, int, int] | None:
    """(stages, microbatches, repeats) on ``mesh`` (axis sizes), or None without a stage axis."""
    stages = dict(mesh).get(STAGE, 1)
    if stages < 2:
      return None
    return stages, self.microbatches or stages, self.repeats

  def ways(self, mesh: Any) -> int:
    """How many pipeline microbatches each (accumulation) microbatch is cut into on ``mesh``:
    a factor of the batch step (1 without a stage axis)."""
    sched = self.schedule(mesh)
    return 1 if sched is None else sched[1]

  def check_mesh(self, mesh: Any, cfg: Any, *, mesh_name: str, moe_impl: str = "dropless") -> int:
    """Checks the schedule on ``mesh`` against the model's layers and how its experts run
    (``moe_impl``, the step's: :class:`jaxmem.models.StepChoices`); returns how many pipeline
    microbatches each (accumulation) microbatch is cut into (1 without a stage axis)."""
    self.check()
    sched = self.schedule(mesh)
    if sched is None:
      return 1
    stages, m, r = sched
    for what, layers in (("dense", cfg.num_dense_layers), ("mixture-of-experts", cfg.num_moe_layers)):
      if layers and layers % (stages * r):
        by = f"stage={stages}" + (f" x `pipeline_repeats` {r}" if r > 1 else "")
        kind = f"{what} layers" if cfg.num_dense_layers and cfg.num_moe_layers else "layers"
        raise StagesRefused(
            f"mesh {mesh_name}: {by} does not divide {cfg.name}'s {layers} {kind}; use a stage count"
            + (" times repeats" if r > 1 else "") + f" that divides {layers}"
        )
    if cfg.is_moe and moe_impl == "dropless":
      # Its experts' shard_map, batched over the stages by the pipeline's vmap, fails to trace
      # in jax 0.12 (a pvary over an axis the values already vary over); capacity is GSPMD's.
      raise StagesRefused(
          f"mesh {mesh_name}: `moe_impl` dropless is not pipelined over a stage axis yet; use `moe_impl` capacity"
      )
    if m < stages:
      raise StagesRefused(
          f"`pipeline_microbatches` {m} is fewer than the {stages} stages of mesh {mesh_name}; use at least {stages}"
      )
    return m

  def fields(self, mesh: Any) -> dict[str, Any]:
    """A row's pipeline fields on ``mesh``: ``stages`` (1 without a stage axis),
    ``pipeline_microbatches``, ``pipeline_repeats`` and ``bubble_fraction`` (None without)."""
    sched = self.schedule(mesh)
    if sched is None:
      return dict(stages=1, pipeline_microbatches=None, pipeline_repeats=None, bubble_fraction=None)
    s, m, r = sched
    return dict(stages=s, pipeline_microbatches=m, pipeline_repeats=r, bubble_fraction=bubble_fraction(s, m, r))


ONE_F_ONE_B_NOTE = (
    "required_1f1b_bytes: an estimate, not a compiled figure: 1F1B cannot be written as one SPMD program "
    "(MaxText #752), so it is the compiled GPipe requirement less the stage activations 1F1B would not keep "
    "(at most S microbatches in flight on the first stage, Megatron's accounting, Narayanan et al. 2021), each "
    "the compiled per-iteration stage activation (stage_activation_bytes)"
)


def one_f_one_b(required: int | None, stage_activation: int | None, stages: int, m: int, r: int) -> int | None:
  """The 1F1B estimate: ``required`` less ``(M·R + S - 1 - in_flight) × stage_activation``."""
  if required is None or stage_activation is None:
    return None
  return required - (m * r + stages - 1 - in_flight_1f1b(stages, m, r)) * stage_activation
