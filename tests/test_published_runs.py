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


def test_a_case_jaxmem_cannot_build_is_skipped_with_what_it_needs(suite):
  case = suite.BY_NAME["maxtext-22b-v4-default"]
  r = suite.run_case(case)
  assert r.status == "skipped" and r.line.startswith("skipped: needs ")


@pytest.mark.needs_tpu_compiler
def test_the_light_case_runs_and_agrees(suite, capsys):
  assert suite.main(["--case", "tiny-v5e-1"]) == 0
  out = capsys.readouterr().out
  assert "tiny-v5e-1: agrees (compiled)" in out and "naive sum" in out and "compiler check accepted" in out
