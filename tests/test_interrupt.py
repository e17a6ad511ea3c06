"""Run options apart from the workload: Ctrl-C in every command (what was computed printed, exit
130, no traceback), the flags each command honours, and :class:`jaxmem.RunOptions`."""

from __future__ import annotations

import json

import pytest

import jaxmem
import jaxmem.compiler.figures as figures
from jaxmem.cli import main
from jaxmem.planning.validate import Measurement

# One small invocation per command that compiles; each reaches the compiler (nothing is cached:
# every test has its own cache folder).
COMPILING = {
    "compare": ["compare", "--model", "tiny", "--target", "cpu", "--batch", "2", "--seq", "16", "--remat", "none"],
    "fit": ["fit", "--model", "tiny", "--target", "tpu:v5e-1", "--seq", "16", "--remat", "none"],
    "fit-ranked": ["fit", "--model", "tiny", "--target", "tpu:v5e-1", "--batch", "2", "--seq", "16", "--remat", "none"],
    "fit-search": ["fit", "--model", "tiny", "--target", "tpu:v5e-1", "--batch", "2", "--seq", "16", "--remat", "search"],
    "fit-serving": ["fit", "--model", "tiny", "--target", "tpu:v5e-1", "--phase", "decode", "--context", "64"],
    "scale": ["scale", "--model", "tiny", "--target", "cpu", "--batch", "2", "--over", "seq=16,32"],
    "plan": ["plan", "--model", "tiny", "--target", "tpu:v5e-1", "--batch", "2", "--seq", "16", "--budget", "2"],
    "infer": ["infer", "--model", "tiny", "--target", "cpu", "--prompt", "16", "--context", "32"],
    "explain": ["explain", "--model", "tiny", "--target", "cpu", "--batch", "2", "--seq", "16"],
}


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
  monkeypatch.setenv("JAXMEM_CACHE_DIR", str(tmp_path))
  monkeypatch.setenv("JAXMEM_NO_PROGRESS", "1")


def interrupt_compiles(monkeypatch, after: int = 0) -> None:
  """Ctrl-C during the compile after ``after`` real ones."""
  real, done = figures.compile_timed, []

  def compile_timed(*a, **k):
    if len(done) >= after:
      raise KeyboardInterrupt
    done.append(1)
    return real(*a, **k)

  monkeypatch.setattr(figures, "compile_timed", compile_timed)


def assert_interrupted(code: int, err: str) -> None:
  assert code == 130, err
  assert "Traceback" not in err, err
  assert "jaxmem: interrupted" in err, err


@pytest.mark.parametrize("name", list(COMPILING))
def test_ctrl_c_in_a_compile_exits_130_without_a_traceback(name, monkeypatch, capsys):
  interrupt_compiles(monkeypatch)
  code = main(COMPILING[name])
  assert_interrupted(code, capsys.readouterr().err)


def test_ctrl_c_prints_the_rows_finished_before_it(monkeypatch, capsys):
  interrupt_compiles(monkeypatch, after=1)
  code = main([*COMPILING["compare"][:-1], "none,full", "--format", "json"])
  out, err = capsys.readouterr()
  assert_interrupted(code, err)
  assert [r["remat"] for r in json.loads(out)["rows"]] == ["none"]
  assert "after 1 of 2 configurations" in err


def test_ctrl_c_in_validate_prints_the_measurements_so_far(monkeypatch, capsys):
  def validate(workload, *, steps, distributed, run):
    run.start(2)
    run.row(Measurement(model="tiny", target="attached", mesh="fsdp=1", batch=2, num_devices=1, remat="none",
                        optimizer="adamw", seq=16, param_dtype="float32", dtype="bfloat16", steps=steps,
                        predicted_bytes=2**20, measured_bytes=2**20, ratio=1.0, loss=1.0))
    raise KeyboardInterrupt

  monkeypatch.setattr(jaxmem, "validate", validate)
  code = main(["validate", "--model", "tiny", "--batch", "2", "--seq", "16", "--format", "json"])
  out, err = capsys.readouterr()
  assert_interrupted(code, err)
  assert [r["remat"] for r in json.loads(out)["rows"]] == ["none"]


def test_ctrl_c_in_estimate_exits_130(monkeypatch, capsys):
  def estimates(*a, **k):
    raise KeyboardInterrupt

  monkeypatch.setattr(jaxmem, "estimates", estimates)
  assert_interrupted(main(["estimate", "--model", "tiny"]), capsys.readouterr().err)


@pytest.mark.parametrize("command", ["infer", "explain", "validate"])
@pytest.mark.parametrize("flag", [["--jobs", "2"], ["--scheduler", "tcp://localhost:8786"], ["--no-cache"], ["--totals"]])
def test_commands_that_cannot_honour_a_run_option_do_not_accept_it(command, flag, capsys):
  assert main([command, "--model", "tiny", *flag]) == 2
  err = capsys.readouterr().err
  assert len(err.strip().splitlines()) == 1 and "unrecognized arguments" in err and flag[0] in err, err


def test_fit_does_not_accept_totals(capsys):
  # fit's tables (the search's answers, a serving fit's) have no whole-mesh figures: a flag it
  # would only read to refuse is not one it takes.
  assert main(["fit", "--model", "tiny", "--target", "cpu", "--totals"]) == 2
  err = capsys.readouterr().err
  assert len(err.strip().splitlines()) == 1 and "unrecognized arguments: --totals" in err, err


@pytest.mark.parametrize("entry", [jaxmem.infer, jaxmem.explain, jaxmem.validate])
def test_library_entry_points_refuse_a_run_option_they_cannot_honour(entry):
  with pytest.raises(jaxmem.JaxmemError, match="does not take `jobs`"):
    entry(model="tiny", target="cpu", jobs=2)
  with pytest.raises(jaxmem.JaxmemError, match="does not take `scheduler`"):
    entry(model="tiny", target="cpu", run=jaxmem.RunOptions(scheduler="tcp://localhost:8786"))


def test_run_options_given_as_keywords_are_the_same_as_given_whole():
  fields = {"model": "tiny", "jobs": 2, "cache": False, "batch": 4}
  run = jaxmem.RunOptions.of(None, fields)
  assert run == jaxmem.RunOptions(jobs=2) and fields == {"model": "tiny", "batch": 4}
  assert jaxmem.RunOptions.of(run, {"scheduler": "s"}) == jaxmem.RunOptions(jobs=2, scheduler="s")
  with pytest.raises(jaxmem.JaxmemError, match="`jobs`"):
    jaxmem.RunOptions(jobs=0)


def test_on_start_is_told_the_number_of_rows_that_follow(monkeypatch):
  started, rows = [], []
  out = jaxmem.compare(model="tiny", target="tpu:v5e-1", batch=2, seq=16, remat="none,full", optimizer="sgd",
                       on_start=started.append, on_row=rows.append)
  (s,) = started
  assert s.total == len(out) == len(rows) == 2 and s.model.name == "tiny"
