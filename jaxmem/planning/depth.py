"""A scanned stack's memory, predicted at its full depth from two compiles at small depths.

The layers are one ``jax.lax.scan`` over stacked weights (models/transformer.py), so every
layer adds the same bytes: its parameters, their gradient and optimizer state, and the
activations the remat policy saves for it. What the step needs per device is then affine in the
depth, ``r(L) = r(a) + (L - a) * (r(b) - r(a)) / (b - a)``, and two compiles at depths ``a < b``
predict it at any depth. The probes use 2 and 4 layers, not 1: XLA removes a loop of one trip,
and the step it compiles then is not the scanned one. For a mixture-of-experts model only the
expert stack's depth varies (its ``first_dense_layers`` stay), so each stack keeps its own
scan. tests/test_depth.py holds the prediction within 2% of the full-depth compile on three
models on the host CPU's compiler and within 5% on the TPU compiler, whose choices at a small
depth differ more (the fit search compiles its answer at full depth for that reason).
"""

from __future__ import annotations

import dataclasses

from jaxmem.compiler.report import fits
from jaxmem.models import ModelConfig
from jaxmem.planning.boundary import Probe, fixed_bytes
from jaxmem.resolve import Plan, Task
from jaxmem.planning.sweep import Row

PROBE_LAYERS = (2, 4)  # layers of the varied stack at the two probes


def probe_depths(cfg: ModelConfig | None) -> tuple[int, int] | None:
  """The two ``num_layers`` to compile for ``cfg``, or None where probing saves nothing (a
  stack no deeper than the probes, or a user's step, whose depth jaxmem cannot change)."""
  if cfg is None:
    return None
  base = cfg.first_dense_layers if cfg.is_moe else 0
  if cfg.num_layers - base <= PROBE_LAYERS[-1]:
    return None
  a, b = PROBE_LAYERS
  return base + a, base + b


def at_depth(cfg: ModelConfig, layers: int) -> ModelConfig:
  return dataclasses.replace(cfg, num_layers=layers)


def depth_plan(p: Plan, layers: int) -> Plan:
  """``p`` with its model at ``layers`` layers."""
  variants = tuple(depth_plan(v, layers) for v in p.variants)  # a sweep over the outer axes: each
  return dataclasses.replace(p, cfg=at_depth(p.cfg, layers), variants=variants)


def depth_task(task: Task, layers: int) -> Task:
  return task.replace(model=at_depth(task.workload.model, layers))


def extrapolate(a: int, ra: float, b: int, rb: float, depth: int) -> int:
  """The line through ``(a, ra)`` and ``(b, rb)`` at ``depth``."""
  return round(ra + (depth - a) * (rb - ra) / (b - a))


def predict(rows: tuple[Row, Row], depths: tuple[int, int], full: int, capacity: int) -> Probe:
  """The full-depth probe the two small-depth rows predict. A small depth that does not fit
  means the full depth does not either (memory grows with depth); ``fixed`` (the arguments and
  a gradient of the parameters, see :mod:`jaxmem.planning.boundary`) is extrapolated alike."""
  (ra, rb), (a, b) = rows, depths
  if ra.required_bytes is None or rb.required_bytes is None or ra.fits is False or rb.fits is False:
    return Probe(required=None, fits=False)
  required = extrapolate(a, ra.required_bytes, b, rb.required_bytes, full)
  fa, fb = fixed_bytes(ra), fixed_bytes(rb)
  fixed = None if fa is None or fb is None else extrapolate(a, fa, b, fb, full)
  return Probe(required=required, fits=bool(fits(required, capacity)), fixed=fixed)
