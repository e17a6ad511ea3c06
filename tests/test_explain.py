"""explain: consumers, live set at the peak, timeline, residuals (tiny model; real compilers)."""

import json

import pytest

from jaxmem import accelerators
from jaxmem.explain import CONSUMERS, explain
from jaxmem.explain_cli import JSON_BUFFER_KEYS, explain_json, residuals_table
from jaxmem.residuals import saved_residuals_by_policy
from jaxmem.timeline import plot_timeline, timeline_text


@pytest.fixture(scope="module")
def cpu_none():
  return explain(model="tiny", remat="none", target="cpu:4", mesh="fsdp=4", batch=8, seq=64, top=5)


def _close(r):
  assert r.peak_bytes and r.live_bytes_at_peak
  assert abs(r.live_bytes_at_peak - r.peak_bytes) <= 0.05 * r.peak_bytes, (r.live_bytes_at_peak, r.peak_bytes, r.notes)


def test_consumers_sum_to_compiler_total(cpu_none):
  r = cpu_none
  assert set(r.consumers) == set(CONSUMERS)
  rep = r.report
  total = rep.argument_size_in_bytes + rep.output_size_in_bytes - rep.alias_size_in_bytes + rep.temp_size_in_bytes
  assert sum(r.consumers.values()) == total + rep.generated_code_size_in_bytes == r.compiler_bytes
  assert r.consumers["activations"] > 0 and r.consumers["params"] > 0


def test_cpu_live_at_peak_matches(cpu_none):
  _close(cpu_none)
  assert cpu_none.peak_source != "compiler"  # CPU has no compiler peak: said in the notes
  assert any("XLA:CPU" in n for n in cpu_none.notes)
  assert sum(cpu_none.by_kind.values()) == cpu_none.live_bytes_at_peak == sum(cpu_none.by_module.values())


def test_largest_buffer_at_no_remat_peak_is_model_code(cpu_none):
  b = cpu_none.peak_buffers[0]
  assert b.size_bytes == max(x.size_bytes for x in cpu_none.peak_buffers)
  assert b.op_name and b.source and "models/" in b.source and ":" in b.source
  assert b.kind == "saved residual"


@pytest.mark.skipif(not accelerators.gpu_compiler_available("h100"), reason="CUDA compiler plugin not installed")
def test_gpu_live_at_peak_matches():
  r = explain(model="tiny", target="gpu:h100", mesh="fsdp=1", batch=8, seq=64, top=3)
  _close(r)
  assert r.peak_source == "compiler"
  assert sum(r.consumers.values()) == r.compiler_bytes


@pytest.mark.skipif(not accelerators.tpu_compiler_available(), reason="libtpu not installed")
def test_tpu_live_at_peak_matches():
  # Large enough that libtpu puts the step's temporaries in HBM (smaller steps live in VMEM,
  # where libtpu's peak counts bytes its dumped buffer assignment does not place: see explain).
  r = explain(model="tiny", target="tpu:v5e-4", mesh="fsdp=4", batch=64, seq=512, top=3)
  _close(r)
  assert r.peak_source == "compiler"


def test_plot_png_and_text(cpu_none, tmp_path):
  path = plot_timeline(cpu_none, str(tmp_path / "t.png"))
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  svg = plot_timeline(cpu_none, str(tmp_path / "t.svg"))
  assert "<svg" in open(svg).read(2000)
  text = timeline_text(cpu_none, width=40)
  assert "^" in text and "backward" in text
  assert all(len(line) == len(text.splitlines()[0]) for line in text.splitlines())


def test_json_keys(cpu_none):
  doc = json.loads(json.dumps(explain_json(cpu_none)))
  for k in ("consumers", "peak_bytes", "live_bytes_at_peak", "peak_buffers"):
    assert k in doc
  assert set(doc["peak_buffers"][0]) == set(JSON_BUFFER_KEYS)


def test_cli_explain_registers(tmp_path, capsys):
  from jaxmem import cli

  p = cli.build_parser()  # explain is registered by the CLI itself
  args = p.parse_args(["explain", "--model", "tiny", "--batch", "2", "--seq", "16", "--target", "cpu", "--plot", str(tmp_path / "x.gif")])
  from jaxmem.errors import JaxmemError

  with pytest.raises(JaxmemError):
    args.func(args)


def test_residuals_full_saves_less_than_none():
  rows = saved_residuals_by_policy(model="tiny", remat="none,everything_saveable,full", batch=2, seq=16)
  by = {r.remat: r for r in rows}
  assert by["full"].per_layer_bytes < by["none"].per_layer_bytes
  assert by["full"].per_layer_bytes < by["everything_saveable"].per_layer_bytes
  assert [r.name for r in by["full"].residuals] == ["x_btd"]  # only the layer's input
  assert by["none"].total_bytes == by["none"].per_layer_bytes * by["none"].num_layers
  table = residuals_table(rows, "table")
  assert "full" in table and "x_btd" in table
  assert json.loads(residuals_table(rows, "json"))["policies"][0]["remat"] == "none"
