"""The first screen a user sees: each command's default table at most 120 characters wide for
realistic rows (the figures that decide a launch; the rest with ``--columns``, JSON and CSV
always every field), ``--columns`` read against the command's table or refused in one line, and
a first line on stderr before JAX, the target or a compiler starts."""

from __future__ import annotations

import argparse
import dataclasses
import json

import jax
import pytest

import jaxmem
from jaxmem.cli import _common, main
from jaxmem.errors import JaxmemError
from jaxmem.inference.run import InferRow
from jaxmem.planning.fit import FitResult
from jaxmem.planning.scale import Growth
from jaxmem.planning.search import PlanResult
from jaxmem.render import columns as cols
from jaxmem.render import tables
from jaxmem.render.explain import render_explain
from jaxmem.render.inference import render_infer
from jaxmem.render.plan import render_plan
from jaxmem.render.units import GiB
from tests.test_render import _row

WIDTH = 120  # a terminal's width that a default table must fit


def _table(text: str) -> list[str]:
  """The lines of the first table in ``text``: its header, its rule (dashes) and its rows."""
  lines = text.splitlines()
  rule = next(i for i, line in enumerate(lines) if line and set(line) <= {"-", " "})
  end = next((i for i in range(rule + 1, len(lines)) if not lines[i].strip()), len(lines))
  return lines[rule - 1:end]


def _widest(text: str) -> int:
  return max(len(line) for line in _table(text))


def _step(**kw):
  """The step-time estimate of a compiled row (an H100's figures for gpt2-small)."""
  return {**dict(step_time_s=0.0288, roofline_step_time_s=0.0209, exposed_comm_time_s=0.0, bound="memory", mfu=0.23,
                 tokens_per_s_per_device=284564.0), **kw}


def _realistic() -> list[list]:
  """compare's rows as the sweeps users run make them: the README's first command (three remat
  policies on one H100), eight GPUs with meshes, optimizers and a long remat name, an at-risk
  verdict and an offloaded policy against the host, and a pipeline."""
  first = [_row(r, recompute_overhead_pct=p, **_step()) for r, p in (("none", 0.0), ("dots_saveable", 2.4), ("full", 16.4))]
  eight = dict(target="gpu:h100x8", num_devices=8, comm_bytes=3 * GiB, **_step(exposed_comm_time_s=0.004))
  meshes = [_row(r, mesh=m, optimizer=o, **eight) for m in ("data=8", "fsdp=2,tensor=4") for o in ("adamw", "adafactor")
            for r in ("none", "save_dot_except_mlp")]
  risk = [_row("full", verdict="at risk", margin_bytes=GiB // 4, risk_bytes=GiB // 2, capacity_bytes=19 * GiB // 4,
               temp=3 * GiB, **_step()),
          _row("qkv_proj_offloaded", temp=3 * GiB, host_temp_size_in_bytes=2 * GiB, host_total_bytes=2 * GiB,
               host_capacity_bytes=GiB, host_fits=False, host_verdict="NO", **_step())]
  pipe = [_row(r, mesh="data=4,stage=2", stages=2, bubble_fraction=0.2, pipeline_microbatches=4,
               stage_activation_bytes=GiB, required_1f1b_bytes=9 * GiB, microbatches=m, **eight)
          for r in ("none", "full") for m in (1, 4)]
  return [first, meshes, risk, pipe]


@pytest.mark.parametrize("rows", _realistic(), ids=["readme", "meshes", "risk", "pipeline"])
def test_compare_fits_the_screen_by_default_and_all_shows_every_column(rows):
  text = tables.render_compare(rows, "table")
  assert _widest(text) <= WIDTH, "\n".join(_table(text))
  everything = tables.render_compare(rows, "table", columns=cols.ALL_CHOICE)
  # All: each column its rule shows, as before there were sets (the README's first command's
  # table was 21 columns, some 260 characters wide).
  table = cols.Table(rows, cols.unit_of(rows, cols.COMPARE_UNIT_FIELDS), chosen=cols.ALL_CHOICE)
  assert _table(everything)[0].split() == " ".join(c.heading(table) for c in cols.COMPARE if c.shown(c, table)).split()
  default = _table(text)[0]
  for header in ("peak", "step (est)", "MFU (est)", "capacity", "required", "fits"):
    assert header in default
  # The refused row still points at its error, in the first column that can say so.
  refused = [*rows[:1], dataclasses.replace(rows[0], remat="oom", error="RESOURCE_EXHAUSTED", total_bytes=None,
                                            peak_memory_in_bytes=None)]
  assert "error (see below)" in tables.render_compare(refused, "table")


def test_the_first_screen_shows_the_memory_figure_the_target_gives():
  # A target with a capacity decides by peak and required; the CPU has neither a capacity nor a
  # peak, so its first screen shows the total rather than a column of dashes.
  gpu = _table(tables.render_compare(_realistic()[0], "table"))[0].split()
  assert "peak" in gpu and "required" in gpu and "total" not in gpu
  cpu_rows = [_row(r, target="cpu", capacity_bytes=None, peak_memory_in_bytes=None, required_bytes=None, fits=None)
              for r in ("none", "full")]
  cpu = _table(tables.render_compare(cpu_rows, "table"))[0].split()
  assert "total" in cpu and "peak" not in cpu and "capacity" not in cpu
  assert "peak" in _table(tables.render_compare(cpu_rows, "table", columns=cols.ALL_CHOICE))[0].split()


def test_json_and_csv_carry_every_field_whatever_the_table_shows():
  rows = _realistic()[1]
  doc = json.loads(tables.render_compare(rows, "json"))
  assert {"param_bytes", "temp_size_in_bytes", "roofline_step_time_s", "comm_bytes"} <= set(doc["rows"][0])
  header = tables.render_compare(rows, "csv").splitlines()[0].split(",")
  assert {"optimizer_state_bytes", "roofline_step_time_s", "exposed_comm_time_s"} <= set(header)


def _fit(rows) -> list[FitResult]:
  return [FitResult(over="batch", mesh=r.mesh, optimizer=r.optimizer, remat=r.remat, max_batch=r.batch, max_seq=None,
                    compiles=7, row=r, note="search stopped at the ceiling (524288); more may fit") for r in rows]


def test_fit_and_scale_fit_the_screen():
  rows = _realistic()[1]
  text = tables.render_fit(_fit(rows), "table")
  assert _widest(text) <= WIDTH
  # The answers' notes, without the note column, are lines under the table.
  assert "note: search stopped at the ceiling (524288); more may fit" in text.splitlines()
  assert "note" in _table(tables.render_fit(_fit(rows), "table", columns=cols.ALL_CHOICE))[0].split()
  growth = [Growth(mesh=r.mesh, optimizer=r.optimizer, remat=r.remat, component="temp_size_in_bytes", batch_exponent=1.0,
                   seq_exponent=1.02) for r in rows]
  scaled = tables.render_scale(rows, growth, "table")
  assert max(len(line) for line in _table(scaled.split("growth exponents")[1])) <= WIDTH
  assert _widest(scaled) <= WIDTH


def test_plan_fits_the_screen():
  rows = tuple(r for group in _realistic()[1:] for r in group)
  result = PlanResult(model="gpt2-small", target="gpu:h100x8", batch=8, seq=1024, budget=12, candidates=400, compiles=12,
                      cache_hits=0, pruned=(), not_compiled=300, rows=rows)
  assert _widest(render_plan(result, "table")) <= WIDTH
  assert "exposed comm" in render_plan(result, "table", columns=cols.choose("time", cols.PLAN))


def _infer_rows() -> list[InferRow]:
  out = []
  for mesh in ("tensor=8", "data=2,tensor=4"):
    for phase, context in (("prefill", 1024), ("decode", 2048), ("decode", 8192)):
      out.append(InferRow(
          model="llama3-8b", target="gpu:h100x8", mesh=mesh, batch=8, num_devices=8, phase=phase, weights="int8",
          context=context, prompt=1024, attention="cudnn" if phase == "prefill" else "dot", attention_kind="GQA",
          weight_bytes=8 * GiB, weight_bytes_per_device=GiB, kv_cache_bytes=4 * GiB, kv_cache_bytes_per_device=GiB // 2,
          kv_cache_bytes_per_token=131072, argument_size_in_bytes=3 * GiB // 2, temp_size_in_bytes=GiB // 4,
          peak_memory_in_bytes=2 * GiB, total_bytes=2 * GiB, capacity_bytes=60 * GiB, required_bytes=2 * GiB, fits=True,
          verdict="yes", comm_bytes=GiB // 8, step_time_s=0.0123, bound="memory", arithmetic_intensity=12.0,
          ridge_point=295.0, time_per_output_token_s=0.0123 if phase == "decode" else None, compile_seconds=4.2,
      ))
  return out


def test_infer_fits_the_screen():
  rows = _infer_rows()
  text = render_infer(rows, "table")
  assert _widest(text) <= WIDTH
  assert "per token (est)" in _table(text)[0] and "kv_cache_per_device" not in _table(text)[0]
  assert "kv_cache_per_device GiB" in render_infer(rows, "table", columns=cols.choose("memory", cols.INFER))


def test_explain_targets_and_models_fit_the_screen(capsys):
  r = jaxmem.explain(model="tiny", batch=2, seq=16, target="cpu")
  text = render_explain(r, "table")
  blocks = [b for b in text.split("\n\n") if any(line and set(line) <= {"-", " "} for line in b.splitlines())]
  assert len(blocks) == 4  # consumers, the buffers at the peak, by module, by kind
  assert all(_widest(b) <= WIDTH for b in blocks)
  assert "op_name" in render_explain(r, "table", columns=cols.ALL_CHOICE)
  for command in ("targets", "models"):
    assert main([command]) == 0
    assert _widest(capsys.readouterr().out) <= WIDTH
    assert main([command, "--columns", "all"]) == 0
    assert "vocab" in capsys.readouterr().out or command == "targets"


# -- --columns --------------------------------------------------------------------------------------

def test_a_choice_takes_sets_and_columns_and_keeps_the_configuration():
  rows = _realistic()[1]
  memory = _table(tables.render_compare(rows, "table", columns=cols.choose("memory", cols.COMPARE)))[0]
  assert "mesh" in memory and "optimizer" in memory and "Δtemp" in memory and "step (est)" not in memory
  named = _table(tables.render_compare(rows, "table", columns=cols.choose("comm_bytes,mfu", cols.COMPARE)))[0].split()
  assert named == ["mesh", "optimizer", "remat", "comm", "MFU", "(est)"]


def test_a_bad_column_is_one_line_naming_the_valid_ones():
  with pytest.raises(JaxmemError) as e:
    cols.choose("memory,tempp", cols.COMPARE)
  msg = str(e.value)
  assert "\n" not in msg and "'tempp'" in msg and "temp_size_in_bytes" in msg and "memory" in msg and "all" in msg


TINY = ["--model", "tiny", "--batch", "2", "--seq", "16", "--target", "cpu"]


@pytest.mark.parametrize("argv,match", [
    (["compare", *TINY, "--columns", "tempp"], "no column or set 'tempp'"),
    (["compare", *TINY, "--columns", "memory", "--format", "json"], "--format json writes every field"),
    (["compare", *TINY, "--columns", "all", "--residuals"], "--residuals' listing has none"),
    (["fit", *TINY, "--columns", "max"], "no column or set 'max'"),  # a fixed workload: compare's table
    (["fit", "--model", "tiny", "--target", "cpu", "--columns", "tokens_per_s_per_device"], "no column or set"),
    (["fit", *TINY, "--phase", "decode", "--columns", "all"], "serving fit's table"),
    (["scale", *TINY, "--over", "seq=16,32", "--columns", "bogus"], "no column or set 'bogus'"),
    (["plan", "--model", "tiny", "--target", "cpu", "--columns", "comm_bytes"], "no column or set 'comm_bytes'"),
    (["infer", "--model", "tiny", "--target", "cpu", "--columns", "params"], "no column or set 'params'"),
    (["explain", *TINY, "--columns", "mfu"], "no column or set 'mfu'"),
    (["targets", "--columns", "vocab"], "no column or set 'vocab'"),
    (["models", "--columns", "hbm_gib"], "no column or set 'hbm_gib'"),
])
def test_columns_are_read_against_the_table_printed_before_anything_starts(argv, match, capsys, no_compile):
  assert main(argv) == 2
  err = capsys.readouterr().err
  assert match in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


# -- the first line ----------------------------------------------------------------------------------

class _Started(Exception):
  """JAX was about to start: the test stops the command there."""


@pytest.mark.parametrize("argv", [
    ["compare", *TINY],
    ["compare", *TINY, "--residuals"],
    ["explain", *TINY],
    ["fit", "--model", "tiny", "--target", "cpu"],
    ["fit", *TINY],
    ["fit", *TINY, "--remat", "search"],
    ["fit", "--model", "tiny", "--target", "cpu", "--phase", "decode"],
    ["scale", *TINY, "--over", "seq=16,32"],
    ["plan", "--model", "tiny", "--target", "cpu"],
    ["infer", "--model", "tiny", "--target", "cpu"],
    ["validate", "--model", "tiny"],
    ["targets"],
], ids=lambda a: " ".join(a[:1] + [x for x in a[1:] if x in ("--residuals", "--phase", "search", "--batch")]))
def test_every_command_says_what_it_does_before_jax_or_a_compiler_starts(argv, capsys, monkeypatch):
  monkeypatch.delenv("JAXMEM_NO_PROGRESS", raising=False)
  seen: list[str] = []

  def started(*a, **k):
    seen.append(capsys.readouterr().err)
    raise _Started

  monkeypatch.setattr(jaxmem, "start_jax", started)  # the CLI starts JAX through it (_common.start)
  monkeypatch.setattr(jaxmem, "validate", started)  # validate starts its own, on the attached devices
  monkeypatch.setattr(jax.stages.Lowered, "compile", started)
  with pytest.raises(_Started):
    main(argv)
  (err,) = seen
  assert err.startswith(f"jaxmem: {argv[0]}") and len(err.splitlines()) == 1, err


def test_the_first_line_names_the_model_the_target_and_what_it_does(capsys, monkeypatch):
  monkeypatch.delenv("JAXMEM_NO_PROGRESS", raising=False)
  args = argparse.Namespace(model="gpt2-small", target=None, step=None, maxtext=None)
  _common.starting(args, "compare")
  assert capsys.readouterr().err == "jaxmem: compare gpt2-small on the default target; starting JAX and the compiler\n"
  _common.starting(argparse.Namespace(model="x", target="gpu:h100", step="pkg.mod:make_step"), "fit", ": the largest batch")
  assert capsys.readouterr().err.startswith("jaxmem: fit the step pkg.mod:make_step on gpu:h100: the largest batch;")
  monkeypatch.setenv("JAXMEM_NO_PROGRESS", "1")
  _common.starting(args, "compare")
  assert capsys.readouterr().err == ""


def test_infer_and_explain_count_their_compiles_as_compare_does(capsys, monkeypatch, tmp_path):
  monkeypatch.delenv("JAXMEM_NO_PROGRESS", raising=False)
  assert main(["infer", "--model", "tiny", "--target", "cpu", "--prompt", "8", "--context", "16,32"]) == 0
  err = capsys.readouterr().err.splitlines()
  compiling = [line for line in err if line.startswith("jaxmem: compiling")]
  assert [line.split(":")[1] for line in compiling] == [" compiling 1 of 3", " compiling 2 of 3", " compiling 3 of 3"]
  assert "prefill" in compiling[0] and "context 32" in compiling[2] and compiling[1].endswith("left)")
  assert [line.split("]")[0] for line in err if line.startswith("jaxmem: [")] == ["jaxmem: [1/3", "jaxmem: [2/3", "jaxmem: [3/3"]
  assert main(["explain", *TINY]) == 0
  err = capsys.readouterr().err.splitlines()
  assert err[0].startswith("jaxmem: explain tiny on cpu")
  assert err[1].startswith("jaxmem: compiling 1 of 1: tiny for cpu") and err[2].startswith("jaxmem: [1/1] ")


def test_a_terminal_without_a_bar_still_gets_a_line_per_compile(capsys, monkeypatch):
  # A short run (or JSON) on a terminal has no bar: it says each compile as a line instead of
  # staying silent through a compile of minutes.
  monkeypatch.delenv("JAXMEM_NO_PROGRESS", raising=False)
  monkeypatch.setattr("sys.stderr.isatty", lambda: True)
  progress = _common.Progress(argparse.Namespace(format="table"), None)
  progress.start(1)
  progress.compiling(jaxmem.Compiling(index=1, total=1, label="tiny for cpu"))
  assert capsys.readouterr().err == "jaxmem: compiling 1 of 1: tiny for cpu\n"
