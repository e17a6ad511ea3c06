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
    assert rows[0]["versions"].startswith("jax ")  # the compiler versions, in one readable cell
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
        (["compare", "--format", "yaml"], "--format must be one of table, markdown, json, csv"),
        (["compare", "--target", "cpu:4", "--mesh", "data=2"], "has 2 devices"),
        (["compare", "--target", "cpu:4", "--mesh", "data=4", "--batch", "6"], "not divisible"),
        (["compare", "--batch", "0"], "at least 1"),
        (["compare", "--batch", "x"], "--batch must be a whole number of at least 1"),
        (["compare", "--mesh", "pipe=1"], "unknown axis"),
        (["compare", "--target", "abacus"], "unknown target"),
        (["compare", "--target", "tpu7x-4x4x3"], "no v7x slice of chip grid 4x4x3; valid grids"),
        (["compare", "--target", "attached", "--distributed"], "jax.distributed.initialize() failed"),
        (["fit", "--target", "cpu", "--model", "tiny"], "needs a target with a memory capacity"),
        (["scale", "--target", "cpu", "--over", "seq=64"], "at least two"),
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


def test_validate_without_accelerator_says_so(capsys):
  from jaxmem.hardware.startup import attached_accelerator_present

  if attached_accelerator_present():
    pytest.skip("an accelerator is attached")
  assert main(["validate", "--model", "tiny", "--batch", "2", "--seq", "16"]) == 2
  err = capsys.readouterr().err
  assert "needs an attached TPU or GPU" in err and len(err.strip().splitlines()) == 1


def test_validate_measure_runs_real_steps_on_cpu():
  # The measuring half of validate, on the CPU: the step really runs, and the CPU's missing
  # peak counter is reported as such rather than as a number.
  from jaxmem.planning import validate
  from jaxmem.resolve import plan

  p = plan(model="tiny", batch=2, seq=16, remat="full", optimizer="adamw", target="cpu")
  m = validate.measure(p, p.meshes[0], p.optimizers[0], p.remats[-1], steps=2)
  assert m.loss is not None and m.predicted_bytes > 0
  assert m.measured_bytes is None and m.ratio is None and m.notes


def test_validate_measures_the_context_strategy_asked():
  # validate runs the program the workload asks for: ring attention over the context axis, not
  # the default all_gather (it built its program with no strategy, whatever was asked).
  from jaxmem.planning import validate
  from jaxmem.resolve import plan

  p = plan(model="tiny", batch=2, seq=256, remat="none", optimizer="sgd", target="cpu:2", mesh="context=2",
           context_strategy="ring")
  m = validate.measure(p, p.meshes[0], p.optimizers[0], p.remats[-1], steps=1)
  assert m.loss is not None and m.context_strategy == "ring"


def test_validate_hands_each_configuration_to_a_fresh_process_by_flags():
  # validate runs `python -m jaxmem _measure ARGV` per configuration: the flags must give the
  # measuring process the very workload (the target is the attached devices there).
  from jaxmem.cli import build_parser, validate as validate_cli
  from jaxmem.planning import validate
  from jaxmem.workload import Workload

  w = Workload(model="tiny", batch=4, seq=32, mesh="data=2,fsdp=2", remat="full", optimizer="lion", param_dtype="bfloat16")
  args = build_parser().parse_args(["_measure", *validate.argv(w)])
  assert validate_cli._workload(args) == w.replace(target="attached")


def test_targets_listing(capsys):
  assert main(["targets", "--format", "json"]) == 0
  import json as _json

  rows = {r["target"]: r for r in _json.loads(capsys.readouterr().out)["rows"]}
  assert rows["tpu:v5p-8"]["devices"] == 4 and rows["tpu:v5e-8"]["devices"] == 8
  assert rows["gpu:h100x8"]["devices"] == 8 and rows["gpu:h100"]["hbm_gib"] > 70
  # Host RAM per host and per device (a3-highgpu-8g: 1872 GB over 8 GPUs); null with the reason for the A800.
  h100 = rows["gpu:h100x8"]
  assert h100["host"] == "a3-highgpu-8g" and h100["host_gib_per_device"] * 8 == pytest.approx(h100["host_ram_gib"], rel=1e-3)
  assert rows["gpu:a800x8"]["host_ram_gib"] is None and rows["gpu:a800x8"]["host_note"].startswith("unknown: ")


@pytest.mark.slow  # two sharded compiles through the CLI
def test_totals_show_sharding_moves_ownership(capsys):
  argv = ["compare", "--model", "tiny", "--batch", "8", "--seq", "16", "--target", "cpu:4", "--remat", "none"]
  assert main([*argv, "--mesh", "data=4", "--mesh", "fsdp=4", "--totals", "--format", "json"]) == 0
  rows = {r["mesh"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
  dp, fsdp = rows["data=4"], rows["fsdp=4"]
  assert dp["all_devices_param_bytes"] == 4 * dp["param_bytes_global"]  # four copies
  assert abs(fsdp["all_devices_param_bytes"] - fsdp["param_bytes_global"]) < 0.05 * fsdp["param_bytes_global"]  # one
