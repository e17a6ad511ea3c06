"""What a scanned loop stacks for the backward pass, per iteration, from optimized HLO text.

A ``lax.scan`` whose VJP keeps values across its iterations lowers to a forward ``while`` whose
loop tuple carries those values stacked on a leading dimension of the trip count (the backward
loop reads them back). :func:`per_iteration_bytes` finds the loops that run ``iterations``
times and returns the largest sum, over one loop's tuple, of the elements whose leading
dimension is ``iterations``, divided by ``iterations``: the bytes one device keeps per
iteration. For the pipeline's iteration scan (:mod:`jaxmem.models.pipeline`) that is one stage
input and what the remat policy saves inside the stage, for one microbatch: the compiled
per-microbatch stage activation. A loop of another scan with the same trip count (rare: the
layers per stage, say) could be counted instead; the caller's note says what was read.
"""

from __future__ import annotations

import re

from jaxmem.hlo.comms import _leaf_bytes, _tuple_elements
from jaxmem.hlo.text import parse_module


def _leading_dim(shape: str) -> int | None:
  m = re.match(r"\s*[a-z][a-z0-9]*\[(\d+)", shape)
  return int(m.group(1)) if m else None


def per_iteration_bytes(hlo_text: str, iterations: int) -> int | None:
  """Bytes per iteration that a ``while`` of ``iterations`` trips stacks (see the module
  docstring); None when no such loop stacks anything."""
  module = parse_module(hlo_text)
  best = 0
  for ins in module.instructions.values():
    if ins.opcode != "while" or module.trip_count(ins.name, ins.computation) != iterations:
      continue
    stacked = sum(_leaf_bytes(e) for e in _tuple_elements(ins.shape) if _leading_dim(e) == iterations)
    best = max(best, stacked)
  return best // iterations if best else None
