"""The published-runs suite (benchmarks/published_runs.py): its cases are well formed, the ones
jaxmem cannot build yet say what they need, and its light case runs through the suite here."""

import importlib.util
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "published_runs.py"


@pytest.fixture(scope="module")
def suite():
  spec = importlib.util.spec_from_file_location("published_runs", PATH)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # dataclasses look their module up there
  spec.loader.exec_module(module)
  return module


def test_at_least_eight_published_cases_over_tpu_and_gpu_each_with_source_and_outcome(suite, capsys):
  published = [c for c in suite.CASES if c.heavy]
  assert len(published) >= 8 and {c.platform for c in published} == {"tpu", "gpu"}
  for c in suite.CASES:
    assert c.source and c.configuration and c.outcome in suite.FITS
    assert (c.args is None) <= (c.skipped() is not None), c.name  # no arguments: skipped, saying why
  assert suite.main(["--list"]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == len(suite.CASES) and all(line.startswith(c.name) for line, c in zip(lines, suite.CASES))


def test_a_maxtext_case_without_maxtext_is_skipped_in_one_line_saying_how_to_install_it(suite, monkeypatch):
  find_spec = suite.importlib.util.find_spec
  monkeypatch.setattr(suite.importlib.util, "find_spec", lambda name, *a: None if name == "maxtext" else find_spec(name, *a))
  maxtext_cases = [c for c in suite.CASES if c.needs_maxtext]
  assert maxtext_cases and all("--maxtext base.yml" in c.args for c in maxtext_cases)
  r = suite.run_case(suite.BY_NAME["maxtext-22b-v4-default"])
  assert r.status == "skipped" and r.line.startswith("skipped: needs MaxText") and "jaxmem[maxtext]" in r.line
  assert "\n" not in r.line


@pytest.mark.needs_tpu_compiler
def test_every_maxtext_case_plans_through_maxtexts_own_step(suite):
  """Each MaxText case's overrides are ones MaxText takes, on its target, before anything compiles."""
  pytest.importorskip("maxtext")
  from jaxmem.cli import _common, build_parser
  from jaxmem.resolve import plan

  for case in (c for c in suite.CASES if c.needs_maxtext):
    ns = build_parser().parse_args(["compare", *suite.shlex.split(case.args)])
    _common.start(ns.target)
    p = plan(_common.workload(ns))
    assert p.workload.model.startswith("maxtext:") and len(p.remats) == 1, case.name
    assert p.remats[0].name == suite.maxtext_overrides(case)["remat_policy"], case.name


@pytest.mark.needs_tpu_compiler
def test_the_light_case_runs_and_agrees(suite, capsys):
  assert suite.main(["--case", "tiny-v5e-1"]) == 0
  out = capsys.readouterr().out
  assert "tiny-v5e-1: agrees (compiled)" in out and "naive sum" in out and "compiler check accepted" in out
