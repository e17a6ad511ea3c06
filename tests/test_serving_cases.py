"""The published-serving suite (benchmarks/serving.py, the table in docs/serving.md): every case
has its source, settings and published figure; a case the engines do not model says why; and its
smoke case runs through an engine here (the heavy ones are run by the benchmark)."""

from __future__ import annotations

import pytest

import benchmark_module


@pytest.fixture(scope="module")
def suite():
  return benchmark_module.load("serving")


def test_every_published_case_has_its_source_settings_and_figure(suite, capsys):
  published = [c for c in suite.CASES if c.heavy]
  assert len(published) >= 7
  engines = {c.run["engine"] for c in published if c.run}
  assert engines == {"vllm", "jetstream"}
  for c in published:
    assert c.source and c.settings and c.published
    assert (c.run is None) == (c.read is None) == (c.skip is not None), c.name  # not modelled: the reason instead
    assert c.run is None or c.why, c.name  # a figure that may differ says why it may
  assert suite.main(["--list"]) == 0
  assert len(capsys.readouterr().out.splitlines()) == len(suite.CASES)


@pytest.mark.needs_tpu_compiler
def test_the_smoke_case_runs_and_the_table_has_a_line_a_case(suite):
  o = suite.run_case(suite.BY_NAME["tiny-v5e-1"])
  assert o.value and "tokens" in o.figure and o.ratio is None
  skipped = suite.run_case(suite.BY_NAME["gpt-oss-tpu7x-headroom"])
  assert skipped.value is None and "not modelled" in skipped.figure
  table = suite.markdown([o, skipped]).splitlines()
  assert len(table) == 4 and all(line.count("|") == 8 for line in table)


@pytest.mark.slow
@pytest.mark.needs_tpu_compiler
def test_llama3_8b_on_v6e_4_is_within_5_percent_of_the_logged_tokens_with_the_logged_weights(suite):
  # Issue 42's done-when: tpu-inference PR #145 logged 811,008 tokens and 3.74 GiB of weights a
  # device (Llama 3 8B, tpu:v6e-4, TP 4, vLLM's defaults). A heavy compile: benchmarks/slow_tests.sh.
  import jaxmem

  (r,) = jaxmem.engine_capacity(**{k: v for k, v in suite.BY_NAME["llama3-8b-v6e-4-vllm"].run.items()})
  assert abs(r.kv_tokens / 811_008 - 1) < 0.05
  assert round(r.term("weights").bytes / 2**30, 2) == 3.74
  assert r.block_size == 256 and r.settings["gpu_memory_utilization"] == 0.9
