"""``compare --with-inference``: a train step and a decode step for the same model, side by side."""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxmem.inference.run import run_infer_config
from jaxmem.inference.workload import plan_infer
from jaxmem.models import ModelConfig
from jaxmem.resolve import plan
from jaxmem.planning.sweep import run_config
from jaxmem.records import Placement
from jaxmem.workload import Workload


@dataclasses.dataclass(frozen=True, kw_only=True)
class Side(Placement):
  """One side of training-vs-inference: per-device figures and their sum over the devices."""

  workload: str  # "train" or "decode"
  detail: str  # optimizer and remat, or weights and context
  argument_size_in_bytes: int | None
  temp_size_in_bytes: int | None
  required_bytes: int | None
  all_devices_required_bytes: int | None
  capacity_bytes: int | None
  fits: bool | None
  verdict: str
  error: str | None = None


def _verdict(kind: str, fits: bool | None) -> str:
  if fits is None:
    return "no capacity on this target"
  if kind == "train":
    return "can be trained here" if fits else "cannot be trained here"
  return "fits for inference" if fits else "does not fit for inference"


def training_vs_inference(
    workload: Workload | None = None,
    /,
    *,
    weights: str = "bf16",
    context: int | None = None,
    infer_batch: int | None = None,
    train_row: Any = None,
    **fields: Any,
) -> list[Side]:
  """The train step of ``workload`` (``fields`` replaced; its last remat policy, ``full``
  unless named) and a decode step for the same model, target and mesh, side by side.
  ``context`` defaults to the workload's ``seq``, ``infer_batch`` to its ``batch``. Pass
  ``train_row`` (a :class:`jaxmem.planning.sweep.Row`) to reuse a compiled training row, with
  ``model=`` its :class:`ModelConfig` where the row's name is no preset (a config.json model)."""
  w = Workload.of(workload, {"remat": "full"}, **fields)
  if train_row is None:
    p = plan(w)
    (cfg_t,) = [c for c in p.configs() if c[2].name == w.remat[-1]] or [p.configs()[0]]
    train_row = run_config(p, *cfg_t)
  ip = plan_infer(
      model=w.model if isinstance(w.model, ModelConfig) else train_row.model,
      weights=weights,
      phase="decode",
      context=context or train_row.seq,
      batch=infer_batch or train_row.batch,
      target=w.target,
      slices=w.slices,
      resident=w.resident,
      mem_fraction=w.mem_fraction,
      mesh=train_row.mesh,
  )
  (cfg_i,) = ip.configs()
  irow = run_infer_config(ip, *cfg_i)
  n = train_row.num_devices
  return [
      _side("train", train_row, f"{train_row.optimizer}, remat {train_row.remat}, seq {train_row.seq}", n),
      _side("decode", irow, f"{irow.weights} weights, context {irow.context}", n),
  ]


def _side(kind: str, row: Any, detail: str, n: int) -> Side:
  """One side of training vs inference from its row (a train Row or an InferRow)."""
  total = lambda v: None if v is None else v * n  # noqa: E731
  return Side(
      workload=kind,
      model=row.model,
      target=row.target,
      mesh=row.mesh,
      detail=detail,
      batch=row.batch,
      num_devices=n,
      argument_size_in_bytes=row.argument_size_in_bytes,
      temp_size_in_bytes=row.temp_size_in_bytes,
      required_bytes=row.required_bytes,
      all_devices_required_bytes=total(row.required_bytes),
      capacity_bytes=row.capacity_bytes,
      fits=row.fits,
      verdict=_verdict(kind, row.fits),
      error=row.error,
  )

