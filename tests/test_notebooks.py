"""The notebooks execute, top to bottom, in a kernel of this environment (tiny configurations)."""

from __future__ import annotations

import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_at_least_three():
  assert len(NOTEBOOKS) >= 3


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path, monkeypatch):
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  nb = nbformat.read(path, as_version=4)
  # "python3" is the kernel of the interpreter running the tests (ipykernel's native kernel);
  # figures are written into tmp_path, not the repository.
  NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
  errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"]
  assert not errors
