"""The boundary search on its own (no compiler): curves stand in for the compiler's figures."""

import pytest

from jaxmem.errors import JaxmemError
from jaxmem.planning.boundary import Boundary, Probe

CAP = 1000


def _run(curve, *, fixed=0, strategy="affine", cap=1 << 16, capacity=CAP):
  """Searches ``curve`` (required bytes at k steps); returns the boundary and the probes in order."""
  b = Boundary(cap=cap, capacity=capacity, strategy=strategy)
  seen = []
  while (k := b.next_probe()) is not None:
    assert k not in seen, f"probed {k} twice: {seen}"
    seen.append(k)
    r = curve(k)
    b.record(k, Probe(required=r, fits=r <= capacity, fixed=fixed))
  return b, seen


def _truth(curve, capacity=CAP):
  k = 0
  while curve(k + 1) <= capacity:
    k += 1
  return k


# Affine curves (a fixed part, a slope), one convex (tiling pads the smallest batches alike, as
# the TPU compiler does: llama3-1b's step needs 7.18 GiB at batch 4 and 8.01 at 8, then 1.3 GiB
# more per 4), one that is flat for its first steps.
CURVES = [
    lambda k: 300 + 7 * k,
    lambda k: 50 + 190 * k,
    lambda k: 600 + 45 * k,
    lambda k: 718 if k == 1 else 801 + 132 * (k - 2),
    lambda k: 400 + 3 * max(0, k - 8) ** 2,
    lambda k: 999 + k,
]


@pytest.mark.parametrize("curve", CURVES)
@pytest.mark.parametrize("strategy", ["affine", "bisect"])
def test_the_answer_is_the_true_boundary_and_both_sides_were_compiled(curve, strategy):
  b, seen = _run(curve, fixed=250, strategy=strategy)
  truth = _truth(curve)
  assert b.lo == truth
  # The answer compiled and fit; its neighbour compiled and did not (no extrapolated verdicts).
  assert truth in seen and b.points[truth].fits
  assert truth + 1 in seen and not b.points[truth + 1].fits
  assert b.compiles == len(seen) == len(b.points)


def test_the_affine_search_needs_at_most_four_compiles_on_a_line():
  # On an exact line: the smallest, the bound from its fixed bytes, the secant's answer, its
  # neighbour; three where the bound is the answer (everything beyond the fixed bytes grows).
  for fixed_part, slope in [(300, 7), (50, 190), (600, 45), (250, 60), (100, 33)]:
    b, seen = _run(lambda k: fixed_part + slope * k, fixed=250)
    assert len(seen) <= 4, (fixed_part, slope, seen)
  b, seen = _run(lambda k: 250 + 60 * k, fixed=250)
  assert len(seen) == 3 and b.lo == 12


def test_the_affine_search_beats_bisection_on_every_curve():
  affine = sum(len(_run(c, fixed=250)[1]) for c in CURVES)
  bisect = sum(len(_run(c, fixed=250, strategy="bisect")[1]) for c in CURVES)
  assert affine < bisect, (affine, bisect)


def test_a_curve_the_line_mispredicts_still_ends_bisected():
  # A step in the curve the line cannot see: the predictions miss, bisection closes the bracket.
  curve = lambda k: 100 + k if k < 300 else 5000  # noqa: E731
  b, seen = _run(curve, fixed=0)
  assert b.lo == 299 and len(seen) < 30


def test_the_smallest_not_fitting_costs_one_compile():
  b, seen = _run(lambda k: 2000 + k)
  assert (b.lo, b.hi, seen) == (0, 1, [1])


def test_the_ceiling_stops_the_search():
  b, seen = _run(lambda k: 10 + k, cap=50)
  assert b.lo == 50 and b.hi is None and 50 in seen


def test_a_probe_without_figures_bisects():
  # Refusals with no required bytes (an unsupported feature, say): the search still ends.
  b = Boundary(cap=1 << 16, capacity=CAP)
  while (k := b.next_probe()) is not None:
    b.record(k, Probe(required=None, fits=k <= 37))
  assert b.lo == 37 and b.hi == 38


def test_an_unknown_strategy_is_one_line():
  with pytest.raises(JaxmemError, match="unknown search strategy 'newton'; valid: affine, bisect"):
    Boundary(cap=4, capacity=CAP, strategy="newton")
