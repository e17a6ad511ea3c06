"""A script of ``benchmarks/`` (not a package) imported as a module by the tests that check it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load(name: str) -> ModuleType:
  """``benchmarks/NAME.py`` imported as module ``name``, registered in ``sys.modules`` first: its
  dataclasses look their module up there while the module runs."""
  spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  return module
