"""A GPU GEMM's achieved FLOP/s by shape: XLA's own measured table, interpolated as XLA does.

Why: the datasheet peak (989 TFLOP/s dense bf16 on an H100) is what no GEMM reaches; timing every
matmul at it put the simulated step of a compute-bound program well under the measured one.
XLA's GPU cost model ships measured throughput by shape, ``kDefaultMatmulPTable`` in
``xla/backends/gpu/cost_model/matmul_interpolator_data.h`` (openxla/xla; read at
tensorflow/tensorflow ``third_party/xla/xla/backends/gpu/cost_model/``, commit
a305421c45a1ea5117c170b8d8a00a51f9dcee8f; older trees: ``xla/service/gpu/model/``): per part, a
grid of GEMMs ``b`` (batch) x ``m`` x ``k`` by ``k`` x ``n`` with b in {1, 2, 4} and m, n, k in
{256, ..., 4096}, each with its achieved FLOP/s per dtype combination. The values here
(:mod:`jaxmem.hardware.matmul_rates_data`) are the table compiled into the installed jax CUDA
plugin, extracted by ``benchmarks/extract_matmul_rates.py``; no factor is fitted.

Parts: XLA's profile name of a part (``HloOpProfiles::GetProfileName``: ``sm_`` and the compute
capability, and for sm_100 the last word of the device's name, so ``sm_100_B200``) picks its
grid. The table has ``sm_90`` (measured on an H100; the H200 has the same GH100 die and clocks,
so it takes the same grid) and ``sm_100_B200``; it has no ``sm_80``, so A100 and A800 have no
rates (``None``) and keep the datasheet peak. TPU has no published per-shape table: TPU matmuls
stay at the peak, rounded up to the MXU's tile (:mod:`jaxmem.steptime`).

Interpolation (XLA's ``MatmulInterpolator::Create`` with ``EuclideanWeightedAverageInterpolator``,
``xla/backends/gpu/cost_model/interpolator.h`` at the same commit): a GEMM's point (b, m, k, n)
has, in each dimension, the power of two at or below it and the one at or above it, each clamped
to the grid's range ([1, 4] for b, [256, 4096] for m, n, k); the 16 corners' rates are averaged
with weights ``1 / (squared Euclidean distance from the point + 1)``, distances in elements. On a
grid point that is the entry itself; beyond the grid the edge's entries stand (a GEMM larger than
4096 in a dimension runs at the 4096 entries' rate). A dtype combination the part's grid lacks
(XLA falls back to the bf16 grid at byte-scaled shapes) gets ``None`` here: its peak stands.
"""

from __future__ import annotations

import functools
import itertools

from jaxmem.hardware.gpu import GPU_SPECS, GpuSpec
from jaxmem.hardware.matmul_rates_data import AXES, RATES, SOURCE

__all__ = ["SOURCE", "achieved_flops", "profile_name", "rate_function"]

_DIMS = tuple(AXES)  # ("b", "m", "n", "k"): the order of the grid's values


def profile_name(spec: GpuSpec) -> str:
  """XLA's profile name of a part (``HloOpProfiles::GetProfileName``): ``sm_90``; on sm_100, the
  device name's last word appended (``sm_100_B200``), since B200 and GB200 differ."""
  major, minor = spec.compute_capability
  name = f"sm_{major}{minor}"
  return f"{name}_{spec.description.split()[-1]}" if name == "sm_100" else name


@functools.cache
def _grid(key: str, dtype: str) -> dict[tuple[int, ...], float] | None:
  values = RATES.get(key, {}).get(dtype)
  if values is None:
    return None
  return dict(zip(itertools.product(*AXES.values()), map(float, values), strict=True))


def _neighbours(x: int, axis: tuple[int, ...]) -> tuple[int, int]:
  """The powers of two at or below and at or above ``x``, clamped to the grid's range (XLA's
  ``SmallerNeighbour`` / ``LargerNeighbour`` with ``PrevPowerOfTwo`` / ``NextPowerOfTwo``)."""
  x = max(1, x)
  above = 1 << (x - 1).bit_length()
  below = above if above == x else above >> 1
  lo, hi = axis[0], axis[-1]
  return min(max(below, lo), hi), min(max(above, lo), hi)


def achieved_flops(part: str | GpuSpec, b: int, m: int, n: int, k: int, dtype: str = "bf16xbf16->bf16") -> float | None:
  """The achieved FLOP/s of a GEMM of ``b`` x (``m`` x ``k`` by ``k`` x ``n``) in ``dtype``
  (XLA's key: ``lhs x rhs -> out`` element types, ``"bf16xbf16->bf16"``) on ``part`` (a jaxmem GPU
  name such as ``"h100"``, or its spec), interpolated as XLA does (see the module docstring);
  ``None`` where XLA's table has no grid for the part or the dtype."""
  spec = part if isinstance(part, GpuSpec) else GPU_SPECS.get(part)
  grid = None if spec is None else _grid(profile_name(spec), dtype)
  if grid is None:
    return None
  point = dict(b=b, m=m, n=n, k=k)
  sides = [_neighbours(point[d], AXES[d]) for d in _DIMS]
  total = weight_sum = 0.0
  for corner in itertools.product(*sides):  # 16 corners, repeated ones counted as XLA counts them
    w = 1.0 / (sum((c - point[d]) ** 2 for c, d in zip(corner, _DIMS)) + 1.0)
    total += grid[corner] * w
    weight_sum += w
  return total / weight_sum


def rate_function(spec: GpuSpec):
  """``achieved_flops`` bound to ``spec``, or ``None`` where the table has no grid for it: what
  the schedule walk (:class:`jaxmem.hardware.machine.Machine`'s ``matmul_rate``) times GEMMs by."""
  if _grid(profile_name(spec), "bf16xbf16->bf16") is None:
    return None
  return functools.partial(achieved_flops, spec)
