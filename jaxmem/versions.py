"""The software behind a figure: jaxmem's version, and the compiler releases that produce figures.

A figure from XLA belongs to the compiler release that produced it: the same Llama 3 8B step on
v5p-8 reports 21.6 GiB of temp under libtpu 0.0.42.1 and 16.4 GiB under libtpu 0.0.52, with the
same peak (``shared/notes/maxtext-parity.md``). So every row carries the versions of what
compiled it, read without importing anything or starting a backend.

The compiler is the library a process *loads*, which need not be the installed package's: JAX
loads libtpu from ``TPU_LIBRARY_PATH`` where that names a file (as container images and clusters
set it; ``jax._src.cloud_tpu_init.get_tpu_library_path``, jax 0.10.2 and 0.12.0.1), else the
``libtpu`` package's ``libtpu.so``; and the CUDA plugin from the first ``jax_plugins.xla_cuda12``
(``xla_cuda13``) on ``sys.path``. Neither library carries its release (libtpu's text holds none;
its PJRT topology's ``platform_version`` gives a build date and changelist, not the release), so
a loaded library's version is that of the wheel it came from: the ``*.dist-info`` beside it whose
``RECORD`` lists that file at its size (:func:`loaded`). A library no wheel metadata claims has
no version (``None``, with the reason), and the row cache keys it by the file's SHA-256.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import platform as _platform
import re
from importlib import metadata
from pathlib import Path

__version__ = "0.1.0"

# What compiles for each platform: jax and jaxlib always; libtpu for TPU (the nightly's
# distribution name too); the CUDA PJRT plugin for GPU (CUDA 12 and 13 builds).
_COMMON = ("jax", "jaxlib")
_BY_PLATFORM = {
    "cpu": (),
    "tpu": ("libtpu", "libtpu-nightly"),
    "gpu": ("jax-cuda12-plugin", "jax-cuda13-plugin"),
}
# Everything else that changes a compiled program or how jaxmem reads it (the row cache's key,
# beside the loaded compilers).
_CACHE_PACKAGES = (*_COMMON, "flax", "optax")


@functools.cache
def _version(distribution: str) -> str | None:
  try:
    return metadata.version(distribution)
  except metadata.PackageNotFoundError:
    return None


def installed_version(distribution: str) -> str | None:
  """The installed version of a distribution (``libtpu``), or None."""
  return _version(distribution)


def _platform_key(name: str) -> str:
  # Devices say "cuda" or "rocm" where targets say "gpu".
  return "gpu" if name in ("gpu", "cuda", "rocm") else name


def compiler_versions(platform: str | None = None) -> dict[str, str | None]:
  """``{"jax": ..., "jaxlib": ...}`` plus the libtpu this process loads for ``"tpu"`` or the
  CUDA plugin for ``"gpu"`` (:func:`loaded`); with no platform, every compiler found here.
  Uninstalled ones are left out; a loaded library whose version cannot be read is ``None``
  (:func:`compiler_notes` says why)."""
  out = {n: v for n in _COMMON if (v := _version(n)) is not None}
  for lib in loaded(None if platform is None else _platform_key(platform)):
    out[lib.name] = lib.version
  return out


def compiler_notes(platform: str | None = None) -> tuple[str, ...]:
  """Why a loaded compiler's version is unknown (one line each), for a row's notes."""
  return tuple(lib.note for lib in loaded(None if platform is None else _platform_key(platform)) if lib.note)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Loaded:
  """A compiler library as this process would load it: ``name`` the distribution it belongs to
  (``libtpu``, ``jax-cuda12-plugin``), ``path`` the shared library, ``version`` its wheel's
  (``None`` where no wheel metadata claims it, ``reason`` saying why), ``chosen_by`` what chose
  that file (``TPU_LIBRARY_PATH``, the installed package, ``sys.path``)."""

  name: str
  path: str
  version: str | None
  chosen_by: str
  reason: str | None = None

  @property
  def note(self) -> str | None:
    if self.version is not None:
      return None
    return (f"{self.name}: {self.reason}; the row names no version for it and the row cache keys it by the "
            f"file's hash ({file_hash(self.path)[:12]})")

  def cache_key(self) -> str:
    """What the row cache keys it by: its version, else the file's SHA-256."""
    return self.version if self.version is not None else "sha256:" + file_hash(self.path)


def loaded(platform: str | None = None) -> tuple[Loaded, ...]:
  """The compiler libraries this process loads (or would) for ``platform`` (``"tpu"``: libtpu;
  ``"gpu"``: the CUDA plugins; ``None``: both), as their files are found now."""
  out: list[Loaded] = []
  if platform in (None, "tpu") and (lib := _loaded_libtpu()) is not None:
    out.append(lib)
  if platform in (None, "gpu"):
    out += [lib for module, name in _CUDA_PLUGINS if (lib := _loaded_plugin(module, name)) is not None]
  return tuple(out)


def _loaded_libtpu() -> Loaded | None:
  # As jax._src.cloud_tpu_init.get_tpu_library_path chooses it (TPU_LIBRARY_PATH where it names a
  # file, else the libtpu package's), found without importing libtpu (whose import sets the variable).
  installed = installed_libtpu()
  chosen = os.environ.get("TPU_LIBRARY_PATH")
  if chosen and os.path.isfile(chosen) and not (installed and os.path.samefile(chosen, installed)):
    return _identify(chosen, _BY_PLATFORM["tpu"], "TPU_LIBRARY_PATH")
  if installed is None:
    return None
  return _identify(installed, _BY_PLATFORM["tpu"], "the installed libtpu package")


def installed_libtpu() -> str | None:
  """The installed libtpu package's ``libtpu.so`` (found without importing it), or None."""
  spec = _find_spec("libtpu")
  path = os.path.join(os.path.dirname(spec.origin), "libtpu.so") if spec is not None and spec.origin else None
  return path if path and os.path.isfile(path) else None


# The CUDA plugin: the PJRT plugin module JAX discovers (jax_plugins.xla_cudaNN, from the
# jax-cudaNN-pjrt wheel, which the jax-cudaNN-plugin wheel pins to its own version) and its library.
_CUDA_PLUGINS = (("jax_plugins.xla_cuda12", "jax-cuda12-plugin"), ("jax_plugins.xla_cuda13", "jax-cuda13-plugin"))


def _loaded_plugin(module: str, name: str) -> Loaded | None:
  spec = _find_spec(module)
  if spec is None or not spec.submodule_search_locations:
    return None
  path = os.path.join(list(spec.submodule_search_locations)[0], "xla_cuda_plugin.so")
  if not os.path.isfile(path):
    return None
  lib = _identify(path, (name.replace("-plugin", "-pjrt"), name), "sys.path")
  return dataclasses.replace(lib, name=name)


def _find_spec(module: str) -> importlib.machinery.ModuleSpec | None:
  try:
    return importlib.util.find_spec(module)
  except (ImportError, ValueError):  # a parent package missing, or a module without a spec
    return None


def _identify(path: str, names: tuple[str, ...], chosen_by: str) -> Loaded:
  real = os.path.realpath(path)
  st = os.stat(real)
  owner = _owner(real, names, st.st_size, st.st_mtime_ns)
  if owner is None:
    return Loaded(name=names[0], path=real, version=None, chosen_by=chosen_by,
                  reason=f"{path} ({chosen_by}) is claimed by no wheel's metadata (no *.dist-info beside it lists "
                  "this file at its size)")
  return Loaded(name=owner[0], path=real, version=owner[1], chosen_by=chosen_by)


@functools.cache
def _owner(path: str, names: tuple[str, ...], size: int, mtime_ns: int) -> tuple[str, str] | None:
  """(distribution, version) of the wheel among ``names`` whose RECORD lists ``path`` at ``size``
  bytes, looked for in the folders above it (the wheel's root is its site-packages, or an unpacked
  wheel's folder); the size keeps a library replaced in place from passing as the wheel's."""
  wanted = {_normal(n) for n in names}
  folder = Path(path).parent
  for root in (folder.parent, folder.parent.parent):
    for dist in metadata.distributions(path=[str(root)]):
      if _normal(dist.metadata["Name"] or "") not in wanted:
        continue
      for f in dist.files or ():
        if os.path.realpath(root / f) == path and f.size in (None, size):
          return dist.metadata["Name"], dist.version
  return None


def _normal(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()


@functools.cache
def _hash(path: str, size: int, mtime_ns: int) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 22), b""):
      digest.update(block)
  return digest.hexdigest()


def file_hash(path: str) -> str:
  """The SHA-256 of a file (once per process for a file unchanged)."""
  st = os.stat(path)
  return _hash(os.path.realpath(path), st.st_size, st.st_mtime_ns)


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


def cache_versions(compilers: dict[str, str] | None = None) -> dict[str, str]:
  """Everything a cached row depends on: jaxmem's version and a fingerprint of its code
  (:func:`code_fingerprint`), Python, jax, jaxlib, flax, optax as installed, and the libtpu and
  CUDA plugin this process loads (:func:`loaded`: a version, else the file's hash), or
  ``compilers`` in their place (name -> version: the compiler a worker process of another
  release loads, :mod:`jaxmem.compilers`)."""
  out = {"jaxmem": __version__, "jaxmem_code": code_fingerprint(), "python": _platform.python_version()}
  out.update({n: v for n in _CACHE_PACKAGES if (v := _version(n)) is not None})
  if compilers is not None:
    out.update({f"compiler:{n}": v for n, v in compilers.items()})
  else:
    out.update({lib.name: lib.cache_key() for lib in loaded()})
  return out


def describe(versions: dict[str, str]) -> str:
  """``jax 0.12.0.1, libtpu 0.0.50.1`` for a table heading; jaxlib only where it differs from
  jax (it usually does not)."""
  shown = {k: v for k, v in versions.items() if not (k == "jaxlib" and v == versions.get("jax"))}
  return ", ".join(f"{k} {'unknown' if v is None else v}" for k, v in shown.items())


def merged(many: list[dict[str, str]]) -> dict[str, str]:
  """One dict from several rows' versions (a sweep over one target has one set); a compiler
  whose rows name several releases (a ``compiler`` sweep) has them all, ``0.0.50.1 / 0.0.52``."""
  seen: dict[str, list[str]] = {}
  for d in many:
    for k, v in (d or {}).items():
      if v not in seen.setdefault(k, []):
        seen[k].append(v)
  return {k: vs[0] if len(vs) == 1 else " / ".join("unknown" if v is None else v for v in vs) for k, vs in seen.items()}
