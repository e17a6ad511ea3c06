"""Sweep axes declared once (jaxmem.axes): the workload's field, the flag, the record's field,
the task product, the cache key, the label, the column and the one-line refusal all derive from
one declaration, so an axis added in one place is swept, cached, labelled, shown and checked."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

import jaxmem
import jaxmem.models
from jaxmem.axes import AXES, one_value_each, outer_axes, swept_fields
from jaxmem.cli import _common
from jaxmem.errors import JaxmemError
from jaxmem.inference.workload import InferWorkload
from jaxmem.planning.fit import FitResult
from jaxmem.planning.scale import Growth
from jaxmem.records import Configuration
from jaxmem.workload import BaseWorkload, Workload


def _names(cls: type) -> set[str]:
  return {f.name for f in dataclasses.fields(cls)}


def test_every_axis_is_a_workload_field_with_its_declared_default():
  for axis in AXES.values():
    cls = Workload if axis.training else BaseWorkload
    assert axis.name in _names(cls)
    assert getattr(cls(), axis.name) == axis.normalise(axis.default)
  # An inference workload has every workload's axes and none of a train step's.
  assert {a.name for a in AXES.values() if not a.training} <= _names(InferWorkload)
  assert not {a.name for a in AXES.values() if a.training} & _names(InferWorkload)


def test_records_carry_the_recorded_axes():
  recorded = {a.name for a in AXES.values() if a.record is not None}
  assert recorded <= _names(Configuration)
  for cls in (FitResult, Growth):
    assert set(swept_fields()) <= _names(cls)


def test_every_axis_with_help_has_its_flag():
  p = argparse.ArgumentParser()
  _common.add_workload(p)
  _common.add_train_step(p)
  flags = _common.flags_by_field(p)
  for axis in AXES.values():
    if axis.help is not None:
      assert flags.get(axis.name) == axis.flag


def test_an_outer_axis_is_one_value_or_a_tuple():
  assert outer_axes()  # the model's config and the step's layout
  for name in outer_axes():
    assert not isinstance(getattr(Workload(), name), tuple)


@pytest.mark.parametrize("name", ["pipeline_microbatches", "pipeline_repeats", "dropout", "param_dtype", "sequence_parallel"])
def test_every_axis_normal_form_is_its_own_normal_form(name):
  # A workload is normalised again whenever a field is replaced (a task's batch, a plan's target),
  # so a value already normal must come back unchanged: two pipeline microbatch counts did not.
  given = {"pipeline_microbatches": "2,4", "pipeline_repeats": "1,2", "dropout": "0,0.1", "param_dtype": "bfloat16,float32",
           "sequence_parallel": "off,on"}[name]
  w = Workload(model="tiny", **{name: given})
  assert isinstance(getattr(w, name), tuple) and len(getattr(w, name)) == 2
  assert w.replace(batch=4).replace(batch=w.batch) == w
  for axis in AXES.values():
    value = getattr(w, axis.name)
    assert axis.normalise(value) == value, axis.name


def test_one_value_each_names_the_field_in_one_line():
  w = Workload(model="tiny", remat="none", qk_dtype="bfloat16,float32")
  with pytest.raises(JaxmemError, match="explain takes one `qk_dtype` .*; run it once per value") as e:
    one_value_each(w, "explain")
  assert "\n" not in str(e.value)
  one_value_each(w, "validate", skip=("qk_dtype",))
  one_value_each(w, "infer", only=outer_axes())


# --- a toy axis, declared in one place: an entry point in the group jaxmem.axes ---

TOY = '''
from jaxmem.axes import Axis, names
from jaxmem.errors import JaxmemError

COLOURS = ("red", "blue")


def parse(value, name):
  values = names(value)
  for v in values:
    if v not in COLOURS:
      raise JaxmemError(f"unknown `{name}` {v!r}; valid: {', '.join(COLOURS)}")
  return values


# Reaches the step as its task's workload and changes nothing in the program: recorded only.
TOY = Axis(name="toy", parse=parse, default=("red",), flag_default="red", help="a colour that changes nothing",
           word="toy", quiet=(None, "red"))
'''

SCRIPT = '''
import contextlib, io, json
import jaxmem
from jaxmem.cli import main
from jaxmem.cli._common import _label
from jaxmem.resolve import for_task, plan
from jaxmem.render.tables import render_compare

TINY = dict(model="tiny", target="cpu", batch=2, seq=16, remat="none")
out = {"declared": "toy" in jaxmem.AXES}
p = plan(**TINY, toy="red,blue")
tasks = p.tasks()
out["task_toys"] = [t.toy for t in tasks]
out["options"] = [for_task(p, t)[0].options() for t in tasks]
out["keys"] = [t.cache_key() for t in tasks]
cache = jaxmem.RowCache()
rows = jaxmem.compare(**TINY, toy="red,blue", cache=cache)
again = jaxmem.compare(**TINY, toy="blue,red", cache=cache)
out["rows"] = [r.toy for r in rows]
out["again"] = [r.toy for r in again]
out["hits"] = cache.hits
out["labels"] = [_label(r) for r in rows]
out["table"] = render_compare(rows, "table")
out["one_table"] = render_compare(rows[:1], "table")
try:
  jaxmem.compare(**TINY, toy="green")
except jaxmem.JaxmemError as e:
  out["refused"] = str(e)
err = io.StringIO()
with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
  out["exit"] = main(["compare", "--model", "tiny", "--target", "cpu", "--batch", "2", "--seq", "16",
                      "--remat", "none", "--toy", "red,green"])
out["stderr"] = err.getvalue()
stdout = io.StringIO()
with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(io.StringIO()):
  out["json_exit"] = main(["compare", "--model", "tiny", "--target", "cpu", "--batch", "2", "--seq", "16",
                           "--remat", "none", "--toy", "blue", "--format", "json"])
out["json"] = stdout.getvalue()
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
  """What jaxmem does with the toy axis, in a process where its entry point is installed."""
  root = tmp_path_factory.mktemp("toy")
  (root / "toy_axis.py").write_text(textwrap.dedent(TOY))
  dist = root / "toy_axis-0.dist-info"
  dist.mkdir()
  (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-axis\nVersion: 0\n")
  (dist / "entry_points.txt").write_text("[jaxmem.axes]\ntoy = toy_axis:TOY\n")
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
         "JAXMEM_CACHE_DIR": str(root / "cache")}
  env.pop("JAXMEM_NO_PROGRESS", None)
  done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_toy_axis_is_swept_and_recorded(toy):
  assert toy["declared"]
  assert toy["task_toys"] == ["red", "blue"]  # two values, two tasks
  assert toy["rows"] == ["red", "blue"]  # two rows, each recording its own


def test_a_toy_axis_reaches_the_program_as_an_option(toy):
  # The program code reads the options it uses by name and passes the others by.
  assert [o["toy"] for o in toy["options"]] == ["red", "blue"]
  assert all(o["qk_dtype"] == "bfloat16" for o in toy["options"])


def test_a_toy_axis_is_cached_apart(toy):
  assert len(set(toy["keys"])) == 2  # distinct cache keys
  assert toy["hits"] == 2 and toy["again"] == ["blue", "red"]  # each value read back as itself


def test_a_toy_axis_is_labelled_where_it_says_something(toy):
  red, blue = toy["labels"]
  assert "toy blue" in blue and "toy" not in red  # its default is not worth a word


def test_a_toy_axis_is_a_column_when_it_varies(toy):
  header = next(line for line in toy["table"].splitlines() if "remat" in line)
  assert "toy" in header
  assert "toy" not in toy["one_table"]  # one value: no column


def test_a_bad_toy_value_is_refused_in_one_line(toy):
  assert "`toy` 'green'" in toy["refused"] and "\n" not in toy["refused"]
  assert toy["exit"] == 2
  lines = [line for line in toy["stderr"].splitlines() if "error" in line]
  assert len(lines) == 1 and "--toy" in lines[0] and "green" in lines[0] and "Traceback" not in toy["stderr"]


def test_a_toy_axis_is_in_the_json(toy):
  assert toy["json_exit"] == 0
  doc = json.loads(toy["json"])
  rows = doc["rows"] if isinstance(doc, dict) else doc
  assert [r["toy"] for r in rows] == ["blue"]


# --- one swept option re-declared through its axis: its name in its declaration and its users only ---

LIBRARY = pathlib.Path(jaxmem.__file__).parent
MODELS = pathlib.Path(jaxmem.models.__file__).parent  # models/ in a checkout, installed as jaxmem.models


def test_qk_dtype_is_named_only_by_its_declaration_and_the_code_that_uses_it():
  """The rule: an option swept through its axis declaration (``--qk-dtype``) is named, in the
  library, only where it is declared (jaxmem/axes.py, which also checks its values), where the
  program code uses it (jaxmem/program/train.py, which reads it from the step's options) and
  where the model's attention takes it (models/attention_registry.py). Every other module passes
  it on generically, as the planner's options, the records' axes and the tables' axis columns
  (the docs may name it too)."""
  allowed = {LIBRARY / "axes.py", LIBRARY / "program" / "train.py", MODELS / "attention_registry.py"}
  naming = {f for root in (LIBRARY, MODELS) for f in root.rglob("*.py") if "qk_dtype" in f.read_text()}
  assert naming, "the option is declared somewhere"
  assert naming <= allowed, sorted(map(str, naming - allowed))
