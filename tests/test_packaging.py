"""The installed package holds every package of the source tree: pyproject.toml lists them by
hand (models/ installs as jaxmem.models), so a new folder that is not listed would be missing from
a wheel while an editable install still finds it."""

from __future__ import annotations

import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed_in_pyproject():
  listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
  found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "jaxmem").rglob("__init__.py")}
  found |= {"jaxmem.models." + ".".join(p.parent.relative_to(ROOT / "models").parts)
            for p in (ROOT / "models").rglob("__init__.py") if p.parent != ROOT / "models"}
  found.add("jaxmem.models")
  assert found - listed == set()
