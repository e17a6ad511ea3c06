"""The software behind a figure: jaxmem's version, and the compiler releases that produce figures.

A figure from XLA belongs to the compiler release that produced it: the same Llama 3 8B step on
v5p-8 reports 21.6 GiB of temp under libtpu 0.0.42.1 and 16.4 GiB under libtpu 0.0.52, with the
same peak (``shared/notes/maxtext-parity.md``). So every row carries the versions of what
compiled it, read from the installed distributions (``importlib.metadata``), never imported: a
version is known without starting a backend.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import platform as _platform
from importlib import metadata

__version__ = "0.1.0"

# What compiles for each platform: jax and jaxlib always; libtpu for TPU (the nightly's
# distribution name too); the CUDA PJRT plugin for GPU (CUDA 12 and 13 builds).
_COMMON = ("jax", "jaxlib")
_BY_PLATFORM = {
    "cpu": (),
    "tpu": ("libtpu", "libtpu-nightly"),
    "gpu": ("jax-cuda12-plugin", "jax-cuda13-plugin"),
}
# Everything that changes a compiled program or how jaxmem reads it (the row cache's key).
_CACHE_PACKAGES = (*_COMMON, "flax", "optax", *_BY_PLATFORM["tpu"], *_BY_PLATFORM["gpu"])


@functools.cache
def _version(distribution: str) -> str | None:
  try:
    return metadata.version(distribution)
  except metadata.PackageNotFoundError:
    return None


def _platform_key(name: str) -> str:
  # Devices say "cuda" or "rocm" where targets say "gpu".
  return "gpu" if name in ("gpu", "cuda", "rocm") else name


def compiler_versions(platform: str | None = None) -> dict[str, str]:
  """``{"jax": ..., "jaxlib": ...}`` plus ``libtpu`` for ``"tpu"`` or the CUDA plugin for
  ``"gpu"``; with no platform, every compiler installed here. Uninstalled ones are left out."""
  if platform is None:
    names = (*_COMMON, *_BY_PLATFORM["tpu"], *_BY_PLATFORM["gpu"])
  else:
    names = (*_COMMON, *_BY_PLATFORM.get(_platform_key(platform), ()))
  return {n: v for n in names if (v := _version(n)) is not None}


def _package_dirs() -> list[str]:
  # jaxmem's own directory and jaxmem.models' (models/ at the top of a checkout, mapped by
  # pyproject's package-dir; inside jaxmem/ in a wheel), found without importing either.
  dirs = []
  for name in ("jaxmem", "jaxmem.models"):
    spec = importlib.util.find_spec(name)
    for d in (spec.submodule_search_locations or []) if spec else []:
      dirs.append(os.path.realpath(d))
  return dirs


@functools.cache
def code_fingerprint() -> str:
  """A hash of the source of the jaxmem that runs: every ``.py`` file under the jaxmem package
  and jaxmem.models, by path relative to its package and content. Two checkouts with the same
  code share cached rows; any edit (a comment included) gives new ones. Computed once per
  process: reading ~100 small files takes milliseconds."""
  files: set[tuple[str, str]] = set()
  for root in _package_dirs():
    for d, subdirs, names in os.walk(root):
      subdirs[:] = sorted(s for s in subdirs if s != "__pycache__")
      files.update((os.path.join(d, n), os.path.relpath(os.path.join(d, n), root)) for n in names if n.endswith(".py"))
  digest = hashlib.sha256()
  for path, rel in sorted(files, key=lambda f: (f[1], f[0])):
    try:
      with open(path, "rb") as fh:
        digest.update(rel.encode() + b"\0" + fh.read() + b"\0")
    except OSError:  # a file removed while walking: the rest still decide the key
      continue
  return digest.hexdigest()[:32]


def cache_versions() -> dict[str, str]:
  """Everything a cached row depends on: jaxmem's version and a fingerprint of its code
  (:func:`code_fingerprint`), Python, jax, jaxlib, flax, optax, libtpu and the CUDA plugin, as
  installed."""
  out = {"jaxmem": __version__, "jaxmem_code": code_fingerprint(), "python": _platform.python_version()}
  out.update({n: v for n in _CACHE_PACKAGES if (v := _version(n)) is not None})
  return out


def describe(versions: dict[str, str]) -> str:
  """``jax 0.12.0.1, libtpu 0.0.50.1`` for a table heading; jaxlib only where it differs from
  jax (it usually does not)."""
  shown = {k: v for k, v in versions.items() if not (k == "jaxlib" and v == versions.get("jax"))}
  return ", ".join(f"{k} {v}" for k, v in shown.items())


def merged(many: list[dict[str, str]]) -> dict[str, str]:
  """One dict from several rows' versions (a sweep over one target has one set)."""
  out: dict[str, str] = {}
  for d in many:
    for k, v in (d or {}).items():
      out.setdefault(k, v)
  return out
