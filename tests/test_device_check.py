"""benchmarks/device_check.py's path that needs no device: what it plans, its
table, and its refusal on a machine without an accelerator."""

from __future__ import annotations

import sys

import pytest

import benchmark_module
from jaxmem.planning.validate import Measurement, cudnn_workspace_bytes


@pytest.fixture(scope="module")
def dc():
  try:
    yield benchmark_module.load("device_check")
  finally:
    sys.modules.pop("device_check", None)


def test_plans_two_models_by_three_remat_policies_with_the_gpus_default_attention(dc):
  rows = dc.planned(dc.cases(), "gpu:h200")
  assert len(rows) == 6
  assert {(r["model"], r["remat"]) for r in rows} == {(m, r) for m, _, _ in dc.CASES for r in dc.REMATS}
  assert {r["attention"] for r in rows} == {"cudnn"}  # auto on a GPU
  assert {r["mesh"] for r in rows} == {"fsdp=1"}  # one device


def test_dry_run_lists_the_configurations(dc, capsys):
  assert dc.main(["--dry-run", "--remat", "none,full"]) == 0
  out = capsys.readouterr()
  assert '"remat": "full"' in out.out and "4 configurations" in out.err


def test_table_from_measurements(dc):
  common = dict(model="gpt2-small", target="attached", mesh="fsdp=1", batch=8, seq=1024, num_devices=1,
                optimizer="adamw", param_dtype="float32", dtype="bfloat16", attention="cudnn", microbatches=1, steps=3)
  ok = Measurement(**common, remat="none", predicted_bytes=10 * 2**30, measured_bytes=11 * 2**30, ratio=1.1, loss=10.9,
                   cudnn_workspace_bytes=64 * 2**20)
  failed = Measurement(**common, remat="full", predicted_bytes=None, measured_bytes=None, ratio=None, loss=None,
                       error="measurement process failed (exit 1): boom")
  text = dc.table([dc.record(ok), dc.record(failed)], device="NVIDIA H200")
  lines = text.splitlines()
  assert lines[0].startswith("device check on NVIDIA H200")
  assert "| gpt2-small | none | cudnn | 8 | 1024 | 10.00 | 11.00 | 1.100 | 64.00 | 10.900 |  |" in lines
  assert any("| full |" in ln and "boom" in ln and "| - | - | - |" in ln for ln in lines), lines


def test_the_budget_starts_no_configuration_after_it(dc, monkeypatch):
  import jaxmem.planning.validate as v

  calls = []

  def fake_validate(*, model, batch, seq, remat, steps, on_row):
    calls.append(model)
    common = dict(model=model, target="attached", mesh="fsdp=1", batch=batch, seq=seq, num_devices=1, optimizer="adamw",
                  param_dtype="float32", dtype="bfloat16", attention="cudnn", microbatches=1, steps=steps)
    done = []
    for r in ("none", *remat.split(",")):
      done.append(Measurement(**common, remat=r, predicted_bytes=2**30, measured_bytes=2**30, ratio=1.0, loss=1.0))
      on_row(done[-1])
    return done

  monkeypatch.setattr(v, "validate", fake_validate)
  everything = dc.measure(dc.cases(), steps=1, budget_s=1e9)
  assert [r["remat"] for r in everything] == ["none", "minimal", "full"] * 2 and not any(r["error"] for r in everything)
  calls.clear()
  cut = dc.measure(dc.cases(), steps=1, budget_s=0)  # past the budget once the first configuration is done
  assert calls == ["gpt2-small"], calls
  assert [bool(r.get("error")) for r in cut] == [False] + [True] * 5
  assert all("skipped: past --budget-s 0" in r["error"] for r in cut[1:])


def test_without_an_accelerator_it_is_one_line(dc, capsys):
  assert dc.main(["--budget-s", "1"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "needs an attached TPU or GPU" in err[0], err


def test_cudnn_workspace_read_from_the_compiled_text():
  text = """
  %fwd = (bf16[2,4,128,16]{3,1,2,0}, f32[2,4,128]{2,1,0}, u8[0]{0}) custom-call(%a, %b), custom_call_target="__cudnn$fmhaSoftmax"
  %bwd = (bf16[2,4,128,16]{3,1,2,0}, u8[1048576]{0}) custom-call(%x), custom_call_target="__cudnn$fmhaSoftmaxBackward"
  %g = (f32[8]{0}, s8[16]{0}) custom-call(%y), custom_call_target="__cublas$gemm"
  """
  assert cudnn_workspace_bytes(text) == 1048576
  assert cudnn_workspace_bytes("%g = f32[2]{0} add(%a, %b)") is None
