"""jaxmem.render.tables: compare, ranked, fit and scale rows in every format, from rows built here
(no compiles): the columns a sweep shows, the unit render.units picks, deltas against the no-remat
row, notes and errors below the table, and the JSON envelope with the compiler versions."""

from __future__ import annotations

import csv
import dataclasses
import io
import json

import pytest

from jaxmem import records, versions
from jaxmem.errors import JaxmemError
from jaxmem.planning.fit import FitResult
from jaxmem.planning.scale import Growth
from jaxmem.planning.sweep import Row
from jaxmem.render import columns as cols
from jaxmem.render import tables
from jaxmem.render.units import GiB, KiB, MiB

ALL = cols.ALL_CHOICE  # every column, each shown by its rule: what the tests of a column look at

VERSIONS = {"jax": "0.10.2", "jaxlib": "0.10.2", "jax-cuda12-plugin": "0.10.2"}
CAPACITY_NOTE = "capacity_bytes: 0.75 of the device's 79.1 GiB"


def _row(remat="none", *, temp=17 * GiB, flops=7.0e12, **kw) -> Row:
  """A compare row for gpt2-small on one H100: 0.5 GiB of params, 1 GiB of Adam state."""
  fields = dict(
      model="gpt2-small", target="gpu:h100", mesh="fsdp=1", batch=8, num_devices=1, remat=remat,
      optimizer="adamw", seq=1024, param_dtype="float32", dtype="bfloat16",
      param_bytes=GiB // 2, param_bytes_global=GiB // 2, optimizer_state_bytes=GiB,
      argument_size_in_bytes=3 * GiB // 2, output_size_in_bytes=3 * GiB // 2, alias_size_in_bytes=3 * GiB // 2,
      temp_size_in_bytes=temp, peak_memory_in_bytes=None if temp is None else temp + 3 * GiB // 2,
      total_bytes=None if temp is None else temp + 3 * GiB // 2,
      host_temp_size_in_bytes=0, flops=flops, compile_seconds=2.5, capacity_bytes=60 * GiB, versions=dict(VERSIONS),
      notes=(CAPACITY_NOTE,),
  )
  fields.update(kw)
  fields.setdefault("required_bytes", fields["peak_memory_in_bytes"])
  if fields["required_bytes"] is not None:
    fields.setdefault("fits", fields["required_bytes"] <= fields["capacity_bytes"])
  return Row(**fields)


def _sweep() -> list[Row]:
  none = _row("none", recompute_overhead_pct=0.0)
  full = _row("full", temp=3 * GiB, flops=8.4e12, recompute_overhead_pct=20.0)
  oom = _row("dots_saveable", temp=None, flops=7.1e12, recompute_overhead_pct=1.4, error="RESOURCE_EXHAUSTED: out of HBM",
             argument_size_in_bytes=None, peak_memory_in_bytes=None, total_bytes=None, required_bytes=70 * GiB, fits=False)
  return [none, full, oom]


def _markdown_table(text: str) -> list[dict[str, str]]:
  """The first github-style table in ``text`` as dicts by header."""
  lines = [line for line in text.splitlines() if line.startswith("|")]
  cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
  headers, body = cells[0], cells[2:]  # cells[1] is the |---| rule
  assert set("".join(cells[1])) <= set("-:"), "the second line is a markdown rule"
  return [dict(zip(headers, row, strict=True)) for row in body]


# -- compare --------------------------------------------------------------------------------------

def test_one_device_sweep_has_the_sweep_columns_and_no_more():
  text = tables.render_compare(_sweep(), "markdown", columns=ALL)
  rows = _markdown_table(text)
  assert list(rows[0]) == ["remat", "params", "opt state", "argument", "temp", "Δtemp", "peak", "total", "Δtotal",
                           "GFLOP", "recompute", "compile s", "capacity", "required", "fits"]
  assert [r["remat"] for r in rows] == ["none", "full", "dots_saveable"]


def test_heading_names_the_fixed_fields_the_unit_and_the_compilers():
  heading = tables.render_compare(_sweep(), "table").splitlines()[0]
  assert heading == ("model gpt2-small · target gpu:h100 · batch 8 · seq 1024 (1 device) · float32 params, "
                     "bfloat16 compute · GiB per device · jax 0.10.2, jax-cuda12-plugin 0.10.2")


def test_sizes_in_the_chosen_unit_and_deltas_against_no_remat():
  none, full, oom = _markdown_table(tables.render_compare(_sweep(), "markdown", columns=ALL))
  assert (none["params"], none["opt state"], none["argument"], none["temp"]) == ("0.50", "1.00", "1.50", "17.00")
  assert (none["Δtemp"], none["Δtotal"]) == ("0", "0")
  assert (full["temp"], full["Δtemp"], full["Δtotal"]) == ("3.00", "-14.00", "-14.00")
  assert (full["GFLOP"], full["recompute"], full["compile s"]) == ("8,400.0", "+20.0%", "2.5")
  assert (none["capacity"], none["required"], none["fits"]) == ("60.00", "18.50", "yes")
  # A refused compile: what is known (params, FLOPs, the compiler's figure) and no invented rest.
  assert (oom["params"], oom["argument"], oom["temp"], oom["peak"]) == ("0.50", "error (see below)", "-", "-")
  assert (oom["required"], oom["fits"], oom["GFLOP"]) == ("70.00", "NO", "7,100.0")


def test_notes_and_errors_follow_the_table_once_each():
  for fmt, bullet in (("table", ""), ("markdown", "- ")):
    text = tables.render_compare(_sweep(), fmt)
    tail = text.split("\n\n")[-1].splitlines()
    assert tail == [f"{bullet}note: {CAPACITY_NOTE}",
                    f"{bullet}error [fsdp=1 adamw dots_saveable]: RESOURCE_EXHAUSTED: out of HBM"]


def test_the_unit_follows_the_largest_figure():
  small = [_row(r, temp=t, param_bytes=3 * MiB, optimizer_state_bytes=6 * MiB, argument_size_in_bytes=9 * MiB,
                peak_memory_in_bytes=None, total_bytes=9 * MiB + t, required_bytes=None, fits=None, capacity_bytes=None)
           for r, t in (("none", 40 * MiB), ("full", 5 * MiB))]
  text = tables.render_compare(small, "markdown", columns=ALL)
  assert "· MiB per device" in text.splitlines()[0]
  none, full = _markdown_table(text)
  assert (none["params"], none["temp"], full["Δtemp"]) == ("3.00", "40.00", "-35.00")
  assert "capacity" not in none  # no capacity, no fit columns
  tiny = [_row("none", temp=300 * KiB, param_bytes=20 * KiB, optimizer_state_bytes=40 * KiB, argument_size_in_bytes=60 * KiB,
               total_bytes=360 * KiB, peak_memory_in_bytes=None, required_bytes=None, fits=None)]
  # Never below MiB: a tiny model's table reads 0.35 MiB rather than switching to KiB.
  assert _markdown_table(tables.render_compare(tiny, "markdown", columns=ALL))[0]["total"] == "0.35"


def test_meshes_add_mesh_and_comm_columns_and_say_what_comm_is():
  rows = [_row("none", mesh=m, num_devices=4, target="gpu:h100x4", comm_bytes=c) for m, c in (("data=4", GiB), ("fsdp=4", 3 * GiB))]
  text = tables.render_compare(rows, "markdown", columns=ALL)
  heading = text.splitlines()[0]
  assert "(4 devices)" in heading and heading.endswith("; comm = bytes each device sends per step in collectives")
  table = _markdown_table(text)
  assert list(table[0])[0] == "mesh" and "comm" in table[0]
  assert [(r["mesh"], r["comm"]) for r in table] == [("data=4", "1.00"), ("fsdp=4", "3.00")]


def test_what_varies_becomes_a_column_and_leaves_the_heading():
  rows = [_row("none", model="gpt2-small", optimizer="sgd"), _row("none", model="gpt2-medium", optimizer="adamw")]
  text = tables.render_compare(rows, "markdown", columns=ALL)
  assert "model" not in text.splitlines()[0] and text.splitlines()[0].startswith("target gpu:h100 · batch 8")
  table = _markdown_table(text)
  assert list(table[0])[:3] == ["model", "optimizer", "remat"]
  # Each row is compared with the no-remat row of its own optimizer: both are baselines here.
  assert [r["Δtemp"] for r in table] == ["0", "0"]


def test_host_temp_column_only_when_something_is_offloaded():
  assert "host temp" not in tables.render_compare(_sweep(), "markdown", columns=ALL)
  rows = [*_sweep()[:2], _row("qkv_proj_offloaded", temp=3 * GiB, host_temp_size_in_bytes=GiB // 4)]
  table = _markdown_table(tables.render_compare(rows, "markdown", columns=ALL))
  assert [r["host temp"] for r in table] == ["0.00", "0.00", "0.25"]


def test_host_capacity_and_verdict_columns_only_on_rows_that_offload():
  assert "host fits" not in tables.render_compare(_sweep(), "markdown")
  over = _row("full_offloaded", temp=3 * GiB, host_temp_size_in_bytes=2 * GiB, host_total_bytes=2 * GiB,
              host_capacity_bytes=GiB, host_fits=False, host_verdict="NO")
  unknown = _row("full_offloaded", temp=3 * GiB, host_temp_size_in_bytes=2 * GiB, host_total_bytes=2 * GiB)
  table = _markdown_table(tables.render_compare([*_sweep()[:1], over, unknown], "markdown"))
  assert [(r["fits"], r["host capacity"], r["host fits"]) for r in table] == [
      ("yes", "-", "-"), ("yes", "1.00", "NO"), ("yes", "-", "?")]


def test_totals_multiply_per_device_figures_by_the_device_count():
  rows = [_row("none", mesh="data=4", num_devices=4, target="gpu:h100x4"),
          _row("none", mesh="fsdp=4", num_devices=4, target="gpu:h100x4", param_bytes=GiB // 8, optimizer_state_bytes=GiB // 4)]
  doc = json.loads(tables.render_compare(rows, "json", totals=True))
  dp, fsdp = doc["rows"]
  assert dp["all_devices_param_bytes"] == 4 * dp["param_bytes"] == 4 * dp["param_bytes_global"]
  assert fsdp["all_devices_param_bytes"] == fsdp["param_bytes_global"]  # sharding moves ownership
  assert fsdp["all_devices_optimizer_state_bytes"] == GiB
  text = tables.render_compare(rows, "markdown", totals=True)
  assert "Σ = summed over all 4 devices" in text.splitlines()[0]
  table = _markdown_table(text)
  assert [(r["model params"], r["Σ params"]) for r in table] == [("0.50", "2.00"), ("0.50", "0.50")]


def test_no_rows_is_said():
  assert tables.render_compare([], "table") == "no rows"


# -- JSON and CSV ---------------------------------------------------------------------------------

def test_json_envelope_carries_what_made_it_jaxmem_jax_and_the_rows_compilers():
  rows = _sweep()
  doc = json.loads(tables.render_compare(rows, "json"))
  assert list(doc) == ["made_by", "jaxmem_version", "jax_version", "versions", "rows"]
  assert doc["made_by"] == {"command": "compare", "version": versions.__version__, "kind": "rows"}
  assert doc["jaxmem_version"] == versions.__version__
  assert doc["versions"] == VERSIONS
  assert doc["rows"] == [r.as_dict() for r in rows]
  assert doc["rows"][0]["notes"] == [CAPACITY_NOTE]  # tuples become JSON lists


def test_json_without_row_versions_names_every_installed_compiler():
  doc = json.loads(tables.render_records([{"target": "cpu"}], "json", made_by=tables.made_by("targets", "targets")))
  assert doc["versions"] == versions.compiler_versions()
  assert doc["rows"] == [{"target": "cpu"}]


def test_envelope_versions_given_win_and_extra_sections_sit_before_rows():
  env = tables.envelope(_sweep(), made_by=tables.made_by("scale", "rows"), versions={"jax": "9.9"}, growth=[1])
  assert env["versions"] == {"jax": "9.9"} and list(env)[-2:] == ["growth", "rows"]
  assert env["made_by"] == {"command": "scale", "version": versions.__version__, "kind": "rows"}


def test_csv_has_every_field_and_readable_cells():
  rows = _sweep()
  text = tables.render_compare(rows, "csv")
  read = list(csv.DictReader(io.StringIO(text)))
  assert list(read[0]) == list(rows[0].as_dict())
  assert [r["remat"] for r in read] == ["none", "full", "dots_saveable"]
  assert read[0]["versions"] == "jax 0.10.2; jaxlib 0.10.2; jax-cuda12-plugin 0.10.2"
  assert read[0]["notes"] == CAPACITY_NOTE
  assert read[2]["temp_size_in_bytes"] == "" and read[2]["fits"] == "False"  # None is an empty cell
  assert int(read[1]["temp_size_in_bytes"]) == 3 * GiB
  assert tables.render_csv([]) == ""


@pytest.mark.parametrize("render", [
    lambda fmt: tables.render_compare(_sweep(), fmt),
    lambda fmt: tables.render_records([{"a": 1}], fmt),
    lambda fmt: tables.render_ranked(_sweep(), fmt),
    lambda fmt: tables.render_fit([], fmt),
    lambda fmt: tables.render_scale(_sweep(), [], fmt),
])
def test_unknown_format_is_one_line(render):
  with pytest.raises(JaxmemError, match=r"^unknown format 'yaml'; valid: table, markdown, json, csv$"):
    render("yaml")


# -- listings, ranked, fit, scale -----------------------------------------------------------------

def test_records_cells():
  text = tables.render_records([{"model": "llama3-8b", "params": 8_030_261_248, "ratio": 1 / 3, "note": None, "ok": True}], "markdown")
  (row,) = _markdown_table(text)
  assert row == {"model": "llama3-8b", "params": "8,030,261,248", "ratio": "0.3333", "note": "-", "ok": "True"}
  (row,) = _markdown_table(tables.render_records([{"a": 1, "b": 2, "c": 3}], "markdown", headers=["c", "a"]))
  assert row == {"c": "3", "a": "1"}


def test_ranked_recommends_the_first_fitting_row():
  rows = [_row("full", temp=3 * GiB, recompute_overhead_pct=20.0), _row("none", temp=70 * GiB, recompute_overhead_pct=0.0)]
  first = tables.render_ranked(rows, "table").splitlines()[0]
  assert first == "recommendation: mesh fsdp=1, adamw, remat full (4.50 of 60.00 GiB per device, +20.0% recompute)"
  doc = json.loads(tables.render_ranked(rows, "json"))
  assert doc["recommended"]["remat"] == "full" and len(doc["rows"]) == 2


def test_ranked_says_when_nothing_fits():
  rows = [_row("none", temp=70 * GiB)]
  assert tables.render_ranked(rows, "markdown").startswith("recommendation: none of these configurations fits")
  assert json.loads(tables.render_ranked(rows, "json"))["recommended"] is None


def test_fit_table_names_the_largest_workload_per_configuration():
  best = _row("full", temp=3 * GiB, batch=64, recompute_overhead_pct=20.0)
  results = [FitResult(over="batch", mesh="fsdp=1", optimizer="adamw", remat="full", max_batch=64, max_seq=None, compiles=5, row=best),
             FitResult(over="batch", mesh="fsdp=1", optimizer="adamw", remat="none", max_batch=None, max_seq=None, compiles=1,
                       row=None, note="the smallest batch (1) does not fit")]
  text = tables.render_fit(results, "markdown", columns=ALL)
  assert text.splitlines()[0] == ("model gpt2-small · target gpu:h100 · seq 1024 · largest batch that fits, per device "
                                  "figures at it · jax 0.10.2, jax-cuda12-plugin 0.10.2")
  full, none = _markdown_table(text)
  assert (full["max batch"], full["required GiB"], full["capacity GiB"], full["compiles"]) == ("64", "4.50", "60.00", "5")
  assert (none["max batch"], none["required GiB"], none["note"]) == ("-", "-", "the smallest batch (1) does not fit")
  doc = json.loads(tables.render_fit(results, "json"))
  assert [r["max_batch"] for r in doc["rows"]] == [64, None] and doc["versions"] == VERSIONS


def test_scale_shows_rows_then_growth_exponents():
  growth = [Growth(mesh="fsdp=1", optimizer="adamw", remat="none", component="temp_size_in_bytes", batch_exponent=None, seq_exponent=1.04),
            Growth(mesh="fsdp=1", optimizer="adamw", remat="none", component="param_bytes", batch_exponent=None, seq_exponent=-0.001)]
  text = tables.render_scale(_sweep()[:2], growth, "markdown")
  table, exps = text.split("growth exponents")
  assert len(_markdown_table(table)) == 2
  assert [(r["component"], r["batch exponent"], r["seq exponent"]) for r in _markdown_table(exps)] == [
      ("temp", "-", "1.04"), ("param", "-", "0.00")]  # never "-0.00"
  doc = json.loads(tables.render_scale(_sweep()[:2], growth, "json"))
  assert [g["component"] for g in doc["growth"]] == ["temp_size_in_bytes", "param_bytes"]


_TRIP = "comm: {}: while loop without a known trip count; its body is counted once"


def test_a_note_rows_share_is_one_line_naming_the_rows_it_applies_to():
  # 14 rows, 16 trip-count notes about differently numbered loops: one line, its rows named.
  remats = [f"policy{i}" for i in range(14)]
  rows = [_row(r, notes=(CAPACITY_NOTE,) + tuple(_TRIP.format(f"while.{i + k}") for k in range(2 if i < 2 else 1)))
          for i, r in enumerate(remats[:12])]
  rows += [_row(r) for r in remats[12:]]
  tail = tables.render_compare(rows, "table").split("\n\n")[-1].splitlines()
  assert tail[0] == f"note: {CAPACITY_NOTE}"  # every row: no list
  (trip,) = [line for line in tail if "trip count" in line]
  assert trip.startswith("note (remat " + ", ".join(remats[:12]) + "): comm: while loop without a known trip count")
  assert "policy12" not in trip and "while.0, while.1, while.2, while.3 and 8 more" in trip  # while.0 to while.11
  assert len(tail) == 2


def test_at_risk_rows_say_so_with_their_margin_in_compare_and_fit():
  # 0.25 GiB left where the runtime may hold 0.5 beside the program.
  edge = _row("full", temp=3 * GiB, capacity_bytes=19 * GiB // 4, verdict="at risk", margin_bytes=GiB // 4,
              risk_bytes=GiB // 2, recompute_overhead_pct=20.0)
  safe = _row("minimal", temp=2 * GiB, capacity_bytes=19 * GiB // 4, verdict="yes", margin_bytes=5 * GiB // 4,
              risk_bytes=GiB // 2, recompute_overhead_pct=30.0)
  text = tables.render_compare([edge, safe], "markdown")
  full, minimal = _markdown_table(text)
  assert (full["fits"], minimal["fits"]) == ("at risk (0.25 left)", "yes")
  assert any(line.startswith("- note (remat full): at risk:") for line in text.splitlines())
  first = tables.render_ranked([edge], "table").splitlines()[0]
  assert first.endswith("+20.0% recompute, at risk: 0.25 GiB left, under the 0.50 the runtime may hold beside it)")
  assert json.loads(tables.render_compare([edge], "json"))["rows"][0]["verdict"] == "at risk"


def test_fit_prints_the_notes_compare_prints_for_the_same_row():
  cudnn = "attention cudnn: a deviceless compile sizes cuDNN's workspace at 0"
  best = _row("full", temp=3 * GiB, batch=64, notes=(CAPACITY_NOTE, cudnn))
  results = [FitResult(over="batch", mesh="fsdp=1", optimizer="adamw", remat="full", max_batch=64, max_seq=None,
                       compiles=5, row=best)]
  text = tables.render_fit(results, "table")
  assert f"note: {cudnn}" in text.splitlines() and f"note: {cudnn}" in tables.render_compare([best], "table")
  (row,) = _markdown_table(tables.render_fit(results, "markdown"))
  assert row["fits"] == "yes"


def test_a_comm_lower_bound_is_marked_in_the_table_the_heading_and_the_json():
  # A TPU loop whose trip count is unknown is counted once: that row's comm is a lower bound.
  rows = [_row("none", mesh=m, num_devices=4, target="tpu:v5p-8", comm_bytes=c, comm_lower_bound=lb)
          for m, c, lb in (("data=4", GiB, False), ("expert=4", 3 * GiB, True))]
  text = tables.render_compare(rows, "markdown", columns=ALL)
  heading = text.splitlines()[0]
  assert "lower bound" in heading and ">=" in heading
  table = _markdown_table(text)
  assert [(r["mesh"], r["comm"]) for r in table] == [("data=4", "1.00"), ("expert=4", ">=3.00")]
  assert [r["comm_lower_bound"] for r in json.loads(tables.render_compare(rows, "json"))["rows"]] == [False, True]
  # Exact figures only: no marker, and the heading says nothing of bounds.
  exact = tables.render_compare(rows[:1], "markdown", columns=ALL)
  assert "lower bound" not in exact and ">=" not in exact


# -- the column registry ----------------------------------------------------------------------------

def test_a_registered_column_appears_in_the_table_and_the_csv(monkeypatch):
  from jaxmem.render import columns

  # A column the rows do not carry: the no-remat row's temp over this row's, derived per cell.
  def ratio(cell):
    b = cell.baseline
    return None if b is None or not cell.row.temp_size_in_bytes else round(b.temp_size_in_bytes / cell.row.temp_size_in_bytes, 2)

  toy = columns.Column(field="temp_saving", header="temp saving", value=ratio, refused="-", written=True,
                       sets=frozenset({columns.DEFAULT}))
  registered = list(columns.COMPARE)
  monkeypatch.setattr(columns, "COMPARE", [*registered, toy])
  rows = _markdown_table(tables.render_compare(_sweep(), "markdown"))
  assert [r["temp saving"] for r in rows] == ["1", "5.67", "-"]
  lines = list(csv.DictReader(io.StringIO(tables.render_compare(_sweep(), "csv"))))
  assert [line["temp_saving"] for line in lines] == ["1.0", "5.67", ""]
  # Its visibility is data: a column shown only where its value varies leaves a uniform table alone.
  monkeypatch.setattr(columns, "COMPARE", [*registered, dataclasses.replace(toy, shown=columns.VARIES)])
  assert "temp saving" in tables.render_compare(_sweep(), "table")
  assert "temp saving" not in tables.render_compare(_sweep()[:1], "table")


def test_tokens_per_second_is_a_compare_column_where_the_estimate_has_it():
  rows = [_row("none", tokens_per_s_per_device=12345.6, step_time_s=0.5, bound="compute", mfu=0.4),
          _row("full", tokens_per_s_per_device=None)]
  table = _markdown_table(tables.render_compare(rows, "markdown", columns=ALL))
  assert [r["tokens/s/device (est)"] for r in table] == ["12,346", "-"]
  assert "tokens/s" not in tables.render_compare(_sweep(), "table")  # no estimate: no column


def test_no_record_is_wider_than_thirty_fields_of_its_own():
  import importlib
  import inspect
  import pkgutil

  import jaxmem

  wide = {}
  for info in pkgutil.walk_packages(jaxmem.__path__, "jaxmem."):
    if info.name.startswith("jaxmem.cli") or info.name.endswith("__main__"):
      continue
    module = importlib.import_module(info.name)
    for name, cls in vars(module).items():
      if inspect.isclass(cls) and dataclasses.is_dataclass(cls) and cls.__module__ == module.__name__:
        own = [f for f in dataclasses.fields(cls) if f.name in inspect.get_annotations(cls)]
        if len(own) > 30:
          wide[f"{module.__name__}.{name}"] = len(own)
  assert wide == {}


def test_a_composed_row_is_flat_when_written_and_read():
  row = _sweep()[1]
  assert isinstance(row.config, records.Configuration) and isinstance(row.compiled, records.CompilerFigures)
  assert row.temp_size_in_bytes == row.compiled.temp_size_in_bytes and row.remat == row.config.remat == "full"
  d = row.as_dict()
  assert list(d) == list(Row.flat_fields()) and "config" not in d
  assert Row(**{**d, "notes": tuple(d["notes"])}) == row  # the cache's round trip
  changed = dataclasses.replace(row, fits=False, remat="minimal")
  assert (changed.fits, changed.remat, changed.temp_size_in_bytes) == (False, "minimal", row.temp_size_in_bytes)
  with pytest.raises(TypeError, match="no_such_field"):
    Row(**d, no_such_field=1)
