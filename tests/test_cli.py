"""The command line, called through main(argv) as a user would type it."""

import csv
import io
import json

import pytest

from jaxmem.cli import main

TINY = ["compare", "--model", "tiny", "--batch", "2", "--seq", "16", "--remat", "dots_saveable", "--target", "cpu"]


@pytest.mark.parametrize("fmt", ["table", "markdown", "json", "csv"])
def test_compare_each_format(fmt, capsys, tmp_path):
  out = tmp_path / f"out.{fmt}"
  assert main([*TINY, "--format", fmt, "--output", str(out)]) == 0
  text = capsys.readouterr().out
  assert out.read_text().strip() == text.strip()
  if fmt == "json":
    doc = json.loads(text)
    assert set(doc) >= {"jaxmem_version", "jax_version", "rows"}
    assert [r["remat"] for r in doc["rows"]] == ["none", "dots_saveable"]
    assert doc["rows"][0]["temp_size_in_bytes"] > 0 and doc["rows"][0]["error"] is None
  elif fmt == "csv":
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [r["remat"] for r in rows] == ["none", "dots_saveable"]
  else:
    assert "dots_saveable" in text and "temp" in text and "per device" in text
    if fmt == "markdown":
      assert "|---" in text.replace(" ", "").replace(":", "") or "| remat" in text


def test_models_listing(capsys):
  assert main(["models", "--format", "json"]) == 0
  doc = json.loads(capsys.readouterr().out)
  by = {r["model"]: r for r in doc["rows"]}
  assert abs(by["llama3-8b"]["params"] / 8.03e9 - 1) < 0.01
  assert main(["models"]) == 0
  assert "gpt2-small" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv,match",
    [
        (["compare", "--model", "gpt5"], "unknown model"),
        (["compare", "--remat", "dots"], "unknown remat policy"),
        (["compare", "--optimizer", "adamm"], "unknown optimizer"),
        (["compare", "--format", "yaml"], "unknown format"),
        (["compare", "--target", "cpu:4", "--mesh", "data=2"], "has 2 devices"),
        (["compare", "--target", "cpu:4", "--mesh", "data=4", "--batch", "6"], "not divisible"),
        (["compare", "--batch", "0"], "at least 1"),
        (["compare", "--batch", "x"], "invalid int value"),
        (["compare", "--mesh", "pipe=1"], "unknown axis"),
        (["compare", "--target", "abacus"], "unknown target"),
        (["frobnicate"], "invalid choice"),
        ([], "required"),
    ],
)
def test_bad_input_one_line_no_traceback(argv, match, capsys):
  assert main(argv) == 2
  err = capsys.readouterr().err
  assert match in err
  assert "Traceback" not in err
  assert len(err.strip().splitlines()) == 1
