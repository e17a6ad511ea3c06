"""The files a command writes beside its result (``--output``, ``--plot``, ``--xprof``): checked
before anything compiles (the folder, writability, and the format the extension names), and
written only after the result is printed, so a file that cannot be written after the compile
loses nothing: the table is on stdout, one line on stderr says which file was not written, and
the exit status is 2."""

from __future__ import annotations

import shutil

import pytest

import jaxmem
from jaxmem.cli import main

TINY = ["--model", "tiny", "--batch", "2", "--seq", "16", "--target", "cpu"]


@pytest.mark.parametrize("argv,flag,words", [
    (["explain", *TINY, "--plot", "{d}/timeline.pdf"], "--plot", ".pdf is not a format it writes; use png, svg"),
    (["explain", *TINY, "--plot", "{d}/timeline"], "--plot", "no extension to name its format"),
    (["scale", *TINY, "--over", "seq=16,32", "--plot", "{d}/scale.xyz"], "--plot", ".xyz is not a format"),
    (["infer", "--model", "tiny", "--target", "cpu", "--plot", "{d}/kv.pngg"], "--plot", ".pngg is not a format"),
    (["plan", "--model", "tiny", "--target", "cpu", "--plot", "{d}/pareto.txt"], "--plot", ".txt is not a format"),
    (["plan", "--model", "tiny", "--target", "cpu", "--plot", "{f}/pareto.png"], "--plot", "is not a folder"),
    (["compare", *TINY, "--output", "{d}/rows.json"], "--output", "a .json file holds --format json, not table"),
    (["compare", *TINY, "--format", "json", "--output", "{d}/rows.csv"], "--output", "holds --format csv, not json"),
    (["fit", "--model", "tiny", "--target", "cpu", "--output", "{d}/fit.md"], "--output", "holds --format markdown"),
    (["explain", *TINY, "--output", "{f}/out.txt"], "--output", "is not a folder"),
    (["explain", *TINY, "--xprof", "{f}"], "--xprof", "not a folder"),
    (["infer", "--model", "tiny", "--target", "cpu", "--output", "{d}"], "--output", "it is a folder"),
])
def test_each_file_is_refused_before_anything_starts(argv, flag, words, tmp_path, capsys, no_compile):
  afile = tmp_path / "a-file"
  afile.write_text("x")
  assert main([a.format(d=tmp_path, f=afile) for a in argv]) == 2
  err = capsys.readouterr().err
  assert f"cannot write {flag}" in err and words in err and len(err.strip().splitlines()) == 1, err
  assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # nothing written


def test_diff_checks_its_output_before_reading_its_inputs(tmp_path, capsys):
  assert main(["diff", "missing-a.json", "missing-b.json", "--output", str(tmp_path / "d.csv")]) == 2
  assert "holds --format csv, not table" in capsys.readouterr().err


def _removed_after(monkeypatch, name: str, folder):
  """``jaxmem.<name>`` as it is, but the folder removed once it returns: a file the check passed
  becomes unwritable while the command ran."""
  real = getattr(jaxmem, name)

  def run(*a, **k):
    out = real(*a, **k)
    shutil.rmtree(folder)
    return out

  monkeypatch.setattr(jaxmem, name, run)


@pytest.mark.parametrize("argv,name,flag", [
    (["compare", *TINY, "--remat", "none", "--no-cache", "--output", "{d}/rows.txt"], "compare", "--output"),
    (["explain", *TINY, "--plot", "{d}/timeline.png"], "explain", "--plot"),
    (["infer", "--model", "tiny", "--target", "cpu", "--prompt", "8", "--context", "16", "--plot", "{d}/kv.png"],
     "infer", "--plot"),
])
def test_a_file_that_cannot_be_written_after_the_compile_keeps_the_table(argv, name, flag, tmp_path, capsys, monkeypatch):
  out = tmp_path / "out"
  out.mkdir()
  _removed_after(monkeypatch, name, out)
  assert main([a.format(d=out) for a in argv]) == 2
  captured = capsys.readouterr()
  lines = captured.out.splitlines()
  assert any(line and set(line) <= {"-", " "} for line in lines) and "note:" in captured.out  # the table, in full
  (line,) = captured.err.strip().splitlines()
  assert line.startswith(f"jaxmem: error: cannot write {flag} {out}") and "printed in full on stdout" in line, line


def test_every_file_is_tried_and_each_failure_named_in_one_line(tmp_path, capsys, monkeypatch):
  out = tmp_path / "out"
  out.mkdir()
  _removed_after(monkeypatch, "explain", out)
  logdir = tmp_path / "logdir"  # still writable: made, and written, after the others failed
  argv = ["explain", *TINY, "--output", str(out / "e.txt"), "--plot", str(out / "t.svg"), "--xprof", str(logdir)]
  assert main(argv) == 2
  captured = capsys.readouterr()
  assert "consumer" in captured.out
  err = captured.err.strip().splitlines()
  assert err[-1].startswith("jaxmem: error: cannot write --output") and "; cannot write --plot" in err[-1]
  assert any(line.startswith("jaxmem: wrote ") for line in err) and list(logdir.rglob("*.xplane.pb"))
