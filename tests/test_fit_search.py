"""fit's search over compiles: the affine search against plain bisection, compiles counted, the
answer and its neighbour compiled, and the depth probe's phases (tests/test_boundary.py holds the
search on curves, without a compiler)."""

import dataclasses
from types import SimpleNamespace

import pytest

from jaxmem.events import Compiling, listen
from jaxmem.models import get_config
from jaxmem.planning import fit, sweep
from jaxmem.planning.boundary import Boundary
from jaxmem.cache import RowCache
from jaxmem.resolve import plan

def _plan(cfg=None, **fields):
  # The host CPU's compiler (the fastest here), with a capacity set to three times what batch 1
  # needs, so the largest batch is some steps above the smallest; `full` alone is searched.
  p = plan(model=cfg or "tiny", remat="full", optimizer="adamw", batch=1, seq=32, target="cpu", **fields)
  p = dataclasses.replace(p, remats=p.remats[1:])
  mesh, opt, rp = p.configs()[0]
  first = sweep.run_config(p, mesh, opt, rp)
  target = dataclasses.replace(p.target, capacity_bytes=3 * first.required_bytes, capacity_note="a test's")
  return dataclasses.replace(p, target=target)


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
  """The affine search of the plan with the rows it compiled, its row cache and plan (a tiny
  model on the host CPU: a few compiles of about a second each on a quiet machine)."""
  p = _plan()
  cache = RowCache(tmp_path_factory.mktemp("rows"))
  rows, events = [], []
  with listen(events.append):
    (found,) = fit.search(p, cache=cache, on_row=rows.append)
  # A depth probe asked of a 2-layer model is not used (every probe is read from the cache).
  (unused,) = fit.search(p, cache=cache, depth_probe=True)
  compiling = [e for e in events if isinstance(e, Compiling)]
  return SimpleNamespace(plan=p, cache=cache, affine=found, rows=rows, unused=unused, compiling=compiling)


# Bisection compiles about twice as many batches (those the affine search made are read from its
# cache): slow. tests/test_boundary.py holds the same comparison on curves, without a compiler.
@pytest.mark.slow
def test_the_affine_search_finds_bisections_answer_in_fewer_compiles(searched):
  (bisect,) = fit.search(searched.plan, strategy="bisect", cache=searched.cache)
  assert searched.affine.max_batch == bisect.max_batch and bisect.max_batch >= 3
  assert searched.affine.compiles < bisect.compiles


def test_compiles_are_counted_and_the_answer_was_confirmed_by_compiles(searched):
  found, rows = searched.affine, searched.rows
  assert found.compiles == len(rows) == len({r.batch for r in rows})  # each batch compiled once
  by_batch = {r.batch: r for r in rows}
  # The answer is a compiled row that fits, and the next batch compiled and did not.
  assert found.max_batch >= 3 and found.row.batch == found.max_batch and found.row.fits is True
  assert by_batch[found.max_batch].fits is True and by_batch[found.max_batch + 1].fits is False
  assert found.as_dict()["compiles"] == found.compiles and found.predicted_from_depths is None


def test_each_compile_of_a_search_is_counted_within_the_search(searched):
  # The search compiles a few rows per round: each compile says its place in the whole search,
  # and no total (it is known only at the end), not "1 of 1" each round.
  assert [(e.index, e.total) for e in searched.compiling] == [(i, None) for i in range(1, len(searched.rows) + 1)]


def test_answers_that_differ_only_in_their_vocab_tiling_say_so(monkeypatch):
  # Two tilings are two configurations: each answer records its own, and the table shows it (the
  # rows were otherwise identical in every identifying column). The compiler is stood in for by
  # a line: each batch needs 100 bytes of the 1000 the target has.
  from jaxmem.render import tables

  def run_rows(p, tasks, **kwargs):
    return [sweep.Row(model="tiny", target="cpu", mesh=t.workload.mesh[0], batch=t.workload.batch, seq=t.workload.seq,
                      num_devices=1, remat=t.remat, optimizer=t.optimizer, param_dtype="float32", dtype="bfloat16",
                      vocab_tiles=t.vocab_tiles, required_bytes=100 * t.workload.batch, fits=t.workload.batch <= 10)
            for t in tasks]

  monkeypatch.setattr(fit, "run_rows", run_rows)
  p = plan(model="tiny", remat="full", batch=1, seq=32, target="cpu", vocab_tiles="1,2")
  p = dataclasses.replace(p, remats=p.remats[1:], target=dataclasses.replace(p.target, capacity_bytes=1000))
  results = fit.search(p)
  assert [r.max_batch for r in results] == [10, 10]
  assert [r.vocab_tiles for r in results] == [1, 2]
  assert [r.as_dict()["vocab_tiles"] for r in results] == [1, 2]
  header, _, *lines = tables.render_fit(results, "table").split("\n\n")[1].splitlines()
  assert "vocab tiles" in header
  assert len(set(lines)) == 2


def test_a_depth_probe_that_cannot_help_is_not_used_and_says_so(searched):
  unused, affine = searched.unused, searched.affine
  assert unused.max_batch == affine.max_batch and unused.compiles == affine.compiles
  assert unused.predicted_from_depths is None and "depth probe not used" in unused.note


def _row(required, capacity, fixed=0):
  return SimpleNamespace(required_bytes=required, fits=required <= capacity, argument_size_in_bytes=fixed, param_bytes=0)


def _drive(s, layers_line, full_line, capacity):
  """Runs a depth-probe search on lines standing in for the compiler: required bytes at
  (num_layers, k) from ``layers_line``, and at full depth from ``full_line``."""
  asked = []
  while (k := s.next_probe()) is not None:
    layers = s.layers()
    asked.append((k, layers))
    rows = [_row(full_line(k) if d is None else layers_line(d, k), capacity) for d in layers]
    s.record(k, rows)
  return asked


def test_the_depth_probe_compiles_only_the_answer_and_its_neighbour_at_full_depth():
  line = lambda d, k: 100 + 10 * d + 7 * d * k  # noqa: E731 (affine in depth at every batch)
  s = fit._Search(task=None, step=1, bound=Boundary(cap=1 << 16, capacity=1000), depths=(2, 4), full_depth=8)
  asked = _drive(s, line, lambda k: line(8, k), 1000)
  full = [k for k, layers in asked if layers == (None,)]
  assert s.confirmed is True and s.phase == "done" and full == [s.bound.lo, s.bound.hi] == [14, 15]
  assert s.compiles == sum(len(layers) for _, layers in asked) and s.depth_error_pct == 0


def test_a_depth_prediction_the_full_depth_contradicts_is_searched_at_full_depth():
  line = lambda d, k: 100 + 10 * d + 7 * d * k  # noqa: E731
  real = lambda k: line(8, k) + 60  # noqa: E731 (the full depth needs more than predicted)
  s = fit._Search(task=None, step=1, bound=Boundary(cap=1 << 16, capacity=1000), depths=(2, 4), full_depth=8)
  asked = _drive(s, line, real, 1000)
  assert s.confirmed is False and s.phase == "full"
  assert s.bound.lo == 13 and s.bound.hi == 14  # the true boundary, from full-depth compiles
  assert s.depth_error_pct < 0


def test_a_pessimistic_depth_prediction_is_searched_upward_at_full_depth():
  # Near the capacity the TPU compiler squeezes a deep stack below the line (llama3-1b needs 11%
  # less at 16 layers than 2 and 4 predict): the neighbour's compile finds the larger answer.
  line = lambda d, k: 100 + 10 * d + 7 * d * k  # noqa: E731
  real = lambda k: line(8, k) - 120  # noqa: E731
  s = fit._Search(task=None, step=1, bound=Boundary(cap=1 << 16, capacity=1000), depths=(2, 4), full_depth=8)
  _drive(s, line, real, 1000)
  assert s.confirmed is False and s.phase == "full" and s.depth_error_pct > 0
  assert (s.bound.lo, s.bound.hi) == (16, 17) and s.best.required_bytes <= 1000


@pytest.mark.slow
def test_fit_with_a_depth_probe_agrees_with_the_full_search():
  # About 14 compiles of a 6-layer tiny model: the phases above, through fit.search and the compiler.
  p = _plan(get_config("tiny", num_layers=6))
  (probed,) = fit.search(p, depth_probe=True)
  (plain,) = fit.search(p)
  assert probed.predicted_from_depths == (2, 4) and probed.confirmed_full_depth is True
  assert probed.max_batch == plain.max_batch and probed.row.param_bytes == plain.row.param_bytes
  assert abs(probed.depth_prediction_error_pct) < 2


def test_the_cli_sums_compiles_per_configuration():
  from jaxmem.cli.fit import compiles_line

  results = [SimpleNamespace(compiles=n) for n in (2, 4, 3)]
  assert compiles_line(results) == "jaxmem: 9 compiles for 3 configurations (3.0 each)"
