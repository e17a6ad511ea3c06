"""The command line is a layer over the public library: every module of
jaxmem/cli imports only ``jaxmem``'s public names (``jaxmem.__all__``), ``jaxmem.render`` and the
CLI's own modules, and uses no other attribute of ``jaxmem``."""

from __future__ import annotations

import ast
import pathlib

import pytest

import jaxmem

CLI = pathlib.Path(jaxmem.__file__).parent / "cli"
ALLOWED_PACKAGES = ("jaxmem.render", "jaxmem.cli")
PUBLIC = set(jaxmem.__all__) | {"render", "cli"}


def _allowed_module(name: str) -> bool:
  return name == "jaxmem" or any(name == p or name.startswith(p + ".") for p in ALLOWED_PACKAGES)


def violations(source: str) -> list[str]:
  """What a module's source imports or uses of jaxmem beyond the public API."""
  out = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      out += [f"import {a.name}" for a in node.names if a.name.startswith("jaxmem") and not _allowed_module(a.name)]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("jaxmem"):
      if node.module == "jaxmem":
        out += [f"from jaxmem import {a.name}" for a in node.names if a.name not in PUBLIC]
      elif not _allowed_module(node.module):
        out.append(f"from {node.module} import ...")
    elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "jaxmem":
      if node.attr not in PUBLIC:
        out.append(f"jaxmem.{node.attr}")
  return out


@pytest.mark.parametrize("path", sorted(CLI.glob("*.py")), ids=lambda p: p.name)
def test_cli_module_uses_only_the_public_api(path):
  assert violations(path.read_text()) == []


def test_the_check_would_catch_an_internal_import():
  assert violations("from jaxmem.planning import sweep") == ["from jaxmem.planning import ..."]
  assert violations("import jaxmem.planning.fit") == ["import jaxmem.planning.fit"]
  assert violations("from jaxmem import run_tasks") == ["from jaxmem import run_tasks"]
  assert violations("import jaxmem\njaxmem.planning.plan(1)") == ["jaxmem.planning"]
  assert violations("import jaxmem\nfrom jaxmem.render import tables\nfrom jaxmem.cli import _common") == []
  assert violations("from jaxmem.models import attention_help") == ["from jaxmem.models import ..."]
