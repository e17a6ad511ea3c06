"""The compiler versions behind every figure (jaxmem.versions), and the one display-unit chooser."""

from __future__ import annotations

import json
import platform
from importlib import metadata

import jax
import pytest

from jaxmem import versions
from jaxmem.cache import key
from jaxmem.render.units import GiB, KiB, MiB, unit_for


def _installed(name):
  try:
    return metadata.version(name)
  except metadata.PackageNotFoundError:
    return None


def test_cpu_figures_name_jax_and_jaxlib_only():
  v = versions.compiler_versions("cpu")
  assert v == {"jax": metadata.version("jax"), "jaxlib": metadata.version("jaxlib")}
  assert v["jax"] == jax.__version__


@pytest.mark.parametrize("platform_name,package", [("tpu", "libtpu"), ("gpu", "jax-cuda12-plugin"), ("cuda", "jax-cuda12-plugin")])
def test_accelerator_figures_name_their_compiler(platform_name, package):
  v = versions.compiler_versions(platform_name)
  assert v.get(package) == _installed(package)
  assert set(v) >= {"jax", "jaxlib"}
  other = "jax-cuda12-plugin" if package == "libtpu" else "libtpu"
  assert other not in v  # only the compiler of this platform


def test_describe_leaves_out_a_jaxlib_equal_to_jax():
  assert versions.describe({"jax": "0.12.0.1", "jaxlib": "0.12.0.1", "libtpu": "0.0.50.1"}) == "jax 0.12.0.1, libtpu 0.0.50.1"
  assert versions.describe({"jax": "0.12.1", "jaxlib": "0.12.0"}) == "jax 0.12.1, jaxlib 0.12.0"


def test_cache_key_includes_the_python_version(monkeypatch):
  assert versions.cache_versions()["python"] == platform.python_version()
  before = key({"model": "tiny"})
  monkeypatch.setattr(versions._platform, "python_version", lambda: "3.99.0")
  assert key({"model": "tiny"}) != before


def test_rows_envelope_and_heading_carry_the_versions(capsys):
  from jaxmem.cli import main

  argv = ["compare", "--model", "tiny", "--batch", "2", "--seq", "16", "--remat", "none", "--target", "cpu"]
  assert main([*argv, "--format", "json"]) == 0
  doc = json.loads(capsys.readouterr().out)
  assert doc["versions"] == versions.compiler_versions("cpu")
  assert all(r["versions"] == doc["versions"] for r in doc["rows"])
  assert main(argv) == 0
  heading = capsys.readouterr().out.splitlines()[0]
  assert heading.endswith(f"per device · {versions.describe(doc['versions'])}")


@pytest.mark.parametrize(
    "values,smallest,unit",
    [
        ([0.46 * GiB, 3], "MiB", "GiB"),  # a tenth of a GiB is shown in GiB
        ([0.09 * GiB], "MiB", "MiB"),
        ([5 * KiB, None], "MiB", "MiB"),  # never below the smallest unit asked for
        ([5 * KiB], "KiB", "KiB"),
        ([50], "B", "B"),
        ([None], "KiB", "KiB"),
    ],
)
def test_unit_for(values, smallest, unit):
  assert unit_for(values, smallest=smallest).name == unit


def test_unit_formats_figures():
  u = unit_for([3 * MiB])
  assert (u.name, u(1536 * KiB), u(None)) == ("MiB", "1.50", "-")
