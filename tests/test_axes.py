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
from jaxmem.axes import AXES, as_configured, configured, one_value_each, outer_axes, swept_fields
from jaxmem.cli import _common
from jaxmem.errors import JaxmemError
from jaxmem.inference.workload import InferWorkload
from jaxmem.models import StepChoices, get_config
from jaxmem.planning.fit import FitResult
from jaxmem.planning.scale import Growth
from jaxmem.records import Configuration
from jaxmem.workload import BaseWorkload, Workload


def _names(cls: type) -> set[str]:
  return {f.name for f in dataclasses.fields(cls)}


def test_an_axis_that_sets_what_the_model_is_built_with_names_a_field_of_its_config_or_its_step_choices():
  cfg = get_config("tiny-moe")
  for axis in AXES.values():
    assert axis.configures is None or axis.chooses is None, axis.name  # one record each
    assert axis.configures is None or axis.configures in cfg.as_dict(), axis.name
    assert axis.chooses is None or axis.chooses in _names(StepChoices), axis.name
  # The step's choices are not the model's: an axis sets them as it sets a dtype, in one place.
  assert {a.name for a in AXES.values() if a.chooses} == _names(StepChoices)


def test_configured_gives_the_config_and_the_step_choices_the_model_is_built_with():
  cfg, choices = get_config("tiny-moe"), StepChoices()
  values = {"param_dtype": "bfloat16", "dropout": 0.1, "moe_impl": "capacity", "capacity_factor": 2.0,
            "qk_dtype": "float32", "remat": "full"}
  built, chosen = configured(cfg, choices, values)
  assert (built.param_dtype, built.dtype) == ("bfloat16", cfg.dtype)
  assert chosen == StepChoices(dropout=0.1, moe_impl="capacity", capacity_factor=2.0)
  assert dataclasses.replace(built, param_dtype=cfg.param_dtype) == cfg  # nothing else of the model's
  # An axis given no value (None) or its default leaves the config's and the choices' own.
  assert configured(cfg, choices, {"dropout": 0.0, "moe_impl": None, "param_dtype": None}) == (cfg, choices)
  recorded = as_configured(built, chosen)
  assert (recorded["param_dtype"], recorded["dropout"], recorded["capacity_factor"]) == ("bfloat16", 0.1, 2.0)


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


# --- toy axes, each declared in one place: an entry point in the group jaxmem.axes ---

TOY = """
from jaxmem.axes import Axis, Recorded, numbers, names, outer
from jaxmem.errors import JaxmemError
from jaxmem.mesh import parse_mesh

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


def on_context(values):
  return values.get("mesh") is not None and dict(parse_mesh(values["mesh"])).get("context", 1) > 1


# Means something only where the mesh splits over a context axis: elsewhere one task, recording None.
SPLIT = Axis(name="toy_split", parse=parse, default=("red",), flag_default="red", help="a colour for context meshes",
             word="split", quiet=(None, "red"), applies=on_context,
             applies_to="meshes with a context axis (e.g. context=2); no mesh here has one")

# Changes the model's config (its norms' epsilon): each value its own plan, and a model of its own.
EPS = Axis(name="toy_eps", parse=outer(numbers), default=1e-5, outer=True, configures="norm_eps",
           help="the norms' epsilon", word="eps", quiet=(None, 1e-5), record=Recorded(annotation="float | None"))
"""

SCRIPT = """
import contextlib, io, json
import jaxmem
jaxmem.start_jax(2)
from jaxmem.cli import main
from jaxmem.cli._common import _label
from jaxmem.resolve import for_task, plan
from jaxmem.render.tables import render_compare


def run(argv):
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    code = main(argv)
  return code, out.getvalue(), err.getvalue()


def refused(**fields):
  try:
    jaxmem.compare(**fields)
  except jaxmem.JaxmemError as e:
    return str(e)


def sweep(name, fields, values, again_values):
  # Planned, compiled, compiled again from the cache, labelled and tabled.
  cache = jaxmem.RowCache()
  p = plan(**fields, **{name: values})
  tasks = p.tasks()
  rows = jaxmem.compare(**fields, **{name: values}, cache=cache)
  before = cache.hits  # a default's row may be the cache's already: another axis's at its default
  again = jaxmem.compare(**fields, **{name: again_values}, cache=cache)
  return {
      "declared": name in jaxmem.AXES,
      "tasks": [getattr(t, name) for t in tasks],
      "options": [for_task(p, t)[0].options() for t in tasks],
      "keys": [t.cache_key() for t in tasks],
      "rows": [getattr(r, name) for r in rows], "meshes": [r.mesh for r in rows],
      "again": [getattr(r, name) for r in again], "hits": cache.hits - before,
      "labels": [_label(r) for r in rows],
      "table": render_compare(rows, "table"), "one_table": render_compare(rows[:1], "table"),
  }


TINY = dict(model="tiny", target="cpu", batch=2, seq=16, remat="none")
CLI = ["compare", "--model", "tiny", "--target", "cpu", "--batch", "2", "--seq", "16", "--remat", "none"]
out = {"toy": sweep("toy", TINY, "red,blue", "blue,red")}
out["toy"]["refused"] = refused(**TINY, toy="green")
out["toy"]["exit"], _, out["toy"]["stderr"] = run([*CLI, "--toy", "red,green"])
out["toy"]["json_exit"], out["toy"]["json"], _ = run([*CLI, "--toy", "blue", "--format", "json"])

# The mesh-dependent axis: a context mesh and one without.
SPLIT = dict(model="tiny", target="cpu:2", batch=2, seq=256, remat="none", mesh=["context=2", "fsdp=2"])
out["split"] = sweep("toy_split", SPLIT, "red,blue", "blue,red")
out["split"]["refused"] = refused(**SPLIT, toy_split="green")
out["split"]["nowhere"] = refused(**{**SPLIT, "mesh": "fsdp=2"}, toy_split="blue")
out["split"]["exit"], _, out["split"]["stderr"] = run([*CLI, "--toy-split", "red,green"])

# The model-config axis.
out["eps"] = sweep("toy_eps", TINY, "1e-5,1e-3", "1e-3,1e-5")
out["eps"]["models"] = [p.cfg.norm_eps for p in plan(**TINY, toy_eps="1e-5,1e-3").variants]
out["eps"]["refused"] = refused(**TINY, toy_eps="-1")
out["eps"]["exit"], _, out["eps"]["stderr"] = run([*CLI, "--toy-eps", "1e-5,x"])
out["eps"]["json_exit"], out["eps"]["json"], _ = run([*CLI, "--toy-eps", "1e-3", "--format", "json"])
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def toys(tmp_path_factory):
  """What jaxmem does with the toy axes, in a process where their entry points are installed."""
  root = tmp_path_factory.mktemp("toy")
  (root / "toy_axis.py").write_text(textwrap.dedent(TOY))
  dist = root / "toy_axis-0.dist-info"
  dist.mkdir()
  (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-axis\nVersion: 0\n")
  (dist / "entry_points.txt").write_text(
      "[jaxmem.axes]\ntoy = toy_axis:TOY\ntoy_split = toy_axis:SPLIT\ntoy_eps = toy_axis:EPS\n")
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
         "JAXMEM_CACHE_DIR": str(root / "cache")}
  env.pop("JAXMEM_NO_PROGRESS", None)
  done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=900)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(params=["toy", "toy_split", "toy_eps"])
def toy(request, toys):
  """One toy axis's results, by its name, with the values it was swept over (the first its default)."""
  key = {"toy": "toy", "toy_split": "split", "toy_eps": "eps"}[request.param]
  values = {"toy": ["red", "blue"], "toy_split": ["red", "blue"], "toy_eps": [1e-5, 1e-3]}[request.param]
  return dict(toys[key], name=request.param, values=values)


def test_a_toy_axis_is_swept_and_recorded(toy):
  assert toy["declared"]
  default, other = toy["values"]
  if toy["name"] == "toy_split":
    assert toy["tasks"] == ["red", "red", "blue"] and toy["meshes"] == ["context=2", "fsdp=2", "context=2"]
    assert toy["rows"] == ["red", None, "blue"]  # two values, two rows where it applies; None where not
  else:
    assert toy["tasks"] == [default, other]  # two values, two tasks
    assert toy["rows"] == [default, other]  # two rows, each recording its own


def test_a_toy_axis_reaches_the_program(toy):
  # The program code reads the options it uses by name and passes the others by; an axis that
  # does not apply to a configuration reaches it as None; one that configures the model, as the
  # model's config.
  options = [o[toy["name"]] for o in toy["options"]]
  assert options == {"toy": ["red", "blue"], "toy_split": ["red", None, "blue"], "toy_eps": [1e-5, 1e-3]}[toy["name"]]
  assert all(o["qk_dtype"] == "bfloat16" for o in toy["options"])


def test_a_model_config_toy_axis_builds_its_own_model(toys):
  assert toys["eps"]["models"] == [1e-5, 1e-3]


def test_a_toy_axis_is_cached_apart(toy):
  assert len(set(toy["keys"])) == len(toy["keys"])  # distinct cache keys
  assert toy["hits"] == len(toy["rows"]) and sorted(map(str, toy["again"])) == sorted(map(str, toy["rows"]))


def test_a_toy_axis_is_labelled_where_it_says_something(toy):
  word = {"toy": "toy", "toy_split": "split", "toy_eps": "eps"}[toy["name"]]
  first, *rest = toy["labels"]
  other = toy["labels"][-1]
  assert f"{word} {toy['values'][1]:g}" in other if toy["name"] == "toy_eps" else f"{word} blue" in other
  assert f"{word} " not in first  # its default is not worth a word
  if toy["name"] == "toy_split":
    assert f"{word} " not in rest[0]  # nor where it does not apply


def test_a_toy_axis_is_a_column_when_it_varies(toy):
  header = next(line for line in toy["table"].splitlines() if "remat" in line)
  assert toy["name"].replace("_", " ") in header
  assert toy["name"].replace("_", " ") not in toy["one_table"]  # one value: no column


def test_a_bad_toy_value_is_refused_in_one_line(toy):
  assert toy["refused"] and "\n" not in toy["refused"]
  assert toy["exit"] == 2
  lines = [line for line in toy["stderr"].splitlines() if "error" in line]
  flag = "--" + toy["name"].replace("_", "-")
  assert len(lines) == 1 and flag in lines[0] and "Traceback" not in toy["stderr"], toy["stderr"]


def test_a_toy_axis_given_where_it_applies_to_nothing_is_refused(toys):
  nowhere = toys["split"]["nowhere"]
  assert nowhere == "`toy_split` applies to meshes with a context axis (e.g. context=2); no mesh here has one"


@pytest.mark.parametrize("name", ["toy", "toy_eps"])
def test_a_toy_axis_is_in_the_json(toys, name):
  toy = toys["eps" if name == "toy_eps" else "toy"]
  assert toy["json_exit"] == 0
  rows = json.loads(toy["json"])["rows"]
  assert [r[name] for r in rows] == [1e-3 if name == "toy_eps" else "blue"]


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


# Where each option may be named, beside its declaration (jaxmem/axes.py): the program code that
# applies it, the closed form that counts it (planning/estimate.py) and MaxText's mapping table
# (its files count as one).
NAMED_BY = {
    "dropout": ("program/train.py", "planning/estimate.py"),
    "context_strategy": ("program/train.py",),
    "vocab_tiles": ("program/train.py",),
    "grad_reduce_dtype": ("program/precision.py", "planning/estimate.py"),
    "master_dtype": ("program/precision.py", "planning/estimate.py"),
    "moments_dtype": ("program/precision.py", "planning/estimate.py"),
}
MAXTEXT = ("maxtext/",)  # MaxText's package: its one mapping table and the code that reads it


@pytest.mark.parametrize("name", sorted(NAMED_BY))
def test_an_option_is_named_by_its_declaration_its_program_its_closed_form_and_maxtext_only(name):
  """Every other module passes the option on through its declaration (the planner's options, the
  records' fields, the tables' columns and labels), so a new axis is one declaration and the code
  that applies it."""
  naming = {f.relative_to(LIBRARY).as_posix() for f in LIBRARY.rglob("*.py") if name in f.read_text()}
  others = {f for f in naming if not any(m in f for m in MAXTEXT)}
  assert others <= {"axes.py", *NAMED_BY[name]}, sorted(others - {"axes.py", *NAMED_BY[name]})
  assert len(others) + any(any(m in f for m in MAXTEXT) for f in naming) <= 4


def test_a_label_names_the_moe_kernel_only_where_one_was_chosen():
  # The progress line before each compile is made of these words: "moe kernel auto" on a dense
  # model's compile (the default, which a dense model never uses) said nothing true.
  from types import SimpleNamespace

  from jaxmem.axes import labels

  assert not any("moe kernel" in w for w in labels(SimpleNamespace(moe_kernel="auto")))
  assert not any("moe kernel" in w for w in labels(SimpleNamespace(moe_kernel=None)))
  assert "moe kernel ragged_dot" in labels(SimpleNamespace(moe_kernel="ragged_dot"))
