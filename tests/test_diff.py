"""``jaxmem diff`` / ``jaxmem.diff``: two saved results compared by consumer, buffer and source
line, op and row; on remat none against full, the saved activations that disappear."""

import copy
import json

import pytest

import jaxmem
from jaxmem.cli import main
from jaxmem.render.diff import render_diff
from jaxmem.render.explain import render_explain

STEP = dict(model="tiny", target="cpu", batch=2, seq=64)


@pytest.fixture(scope="module")
def explained():
  return {remat: jaxmem.explain(**STEP, remat=remat) for remat in ("none", "full")}


@pytest.fixture(scope="module")
def saved(explained, tmp_path_factory):
  d = tmp_path_factory.mktemp("diff")
  paths = {}
  for remat, r in explained.items():
    paths[remat] = d / f"{remat}.json"
    paths[remat].write_text(render_explain(r, "json"))
  return paths


def test_the_same_step_saved_twice_differs_in_nothing(explained, saved, capsys):
  d = jaxmem.diff(saved["none"], explained["none"])  # a file and the result in hand
  assert d.kind == "explain" and not d.versions and not d.configuration_changes
  assert (d.figures, d.consumers, d.buffers, d.sources, d.ops, d.saved_disappeared) == ((),) * 6
  assert main(["diff", str(saved["none"]), str(saved["none"])]) == 0
  out = capsys.readouterr().out
  assert "buffers live at the peak whose sizes differ: none" in out and "versions: the same" in out


def test_a_buffer_whose_size_changed_is_named_with_its_source_line(saved, tmp_path):
  doc = json.loads(saved["none"].read_text())
  grown = copy.deepcopy(doc)
  group = next(g for g in grown["live_set"] if g["source"])  # the largest buffer with a source line
  group["size_bytes"] *= 2
  d = jaxmem.diff(doc, grown)
  (changed,) = d.buffers
  assert (changed.source, changed.shape, changed.delta_bytes) == (group["source"], group["shape"], group["size_bytes"] // 2)
  assert d.sources[0].name == group["source"] and d.ops[0].name == group["op"]
  assert group["source"] in render_diff(d)


def test_remat_full_against_none_lists_the_saved_activations_that_disappear_by_source_line(explained, saved, capsys):
  d = jaxmem.diff(saved["none"], saved["full"])
  assert d.configuration_changes["remat"] == ["none", "full"]
  gone = d.saved_disappeared
  assert gone and all(c.before > 0 and c.after is None and c.delta_bytes == -c.before for c in gone)
  assert all(":" in c.name for c in gone)  # file:line
  # Largest first, and every one of them saved under none and not under full.
  assert [abs(c.delta_bytes) for c in gone] == sorted((abs(c.delta_bytes) for c in gone), reverse=True)
  saved_none = {g.source for g in explained["none"].live_set if g.kind == "saved residual"}
  saved_full = {g.source for g in explained["full"].live_set if g.kind == "saved residual"}
  assert {c.name for c in gone} == saved_none - saved_full - {None}
  # The budget moved: full saves fewer activations, so the consumers' activations fall.
  assert next(c for c in d.consumers if c.name == "activations").delta_bytes < 0
  assert main(["diff", str(saved["none"]), str(saved["full"])]) == 0
  out = capsys.readouterr().out
  assert "saved activations that disappear" in out and gone[0].name in out and "remat none -> full" in out


def _row(**fields):
  base = dict(model="tiny", target="cpu", mesh="fsdp=1", batch=2, num_devices=1, remat="none", optimizer="adamw",
              seq=64, param_dtype="float32", dtype="bfloat16", temp_size_in_bytes=100, total_bytes=300,
              required_bytes=300, fits=None)
  return {**base, **fields}


def test_rows_are_matched_by_configuration_and_the_rest_paired_or_left_alone():
  a = {"rows": [_row(), _row(remat="full", temp_size_in_bytes=40, total_bytes=240, required_bytes=240)]}
  b = {"rows": [_row(remat="full", temp_size_in_bytes=60, total_bytes=260, required_bytes=260),
                _row(temp_size_in_bytes=100), _row(batch=4, remat="dots_saveable")]}
  d = jaxmem.diff(a, b)
  assert d.kind == "rows"
  by = {(r.status, r.configuration["remat"]): r for r in d.rows}
  full = by[("matched", "full")]
  assert [(c.name, c.delta_bytes) for c in full.figures][:1] in ([("required_bytes", 20)], [("temp_size_in_bytes", 20)])
  assert not by[("matched", "none")].figures  # the same figures: nothing listed
  assert by[("only in B", "dots_saveable")].configuration["batch"] == 4
  assert d.rows[0] is full  # the largest change first
  assert "matched" in render_diff(d)


def test_documents_of_two_kinds_or_not_jaxmems_are_one_line_errors(saved, tmp_path, capsys):
  bad = tmp_path / "bad.json"
  bad.write_text("[1, 2]")
  assert main(["diff", str(saved["none"]), str(bad)]) == 2
  assert "not a jaxmem JSON document" in capsys.readouterr().err
  with pytest.raises(jaxmem.JaxmemError, match="diff compares two of a kind"):
    jaxmem.diff(saved["none"], {"rows": []})


def test_table_renders_a_diff_as_the_command_prints_it(saved, capsys):
  d = jaxmem.diff(saved["none"], saved["full"])
  assert main(["diff", str(saved["none"]), str(saved["full"])]) == 0
  assert jaxmem.table(d) == capsys.readouterr().out.rstrip("\n")
  assert jaxmem.table(d, "json") == render_diff(d, "json")
  with pytest.raises(jaxmem.JaxmemError, match="table, markdown or json"):
    jaxmem.table(d, "csv")
