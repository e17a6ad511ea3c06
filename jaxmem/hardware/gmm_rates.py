"""The grouped matmul kernel's measured time by shape on a TPU part: tokamax's published
autotuning cache.

Why: a mixture-of-experts step on TPU runs its experts in megablox's grouped matmul (``gmm``,
``tgmm``), and the kernel does not reach the matrix peak its tiles are timed at
(:mod:`jaxmem.steptime.kernels`): tokamax's autotuner measured its own copy of the algorithm
(``pallas_mosaic_tpu`` ``ragged_dot``: the same row tiles over ragged groups, the same grid and
``("parallel", "arbitrary", "arbitrary")`` semantics) on each TPU kind it ships a cache for, at the
tiles it found fastest, under random routing. On TPU v5p (``tpu_v5``) the plain bf16 kernel ran
at 108 to 210 TFLOP/s of its 2·m·k·n over the 76 measurements, against the chip's 459: the
megacore chip's two TensorCores split only the grid's ``parallel`` axis (Pallas TPU guide,
"Multicore TPU configurations": "partitioning a kernel over a 2-core TPU device often leads to a
2x speedup, it can be in fact significantly smaller"). The rows
(:mod:`jaxmem.hardware.gmm_rates_data`) are extracted by ``benchmarks/extract_gmm_rates.py``; no
factor is fitted.

A call is given the measured shape of its kind (``gmm`` or ``tgmm``) on its part nearest to it in
(rows a group, k, n), distances in log2 (the measured shapes span 256 to 4096 rows a group, k and
n 256 to 14336), the fastest where two are as near; its time is its own 2·m·k·n at that shape's
achieved FLOP/s. The measured tiles are the autotuner's fastest, so a call at other tiles runs no
faster: the time is a lower bound of the kernel's. A part with no cache (v4, v6e, GPUs) has no
rates (``None``).
"""

from __future__ import annotations

import functools
import math

from jaxmem.hardware.gmm_rates_data import ROWS, SOURCE
from jaxmem.hardware.tpu import TPU_GENERATIONS

__all__ = ["SOURCE", "achieved_flops"]


@functools.cache
def _rows(device_kind: str, kind: str) -> tuple[tuple[float, float, float, float], ...]:
  """(log2 rows a group, log2 k, log2 n, FLOP/s) of each measured shape."""
  return tuple((math.log2(m / g), math.log2(k), math.log2(n), 2.0 * m * k * n / s)
               for d, c, g, m, k, n, s in ROWS if d == device_kind and c == kind)


def device_kind(part: str) -> str | None:
  """libtpu's device kind of a jaxmem TPU part name (``"TPU v5p"`` -> ``"TPU v5"``), else None."""
  return next((g.device_kind for g in TPU_GENERATIONS.values() if f"TPU {g.name}" == part), None)


def achieved_flops(part: str, kind: str, *, groups: int, rows: int, k: int, n: int) -> float | None:
  """The FLOP/s (of 2·rows·k·n) the grouped matmul ``kind`` (``"gmm"``, ``"tgmm"``) of ``rows``
  over ``groups`` experts reaches on ``part``: its nearest measured shape's (see the module
  docstring); ``None`` where the part has no measured shape of that kind."""
  dk = device_kind(part)
  measured = _rows(dk, kind) if dk is not None and groups > 0 and min(rows, k, n) > 0 else ()
  if not measured:
    return None
  point = (math.log2(rows / groups), math.log2(k), math.log2(n))
  return min(measured, key=lambda r: (math.dist(point, r[:3]), -r[3]))[3]
