"""The Workload every entry point takes: normalisation, overrides, and a new field reaching the
planner and the row cache's key without changes in between."""

from __future__ import annotations

import dataclasses

import pytest

from jaxmem.cli import _common
from jaxmem.inference.infer import InferWorkload, plan_infer
from jaxmem.resolve import plan
from jaxmem.workload import Workload

TINY = dict(model="tiny", batch=2, seq=16, target="cpu")


def test_axes_are_tuples_of_names_however_written():
  a = Workload(remat="full,dots_saveable", optimizer=" sgd , lion")
  b = Workload(remat=["full", "dots_saveable"], optimizer=("sgd", "lion"))
  assert a == b
  assert a.remat == ("full", "dots_saveable") and a.optimizer == ("sgd", "lion")
  assert Workload(remat="").remat == ()


def test_a_mesh_string_is_one_mesh():
  # Commas inside a mesh separate axes, not meshes.
  assert Workload(mesh="data=2,fsdp=4").mesh == ("data=2,fsdp=4",)
  assert Workload(mesh=["data=8", "fsdp=8"]).mesh == ("data=8", "fsdp=8")
  assert Workload(mesh=(("data", 2), ("fsdp", 4))).mesh == ("data=2,fsdp=4",)
  assert Workload(mesh=None).mesh == ()


def test_of_takes_defaults_then_overrides_and_ignores_none():
  w = Workload.of(None, {"remat": "none"}, model="tiny", batch=None)
  assert (w.model, w.batch, w.remat) == ("tiny", Workload().batch, ("none",))
  given = Workload(model="tiny", remat="full")
  assert Workload.of(given, {"remat": "none"}) is given  # defaults only without a workload
  assert Workload.of(given, batch=4).replace(batch=2) == Workload(model="tiny", remat="full", batch=2)


def test_unknown_field_is_refused():
  with pytest.raises(TypeError):
    Workload.of(None, remats="full")


def test_a_workload_and_keywords_plan_the_same():
  by_workload = plan(Workload(**TINY, remat="full", optimizer="sgd"))
  by_keywords = plan(**TINY, remat="full", optimizer="sgd")
  assert [t.cache_key() for t in by_workload.tasks()] == [t.cache_key() for t in by_keywords.tasks()]
  assert [t.remat for t in by_keywords.tasks()] == ["none", "full"]


def test_task_replace_changes_the_key():
  task = plan(**TINY, remat="full").tasks()[-1]
  bigger = task.replace(batch=4)
  assert bigger.workload.batch == 4 and bigger.remat == task.remat
  assert bigger.cache_key() != task.cache_key()


@dataclasses.dataclass(frozen=True, kw_only=True)
class _WithLabel(Workload):
  """What a new field costs: one line here (and, in the CLI, its flag)."""

  label: str = "a"


def test_a_new_field_reaches_the_cache_key_and_the_cli_builder():
  a = plan(_WithLabel(**TINY)).tasks()[0]
  b = plan(_WithLabel(**TINY, label="b")).tasks()[0]
  assert b.workload.label == "b"  # carried into the task a worker runs
  assert a.cache_key() != b.cache_key()
  parser = _common.Parser(prog="t")
  _common.add_workload(parser)
  _common.add_sweep_axes(parser)
  parser.add_argument("--label", default=None)
  args = parser.parse_args(["--model", "tiny", "--label", "b", "--remat", "full"])
  assert _common.workload(args, _WithLabel) == _WithLabel(model="tiny", label="b", remat="full")
  # A flag left out keeps the field's default (the CLI's None is not passed on).
  assert _common.workload(parser.parse_args(["--model", "tiny"]), _WithLabel).label == "a"


def test_infer_workload_normalises_its_own_fields():
  w = InferWorkload(context=64, weights="bf16,int4", phase=["decode"])
  assert w.context == ("64",) and w.weights == ("bf16", "int4") and w.phase == ("decode",)
  assert InferWorkload(context="32,64").context == ("32", "64")
  # Not given: the plan's (inference's own default, or the smallest batch its mesh divides).
  assert InferWorkload().batch is None and Workload().batch is None and Workload().seq is None
  assert plan_infer(model="tiny", target="cpu").batch == 1 and plan(model="tiny", target="cpu").batch == 8
