"""The largest number of steps of a workload that fits, from as few compiles as the figures allow.

A reusable search with no compiler in it: a :class:`Boundary` proposes the next number of steps
``k`` to compile (``next_probe``) and is told what the compile said (``record`` with a
:class:`Probe`: the required bytes, whether they fit, and the bytes known not to grow with
``k``). ``fit`` drives one per configuration, in lockstep, so each round's compiles run in
parallel; ``plan`` and a per-tensor remat search can drive it the same way.

Why few compiles suffice: what a train step needs per device is close to affine in the batch.
The arguments (parameters, optimizer state) do not move with it, nor does the gradient (a
temporary the size of the parameters); the saved activations grow linearly with it. So
(strategy ``affine``):

1. the smallest step is compiled (if it does not fit, nothing does);
2. one compile gives a line: the bytes known to be fixed (``Probe.fixed``) and all the rest
   taken as growing with ``k``. Any fixed temporary beyond those makes the true line flatter,
   so the boundary it predicts is at or below the true one (a bound: the probe there fits, and
   is the answer when nothing else is fixed);
3. from two compiles on, the secant through the two points nearest the boundary (the bracket's
   ends where both were compiled) predicts the largest ``k`` that fits;
4. a probe at the prediction is confirmed by its own compile; once it fits, the next probe is
   its neighbour ``k + 1``, which must not. Only a compile closes the bracket: the answer is
   always a ``k`` that compiled and fit next to one that compiled and did not.

Where the compiler departs from the line near the capacity (the TPU compiler rematerializes on
its own to fit; layouts change), the prediction misses; after two misses in a row the search
bisects the bracket once, so a poor prediction costs at most every third probe. Strategy
``bisect`` is the plain search (doubling, then bisection; MaxText's ``estimator.py``), kept to
check the affine search against and to measure it by (benchmarks/fit_compiles.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxmem.errors import JaxmemError

STRATEGIES = ("affine", "bisect")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Probe:
  """What one compile at ``k`` steps said: ``required`` bytes per device (None where the
  compiler gave none), whether they fit, and ``fixed``: bytes of them known not to grow with
  the workload (None where unknown)."""

  required: int | None
  fits: bool
  fixed: int | None = None


@dataclasses.dataclass
class Boundary:
  """A bracket over steps ``1..cap``: ``lo`` the largest known to fit (0: none yet), ``hi`` the
  smallest known not to (None: none yet), narrowed by compiles until ``hi == lo + 1`` (or
  ``lo == cap``). ``capacity``: the bytes a probe must fit in, for the predictions."""

  cap: int
  capacity: int
  strategy: str = "affine"
  lo: int = 0
  hi: int | None = None
  compiles: int = 0
  points: dict[int, Probe] = dataclasses.field(default_factory=dict)
  predicted: int | None = None  # the boundary the latest predicting probe aimed at
  misses: int = 0  # predicting probes in a row whose compile contradicted the prediction
  _aimed: bool = False  # the pending probe came from a prediction

  def __post_init__(self) -> None:
    if self.strategy not in STRATEGIES:
      raise JaxmemError(f"unknown search strategy {self.strategy!r}; valid: {', '.join(STRATEGIES)}")

  def record(self, k: int, probe: Probe) -> None:
    """The compile at ``k`` said ``probe``."""
    self.compiles += 1
    self.points[k] = probe
    if self._aimed and self.predicted is not None:
      # A hit: the probe fit where the line said it would (k <= predicted), or did not where it
      # said it would not. A miss moves the search toward bisection.
      hit = probe.fits == (k <= self.predicted)
      self.misses = 0 if hit else self.misses + 1
    if probe.fits:
      self.lo = max(self.lo, k)
    else:
      self.hi = k if self.hi is None else min(self.hi, k)

  def next_probe(self) -> int | None:
    """The next number of steps to compile, or None when the bracket is closed."""
    self._aimed = False
    if not self.points:
      return 1
    if self.hi is not None and self.hi <= self.lo + 1:
      return None
    if self.lo >= self.cap or (self.lo == 0 and self.hi == 1):
      return None
    upper = self.cap if self.hi is None else self.hi - 1
    floor = self.lo + 1
    guess = None if self.strategy == "bisect" or self.misses >= 2 else self.prediction()
    if guess is None:
      self.misses = 0  # one bisection step, then the line is tried again
      guess = 2 * max(self.lo, 1) if self.hi is None else (self.lo + self.hi) // 2
      return min(max(guess, floor), upper)
    self.predicted, self._aimed = guess, True
    # The prediction itself while it is untested; once it fits (lo == guess), its neighbour.
    return min(max(guess, floor), upper)

  def prediction(self) -> int | None:
    """The largest ``k`` the line through the compiles so far puts within the capacity."""
    line = self._line()
    if line is None:
      return None
    (k1, r1), slope = line
    if slope <= 0:
      return None
    return k1 + int((self.capacity - r1) // slope)

  def _line(self) -> tuple[tuple[int, int], float] | None:
    measured = {k: p.required for k, p in self.points.items() if p.required is not None}
    if len(measured) >= 2:
      pair = self._nearest_pair(measured)
      (k1, r1), (k2, r2) = pair
      return (k1, r1), (r2 - r1) / (k2 - k1)
    if len(measured) == 1:
      ((k, r),) = measured.items()
      fixed = self.points[k].fixed
      if fixed is None or r <= fixed:
        return None
      return (k, r), (r - fixed) / k  # everything beyond the fixed bytes taken to grow with k
    return None

  def _nearest_pair(self, measured: dict[int, int]) -> tuple[tuple[int, int], tuple[int, int]]:
    """The two compiled points nearest the boundary: the bracket's ends where both were
    measured, else the two on the side the boundary is known from."""
    if self.lo in measured and self.hi in measured:
      return (self.lo, measured[self.lo]), (self.hi, measured[self.hi])
    ks = sorted(measured)
    below = [k for k in ks if k <= self.lo]
    above = [k for k in ks if self.hi is not None and k >= self.hi]
    if len(below) >= 2 and self.hi not in measured:
      near = below[-2:]
    elif below and above:
      near = [below[-1], above[0]]
    else:
      near = ks[-2:] if not above else above[:2]
    return (near[0], measured[near[0]]), (near[1], measured[near[1]])


def fixed_bytes(row: Any) -> int | None:
  """Bytes of a compiled row's requirement that do not grow with the batch: its arguments and
  one gradient of the parameters (a temporary the parameters' size); None where the compile
  gave no argument size (a refused one)."""
  if getattr(row, "argument_size_in_bytes", None) is None:
    return None
  return row.argument_size_in_bytes + (getattr(row, "param_bytes", None) or 0)


def row_probe(row: Any) -> Probe:
  """A compiled (or refused) row as a probe: its required bytes, verdict and fixed bytes."""
  return Probe(required=row.required_bytes, fits=bool(row.fits), fixed=fixed_bytes(row))
