"""No import cycles in the library: no module imports, directly or through others, one that
imports it back (function-local imports included, since they only hide a cycle)."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Where each package's modules live: models/ is installed as jaxmem.models.
PACKAGES = {"jaxmem": ROOT / "jaxmem", "jaxmem.models": ROOT / "models"}


def _modules() -> dict[str, pathlib.Path]:
  out = {}
  for package, directory in PACKAGES.items():
    for path in directory.rglob("*.py"):
      parts = list(path.relative_to(directory).with_suffix("").parts)
      if parts[-1] == "__init__":
        parts = parts[:-1]
      out[".".join([package, *parts])] = path
  # jaxmem/models does not exist on disk: models/ stands in for it, found above.
  return out


def _imports(name: str, source: str, is_package: bool, modules: dict[str, pathlib.Path]) -> set[str]:
  """The library modules ``name`` imports, anywhere in its body: ``import a.b`` and
  ``from a import b`` name module ``a.b`` when it is one, else ``a`` (a package's attribute)."""
  out: set[str] = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      targets = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        anchor = name.split(".") if is_package else name.split(".")[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, *([base] if base else [])])
      targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    else:
      continue
    out |= {t for t in targets if t in modules and t != name}
  return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """Strongly connected components with more than one module (Tarjan's algorithm)."""
  index: dict[str, int] = {}
  low: dict[str, int] = {}
  stack: list[str] = []
  on_stack: set[str] = set()
  found: list[list[str]] = []

  def visit(v: str) -> None:
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return found


def _graph() -> dict[str, set[str]]:
  modules = _modules()
  return {name: _imports(name, path.read_text(), path.name == "__init__.py", modules) for name, path in modules.items()}


def test_the_graph_sees_the_library():
  graph = _graph()
  # The checker must be looking at the right thing: known edges are found, a relative one and
  # one nested in a block among them.
  assert "jaxmem.planning.sweep" in graph["jaxmem.planning.fit"]
  assert "jaxmem.models.config" in graph["jaxmem.models"]  # from .config import ...
  assert "jaxmem.hardware.targets" in graph["jaxmem.workload"]  # under `if TYPE_CHECKING:`
  assert len(graph) > 40


def test_function_local_imports_count():
  modules = _modules()
  source = "def f():\n  from jaxmem.planning import sweep\n  import jaxmem.errors\n"
  assert _imports("jaxmem.x", source, False, modules) == {"jaxmem.planning.sweep", "jaxmem.errors"}


def test_the_checker_finds_a_cycle():
  assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
  assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
  assert _cycles(_graph()) == []
