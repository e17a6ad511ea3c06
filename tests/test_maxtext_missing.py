"""The ``maxtext`` workload without MaxText needed: how it is written and normalised, and
``--maxtext`` where MaxText is not installed (one line, exit 2). MaxText's step itself is
tested in tests/test_maxtext.py, where MaxText installs."""

from __future__ import annotations

import sys

import pytest

from jaxmem import Workload
from jaxmem.cli import main
from jaxmem.errors import JaxmemError
from jaxmem.maxtext import step as mx


def test_written_as_a_string_or_a_list():
  a = Workload(maxtext="base.yml model_name=llama3-8b per_device_batch_size=1")
  b = Workload(maxtext=["base.yml", "model_name=llama3-8b", "per_device_batch_size=1"])
  assert a == b
  assert a.maxtext == ("base.yml", "model_name=llama3-8b", "per_device_batch_size=1")
  assert a.step == mx.SPEC
  assert mx.label(a.maxtext) == "maxtext:llama3-8b"


@pytest.mark.parametrize(("value", "says"), [
    ("model_name=llama3-8b", "starts with a MaxText config"),
    ("base.yml per_device_batch_size", "overrides are key=value"),
    ([], "needs a MaxText config"),
])
def test_bad_forms_are_one_line(value, says):
  with pytest.raises(JaxmemError, match=says) as e:
    Workload(maxtext=value)
  assert "\n" not in str(e.value)


def test_step_and_maxtext_are_not_both():
  with pytest.raises(JaxmemError, match="not both"):
    Workload(maxtext="base.yml", step="pkg.mod:make_step")


def test_without_maxtext_one_line_exit_2(monkeypatch, capsys):
  """Where MaxText is not installed (here made so: its import fails), --maxtext says how to get it."""
  monkeypatch.setitem(sys.modules, "maxtext", None)  # `import maxtext` raises ImportError
  assert main(["compare", "--maxtext", "base.yml", "per_device_batch_size=1", "--target", "cpu"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("jaxmem: error: --maxtext needs MaxText"), err
  assert "pip install 'jaxmem[maxtext]'" in err[0]


def test_maxtext_without_its_dependencies_names_the_missing_one(monkeypatch, capsys):
  """MaxText's wheel declares no dependencies, so `pip install maxtext` alone imports the package
  and fails on its modules: the line names the dependency and the extra that lists them."""
  import importlib
  import types

  real = importlib.import_module

  def fake(name, *a):
    if name == "maxtext":
      return types.ModuleType("maxtext")
    if name.startswith("maxtext."):
      raise ModuleNotFoundError("No module named 'omegaconf'", name="omegaconf")
    return real(name, *a)

  monkeypatch.setattr(mx.importlib, "import_module", fake)
  assert main(["compare", "--maxtext", "base.yml", "per_device_batch_size=1", "--target", "cpu"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "cannot import its dependency 'omegaconf'" in err[0], err
  assert "pip install 'jaxmem[maxtext]'" in err[0]
