"""The command line's input and output edges: output paths
checked before anything compiles, ``--version``, a closed pipe, a progress line per
configuration where stderr is not a terminal, comma lists for every program-shaping option,
and a sweep planned once."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import jax
import pytest

import jaxmem
from jaxmem.cli import main
from jaxmem.planning import sweep

TINY = ["--model", "tiny", "--batch", "2", "--seq", "16", "--target", "cpu"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def no_compile(monkeypatch):
  """Any compile fails the test: what is checked before compiling must not get that far."""

  def refuse(self, *a, **k):
    raise AssertionError("compiled before the output path was checked")

  monkeypatch.setattr(jax.stages.Lowered, "compile", refuse)


@pytest.mark.parametrize(
    "argv,flag",
    [
        (["compare", *TINY, "--output", "{f}/out.txt"], "--output"),
        (["compare", *TINY, "--output", "{d}/missing/out.txt"], "--output"),
        (["compare", *TINY, "--output", "{d}"], "--output"),
        (["explain", *TINY, "--plot", "{f}/timeline.png"], "--plot"),
        (["explain", *TINY, "--xprof", "{f}/logdir"], "--xprof"),
        (["explain", *TINY, "--xprof", "{f}"], "--xprof"),
        (["scale", *TINY, "--over", "seq=16,32", "--plot", "{f}/scale.png"], "--plot"),
        (["infer", "--model", "tiny", "--target", "cpu", "--prompt", "8", "--context", "16", "--plot", "{f}/x.png"], "--plot"),
        (["fit", "--model", "tiny", "--target", "tpu:v5e-1", "--output", "{f}/fit.txt"], "--output"),
    ],
)
def test_output_paths_are_checked_before_anything_compiles(argv, flag, tmp_path, capsys, no_compile):
  afile = tmp_path / "a-file"  # a path under a file cannot be created, even by root
  afile.write_text("x")
  argv = [a.format(f=afile, d=tmp_path) for a in argv]
  assert main(argv) == 2
  err = capsys.readouterr().err
  assert f"cannot write {flag}" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
  assert afile.read_text() == "x"  # nothing written over


def test_an_xprof_folder_still_to_be_made_is_accepted(tmp_path):
  from jaxmem.cli import _common

  args = type("Args", (), {"output": None, "plot": None, "xprof": str(tmp_path / "new" / "logdir")})()
  _common.check_outputs(args)  # created later, by to_xprof
  assert not (tmp_path / "new").exists()  # the check creates nothing


def test_version_names_jaxmem_and_the_compilers(capsys):
  assert main(["--version"]) == 0
  out = capsys.readouterr().out.strip()
  assert out.startswith(f"jaxmem {jaxmem.__version__} (") and f"jax {jax.__version__}" in out
  assert len(out.splitlines()) == 1


@pytest.mark.parametrize("how", [pytest.param("closed", marks=pytest.mark.slow), "head"])  # one compile each
def test_a_closed_pipe_ends_quietly(how):
  cmd = [sys.executable, "-m", "jaxmem", "models"]
  if how == "closed":  # the reader gone before jaxmem writes: its write meets EPIPE for certain
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    rc = proc.wait()
  else:  # as a user types it
    shell = f"set -o pipefail; {' '.join(cmd)} | head -1"
    done = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, cwd=ROOT, check=False)
    rc, err = done.returncode, done.stderr
    assert done.stdout.strip()  # head printed the first line
  assert rc == 0 and "Traceback" not in err and "BrokenPipeError" not in err, err


def test_a_progress_line_per_configuration_when_stderr_is_not_a_terminal(capsys, monkeypatch):
  monkeypatch.delenv("JAXMEM_NO_PROGRESS", raising=False)
  assert main(["compare", *TINY, "--remat", "full", "--no-cache", "--format", "json"]) == 0
  captured = capsys.readouterr()
  lines = [ln for ln in captured.err.splitlines() if ln.startswith("jaxmem: [")]
  assert [ln.split("]")[0] for ln in lines] == ["jaxmem: [1/2", "jaxmem: [2/2"], captured.err
  assert "none" in lines[0] and "full" in lines[1] and "required" in lines[1]
  assert json.loads(captured.out)["rows"]  # stdout stays the JSON document alone


def test_no_progress_silences_the_lines(capsys, monkeypatch):
  monkeypatch.setenv("JAXMEM_NO_PROGRESS", "1")
  assert main(["compare", *TINY, "--remat", "none", "--no-cache"]) == 0  # one compile is enough to be silent about
  assert "jaxmem: [" not in capsys.readouterr().err


@pytest.mark.slow  # a search of some 20 compiles (6 minutes on a loaded 2-core machine)
def test_fit_search_prints_a_line_per_compile(capsys, monkeypatch):
  monkeypatch.delenv("JAXMEM_NO_PROGRESS", raising=False)
  argv = ["fit", "--model", "tiny", "--seq", "16", "--target", "tpu:v5e-1", "--remat", "full", "--no-cache"]
  assert main([*argv, "--format", "json"]) == 0
  captured = capsys.readouterr()
  lines = [ln for ln in captured.err.splitlines() if ln.startswith("jaxmem: [")]
  compiles = sum(r["compiles"] for r in json.loads(captured.out)["rows"])
  assert len(lines) == compiles >= 3 and all("batch" in ln for ln in lines), captured.err
  assert lines[0].startswith("jaxmem: [1] ")


def test_fit_at_a_fixed_workload_prints_a_line_per_configuration(capsys, monkeypatch):
  monkeypatch.delenv("JAXMEM_NO_PROGRESS", raising=False)
  argv = ["fit", "--model", "tiny", "--batch", "2", "--seq", "16", "--target", "tpu:v5e-1", "--remat", "full"]
  assert main([*argv, "--no-cache"]) == 0
  lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("jaxmem: [")]
  assert [ln.split("]")[0] for ln in lines] == ["jaxmem: [1/2", "jaxmem: [2/2"] and "fits" in lines[0]


def test_a_search_without_a_total_counts_its_compiles(capsys, monkeypatch):
  from jaxmem.cli import _common

  monkeypatch.delenv("JAXMEM_NO_PROGRESS", raising=False)
  args = type("Args", (), {"format": "table"})()
  progress = _common.Progress(args, "jaxmem: target tpu:v5e-1 (chosen)")
  progress.start(None)
  row = sweep.Row(model="tiny", target="t", mesh="fsdp=1", batch=64, seq=16, num_devices=1, remat="full",
                  optimizer="adamw", param_dtype="float32", dtype="bfloat16", required_bytes=3 << 30, fits=True)
  progress.row(row)
  progress.row(dataclasses.replace(row, batch=128, required_bytes=None, fits=None, error="RESOURCE_EXHAUSTED: 20 GiB"))
  err = capsys.readouterr().err.splitlines()
  assert err[0] == "jaxmem: target tpu:v5e-1 (chosen)"
  assert err[1] == "jaxmem: [1] fsdp=1 adamw full batch 64 seq 16: required 3.00 GiB, fits"
  assert err[2].startswith("jaxmem: [2] fsdp=1 adamw full batch 128 seq 16: refused: RESOURCE_EXHAUSTED")


def test_a_progress_line_names_only_what_is_set(capsys, monkeypatch):
  # A user's step records None for what jaxmem did not choose (its optimizer, how it accumulates
  # and tiles, its scores' dtype): its line says nothing of them, not "microbatches None".
  from jaxmem.cli import _common

  monkeypatch.delenv("JAXMEM_NO_PROGRESS", raising=False)
  progress = _common.Progress(type("Args", (), {"format": "table"})(), None)
  progress.start(2)
  row = sweep.Row(model="step", target="cpu", mesh="fsdp=1", batch=8, seq=64, num_devices=1, remat="full",
                  optimizer=None, param_dtype=None, dtype=None, microbatches=None, vocab_tiles=None, qk_dtype=None,
                  required_bytes=3 << 20, fits=None)
  progress.row(row)
  progress.row(dataclasses.replace(row, microbatches=4))
  first, second = capsys.readouterr().err.splitlines()
  assert first == "jaxmem: [1/2] fsdp=1 full batch 8 seq 64: required 3.00 MiB"
  assert second == "jaxmem: [2/2] fsdp=1 full batch 8 seq 64 microbatches 4: required 3.00 MiB"


@pytest.mark.slow  # a CLI sweep of several compiles
def test_vocab_tiles_take_a_comma_list_and_sweep(capsys):
  argv = ["compare", "--model", "tiny", "--batch", "2", "--seq", "64", "--target", "tpu:v5e-1", "--remat", "full"]
  assert main([*argv, "--vocab-tiles", "1,8", "--format", "json", "--no-cache"]) == 0
  rows = json.loads(capsys.readouterr().out)["rows"]
  assert [(r["vocab_tiles"], r["remat"]) for r in rows] == [(1, "none"), (1, "full"), (8, "none"), (8, "full")]
  assert all(r["error"] is None for r in rows)
  # Each tiling is compared with its own baseline: the overhead of full remat is one figure,
  # whatever the tiling, only if each full row met the none row of its own tiling.
  full = [r for r in rows if r["remat"] == "full"]
  assert all(r["recompute_overhead_pct"] is not None and r["recompute_overhead_pct"] > 0 for r in full)


def test_a_vocab_tiling_that_does_not_divide_is_refused_before_compiling(capsys, no_compile):
  assert main(["compare", *TINY, "--vocab-tiles", "1,3"]) == 2
  err = capsys.readouterr().err
  assert "divisor of the sequence length 16" in err and len(err.strip().splitlines()) == 1


def test_a_sweep_is_planned_once(monkeypatch):
  calls = []
  real = sweep.plan
  monkeypatch.setattr(sweep, "plan", lambda *a, **k: calls.append(1) or real(*a, **k))
  # What is counted is planning, so each configuration's compile is left out: a row from its plan.
  monkeypatch.setattr(sweep, "run_config", lambda p, mesh, opt, rp, **k: sweep.Row(
      model=p.cfg.name, target=p.target.name, mesh="fsdp=1", batch=p.batch, num_devices=1, remat=rp.name,
      optimizer=opt.name, seq=p.seq, param_dtype=p.cfg.param_dtype, dtype=p.cfg.dtype, **k))
  rows = jaxmem.compare(model="tiny", batch=2, seq=16, target="cpu", remat="full", vocab_tiles="1,2")
  assert len(rows) == 4 and len(calls) == 1


def test_fit_at_a_fixed_workload_needs_a_capacity_before_compiling(capsys, no_compile):
  assert main(["fit", *TINY]) == 2
  err = capsys.readouterr().err
  assert "needs a target with a memory capacity" in err and len(err.strip().splitlines()) == 1


def test_an_interrupted_sweep_keeps_what_finished_in_its_output(tmp_path, capsys, monkeypatch):
  real, calls = sweep.run_config, []

  def second_is_interrupted(*a, **k):
    calls.append(1)
    if len(calls) == 2:
      raise KeyboardInterrupt
    return real(*a, **k)

  monkeypatch.setattr(sweep, "run_config", second_is_interrupted)
  out = tmp_path / "rows.json"
  assert main(["compare", *TINY, "--remat", "full", "--no-cache", "--format", "json", "--output", str(out)]) == 130
  captured = capsys.readouterr()
  assert [r["remat"] for r in json.loads(out.read_text())["rows"]] == ["none"]
  assert "interrupted after 1 of 2 configurations" in captured.err
