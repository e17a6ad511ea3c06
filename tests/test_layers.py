"""The library in layers: a module imports only from its own layer or the layers below it
(function-local imports and ``if TYPE_CHECKING:`` blocks counted, since they only hide an edge).

tests/test_imports.py checks that no module imports itself back through others; this checks the
direction between packages, so that a lower package never learns of a higher one and each layer
can be read, tested and changed knowing only what is below it.
"""

from __future__ import annotations

from test_imports import _graph, _modules

# Bottom to top. A layer is a list of packages or modules (a package takes its submodules).
# - leaf: modules that import nothing of jaxmem but other leaves: errors, records (and the composed
#   records they are built with), the registry class, versions, byte units, the mesh description, the one compile call, the kernel FLOP
#   counters' registry, the row cache, the parsers of every input (jaxmem.inputs) and the
#   compiler releases (jaxmem.compilers).
# - models: the Flax models; they import the leaves errors, registry, kernels (a model's kernel
#   registers its FLOP counter there) and composed (a model config is composed of its concerns as
#   a row is of its parts, by the same mechanism), nothing else of jaxmem.
# - hardware: the catalogue of targets (kinds, parts, capacity, peaks, host memory, runtime terms)
#   and what this machine can compile for.
# - hlo: reading HLO text. compiler.report and compiler.flops: reading what the compiler says
#   (its report, FLOPs). steptime: the step time, from the report's HLO on the hardware's
#   machine. compiler: compiling for a target (the one compile step, which forms the step time).
# - program: building the train step. resolve: a workload's names resolved into a plan.
# - maxtext: MaxText's own step, one package across three layers: its mapping table, step and
#   launch (emit) at program's, its planner at resolve's, its search at planning's.
# - buffers (what fills the memory), planning (sweeps, fit, scale, search, the closed forms),
#   inference, render (text and figures), then the public API (jaxmem/__init__) and the CLI.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("jaxmem._quiet", "jaxmem.errors", "jaxmem.composed", "jaxmem.records", "jaxmem.registry", "jaxmem.versions", "jaxmem.units",
     "jaxmem.mesh", "jaxmem.xla", "jaxmem.kernels", "jaxmem.cache", "jaxmem.compilers", "jaxmem.sizes", "jaxmem.events", "jaxmem.axes", "jaxmem.options",
     "jaxmem.inputs", "jaxmem.launch"),
    ("jaxmem.models",),
    ("jaxmem.hardware",),
    ("jaxmem.hlo",),
    ("jaxmem.compiler.report", "jaxmem.compiler.flops"),
    ("jaxmem.steptime",),
    ("jaxmem.compiler",),
    ("jaxmem.program", "jaxmem.maxtext"),
    ("jaxmem.workload", "jaxmem.resolve", "jaxmem.maxtext.plan"),
    ("jaxmem.buffers",),
    ("jaxmem.planning", "jaxmem.maxtext.search"),
    ("jaxmem.inference",),
    ("jaxmem.render",),
    ("jaxmem", "jaxmem.testing"),  # the package itself (the public API) and its pytest helpers
    ("jaxmem.cli", "jaxmem.__main__"),
)
# The only modules of jaxmem outside models/ that the models import (the dependency is one-way).
# jaxmem.composed: ModelConfig is composed of its concerns' records (attention, feed-forward,
# windows...) with the Composed rows are made with (flat constructor, reads and as_dict); it is a
# leaf, unlike jaxmem.records, which imports the axis declarations.
# jaxmem.inputs: the parsers of what comes from outside (config.json's fields, Hub ids), the
# same ones the CLI and the library's entry points parse with; a leaf, like errors.
MODELS_IMPORT = {"jaxmem.errors", "jaxmem.registry", "jaxmem.kernels", "jaxmem.composed", "jaxmem.inputs"}


def layer_of(module: str, layers=LAYERS) -> int | None:
  """The index of the layer that declares ``module`` (the longest declared prefix wins), or None."""
  best = None
  for i, names in enumerate(layers):
    for name in names:
      if module == name or module.startswith(name + ".") and name != "jaxmem":
        if best is None or len(name) > len(best[1]):
          best = (i, name)
  return None if best is None else best[0]


def back_edges(graph: dict[str, set[str]], layers=LAYERS) -> list[str]:
  """Every import from a lower layer to a higher one, as ``a -> b``."""
  out = []
  for a, targets in sorted(graph.items()):
    for b in sorted(targets):
      la, lb = layer_of(a, layers), layer_of(b, layers)
      if la is not None and lb is not None and lb > la:
        out.append(f"{a} -> {b}")
  return out


def test_every_module_has_a_layer():
  assert [m for m in sorted(_modules()) if layer_of(m) is None] == []


def test_the_checker_finds_a_back_edge():
  layers = (("p.low",), ("p.high",))
  graph = {"p.low.a": {"p.high.b"}, "p.high.b": {"p.low.c"}, "p.low.c": set()}
  assert back_edges(graph, layers) == ["p.low.a -> p.high.b"]
  assert layer_of("p.high.b.c", layers) == 1
  # The package itself is one layer and its submodules another: "jaxmem" is not their prefix.
  assert layer_of("jaxmem.planning.fit") == layer_of("jaxmem.planning")
  assert layer_of("jaxmem") != layer_of("jaxmem.errors")


def test_no_back_edges():
  assert back_edges(_graph()) == []


def test_the_models_import_only_their_declared_leaves():
  graph = _graph()
  used = {b for a, targets in graph.items() if a.startswith("jaxmem.models") for b in targets}
  assert {b for b in used if not b.startswith("jaxmem.models")} <= MODELS_IMPORT
