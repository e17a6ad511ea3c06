"""The published-runs suite (benchmarks/published_runs.py): its cases are well formed, the ones
jaxmem cannot build yet say what they need, and its light case runs through the suite here."""


import pytest

import benchmark_module


@pytest.fixture(scope="module")
def suite():
  return benchmark_module.load("published_runs")


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

  for case in (c for c in suite.CASES if c.needs_maxtext and not c.needs):  # c.needs: what jaxmem lacks, said
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


def test_every_case_names_the_releases_it_is_judged_on(suite, capsys):
  from jaxmem import compilers

  for c in suite.CASES:
    assert compilers.parse(c.judged_on) == c.judged_on, c.name  # each a release --compiler takes
    assert c.judged_on or c.judged_note, c.name
  assert suite.main(["--list"]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert all("; judged on: " in line for line in lines)
  assert any("judged on: libtpu==0.0.50.1, libtpu==0.0.52" in line for line in lines)


def test_the_llama2_70b_v5p_128_cases_are_as_published(suite):
  ran, oom = (suite.BY_NAME[f"maxtext-llama2-70b-v5p-128-batch{b}"] for b in (2, 4))
  assert (ran.outcome, oom.outcome) == (suite.RAN, suite.OOM)
  a, b = suite.maxtext_overrides(ran), suite.maxtext_overrides(oom)
  assert (a.pop("per_device_batch_size"), b.pop("per_device_batch_size")) == ("2", "4") and a == b
  assert a["remat_policy"] == "save_dot_except_mlpwi" and a["max_target_length"] == "4096"
  assert ran.judged_on == oom.judged_on == suite.LIBTPU_NOW


@pytest.fixture
def releases_mocked(monkeypatch, tmp_path):
  """The fetcher writes a fake wheel (no download) and each release's worker compiles in this
  process with the installed libtpu (no foreign compile), its row then named as the release's
  and marked refused, as an older or newer compiler might answer."""
  from test_compilers import _fake_fetch

  from jaxmem import compilers
  from jaxmem.planning import runner, sweep

  monkeypatch.setenv("JAXMEM_CACHE_DIR", str(tmp_path))
  compilers.forget()
  monkeypatch.setattr(compilers, "FETCH", _fake_fetch([]))
  sent = []

  def pool(tasks, run, todo, jobs, done, environment=None):
    for i in todo:
      sent.append(dict(environment.variables)["TPU_LIBRARY_PATH"])
      row = sweep.run_task(tasks[i])
      if tasks[i].compiler == "libtpu==0.0.52":
        row = {**row, "fits": False, "versions": {**row["versions"], "libtpu": "0.0.52"}}
      done(i, row)

  monkeypatch.setattr(runner, "_run_pool", pool)
  yield sent
  compilers.forget()


@pytest.mark.needs_tpu_compiler
@pytest.mark.parametrize("outcome,status", [("out of memory", "agrees"), ("compiled", "disagrees")])
def test_a_case_judged_on_releases_compiles_under_each_and_is_judged_across_them(suite, releases_mocked, outcome, status):
  from jaxmem import versions

  installed = versions.installed_version("libtpu")
  case = suite.dataclasses.replace(suite.BY_NAME["tiny-v5e-1"], outcome=outcome,
                                   judged_on=(f"libtpu=={installed}", "libtpu==0.0.52"))
  r = suite.run_case(case)
  assert r.status == status, r.line
  assert len(releases_mocked) == 2 and releases_mocked[0] == versions.installed_libtpu()
  assert "fits; required" in r.line and "does not fit; required" in r.line and "libtpu 0.0.52" in r.line


def test_the_recipe_runs_are_cases_on_their_slices_as_the_recipes_name_them(suite):
  """tpu-recipes' runs (benchmarks/recipe_runs.py) are cases and calibration runs: each its recipe's
  overrides (MaxText 0.2.5's names, each change said), on the slice named as the recipe names it,
  which is a target of that many devices, at the step it was measured at."""
  import recipe_runs
  from jaxmem.hardware.targets import get_target

  calibrate = benchmark_module.load("calibrate_steptime")
  assert len(recipe_runs.RECIPES) >= 16
  for r in recipe_runs.RECIPES:
    case = suite.BY_NAME[r.name]
    assert case.outcome == suite.RAN and r.commit in case.source and case.versions == r.versions
    overrides, changed = recipe_runs.for_maxtext(r.overrides)
    assert suite.maxtext_overrides(case) == dict(o.split("=", 1) for o in overrides), r.name
    assert all(c in case.why_it_may_differ for c in changed), r.name
    target = suite.shlex.split(case.args)[1]
    devices = get_target(target).num_devices
    assert target == r.slice
    for key, value in suite.maxtext_overrides(case).items():  # each mesh axis the recipe sets divides the slice
      if key.startswith("ici_") and key.endswith("_parallelism") and value != "-1":
        assert devices % int(value) == 0, (r.name, key)
    assert calibrate.BY_CASE[r.name].step_s == r.step_s
  # A tpu7x slice named by its chip grid is two devices a chip.
  assert get_target(recipe_runs.BY_NAME["llama3.1-70b-tpu7x-4x4x4-bf16"].slice).num_devices == 2 * 4 * 4 * 4


def test_recipe_keys_maxtext_renamed_or_dropped_are_said(suite):
  import recipe_runs  # beside published_runs, which puts benchmarks/ on the path

  kept, changed = recipe_runs.for_maxtext(("fsdp_shard_on_exp=True", "tile_mlp_dim=1024", "wi_tile_fwd_buffer_count=2",
                                            "megablox=True"))
  assert kept == ("shard_exp_on_fsdp=True", "megablox=True")
  assert len(changed) == 3 and "fsdp_shard_on_exp passed as shard_exp_on_fsdp" in changed
