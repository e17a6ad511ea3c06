"""The notebooks execute, top to bottom, on tiny configurations, in a kernel of this environment.

Each notebook has one code cell tagged ``parameters`` (papermill's convention) that names what
it runs: model, target, shapes, meshes. The notebooks themselves show real presets; the test
inserts a cell after that one which sets tiny ones (``OVERRIDES``), so the same cells run in
seconds. All notebooks share one kernel (starting a kernel and importing jax, libtpu and the CUDA
plugin costs more than a tiny notebook's compiles); before each one the kernel's namespace is
reset, so a notebook that leans on another's imports or variables still fails.
"""

from __future__ import annotations

import ast
import json
import os
import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))

# What each notebook runs on here: tiny models, short sequences, few configurations. Every
# notebook takes TPU targets instead of its H100s (02_planning's "GPU" side is a second TPU
# slice with the same mesh shapes): a tiny program compiles in about 1 s for a TPU and 6-10 s for
# a GPU, the cells are the same, and the GPU compiler has tests of its own.
OVERRIDES: dict[str, dict[str, object]] = {
    "01_tour": dict(MODEL="tiny", TARGET="tpu:v5e-1", BATCH=2, SEQ=32, REMATS="none,full", OPTIMIZERS="sgd,adamw"),
    "02_planning": dict(
        # remat none: one compile per point, no baseline beside it; one mesh per target (the
        # cells loop over what is given).
        MODEL="tiny", REMAT="none", BATCH=8, SEQ=32, TPU_TARGET="tpu:v5e-4", TPU_MESHES=["fsdp=4"],
        GPU_TARGET="tpu:v5p-8", GPU_MESHES=["fsdp=2,tensor=2"],
    ),
    "03_inference": dict(
        MODEL="tiny", TARGET="tpu:v5e-1", WEIGHTS="bf16,int4", CONTEXTS=[64, 128], BATCH=2, TRAIN_BATCH=2, TRAIN_SEQ=32,
    ),
}
CELL_TIMEOUT_S = 300  # per cell; a hung kernel fails instead of stalling the suite


def _parameters(nb) -> tuple[int, set[str]]:
  """(index of the cell tagged ``parameters``, the names it assigns)."""
  tagged = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "parameters" in c.metadata.get("tags", [])]
  assert len(tagged) == 1, f"want one code cell tagged parameters, found {len(tagged)}"
  tree = ast.parse(nb.cells[tagged[0]].source)
  names = {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)}
  return tagged[0], names


def _loaded_names(source: str) -> set[str]:
  return {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def test_there_are_at_least_three():
  assert len(NOTEBOOKS) >= 3
  assert {p.stem for p in NOTEBOOKS} == set(OVERRIDES), "give every notebook its tiny overrides"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_parameters_cell_names_what_the_notebook_uses(path):
  nb = nbformat.read(path, as_version=4)
  index, names = _parameters(nb)
  assert set(OVERRIDES[path.stem]) <= names, "an override the parameters cell does not define changes nothing"
  later = set().union(*(_loaded_names(c.source) for c in nb.cells[index + 1:] if c.cell_type == "code"))
  assert names <= later, f"parameters no later cell uses: {sorted(names - later)}"
  reassigned = {n for c in nb.cells[index + 1:] if c.cell_type == "code" for n in _assigned(c.source)} & names
  assert not reassigned, f"later cells overwrite parameters: {sorted(reassigned)}"


def _assigned(source: str) -> set[str]:
  return {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
  """One started kernel for every notebook, working in a temporary directory (their figures
  land there, not in the repository)."""
  # "python3" is the kernel of the interpreter running the tests (ipykernel's native kernel).
  workdir = tmp_path_factory.mktemp("notebooks")
  client = NotebookClient(nbformat.v4.new_notebook(), timeout=CELL_TIMEOUT_S, kernel_name="python3",
                          resources={"metadata": {"path": str(workdir)}})
  # The CLI's process model: the CPU backend only, TPU and GPU compilers used compile-only.
  with client.setup_kernel(env={**os.environ, "JAX_PLATFORMS": "cpu"}):
    yield client


# One notebook runs in the default suite; the other two (their compiles are each half a minute on
# two cores) with the slow tests (benchmarks/slow_tests.sh). Their parameters are checked above.
RUN_BY_DEFAULT = ("03_inference",)


@pytest.mark.parametrize(
    "path", [p if p.stem in RUN_BY_DEFAULT else pytest.param(p, marks=pytest.mark.slow) for p in NOTEBOOKS],
    ids=lambda p: p.stem,
)
def test_notebook_runs_on_tiny_parameters(path, kernel):
  client = kernel
  nb = nbformat.read(path, as_version=4)
  index, _ = _parameters(nb)
  overrides = OVERRIDES[path.stem]
  injected = nbformat.v4.new_code_cell("\n".join(f"{k} = {v!r}" for k, v in overrides.items()))
  injected.metadata["tags"] = ["injected-parameters"]
  check = nbformat.v4.new_code_cell(
      f"import json as _json; print('overrides ran:', _json.dumps({{k: globals()[k] for k in {list(overrides)!r}}}))"
  )
  nb.cells = [nbformat.v4.new_code_cell("%reset -f"), *nb.cells[: index + 1], injected, *nb.cells[index + 1:], check]
  client.nb = nb
  for i, cell in enumerate(nb.cells):
    client.execute_cell(cell, i)  # raises CellExecutionError, with the cell and traceback, on an error
  # The overrides were what ran: no later cell put other values back.
  # (Found by its prefix: a stream may reach the cell in several pieces, or with a late line of
  # an earlier cell's.)
  stdout = "".join(o["text"] for o in nb.cells[-1].outputs if o.get("name") == "stdout")
  (ran,) = [line.removeprefix("overrides ran: ") for line in stdout.splitlines() if line.startswith("overrides ran: ")]
  assert json.loads(ran) == json.loads(json.dumps(overrides))
  errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"]
  assert not errors
