"""Compiling under another compiler release: the values of the ``compiler`` axis.

A figure belongs to the compiler release that produced it (:mod:`jaxmem.versions`), and a team
runs the release it pins, not the one installed beside jaxmem. ``compiler="libtpu==0.0.52"``
(``--compiler libtpu==0.0.50.1,libtpu==0.0.52``) compiles the same configuration under each
release, each in a worker process that loads it (:func:`jaxmem.planning.runner.run_tasks` sends
it the same portable task a ``jobs`` or Dask worker gets):

- ``libtpu==X``: the libtpu wheel, fetched once (``pip download --no-deps --only-binary :all:``)
  and unpacked under the row cache's folder (``compilers/libtpu-X``); the worker loads its
  ``libtpu.so`` through ``TPU_LIBRARY_PATH``, which JAX reads when it first makes a TPU topology
  (``jax._src.cloud_tpu_init.get_tpu_library_path``, jax 0.10.2 and 0.12.0.1). The installed
  release is not fetched: the worker points at the installed file.
- ``jax-cuda12-plugin==X`` (``jax-cuda13-plugin``): the plugin and its PJRT wheel
  (``jax-cudaNN-pjrt``, which the plugin pins to its own version), put first on the worker's
  ``sys.path`` before JAX discovers its plugins. jaxlib checks the plugin against its own
  version when it loads it, so a release far from the installed jaxlib may not load.
- ``jax==X`` (a whole JAX stack) is refused in one line: a worker runs this process's jax and
  jaxlib, and jaxmem reads both through their APIs, which a whole other stack may not keep.

A release that is not installable is refused before anything compiles (:func:`environment`, which
the axis's check calls while the sweep is planned), with pip's own reason, in one line.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jaxmem.cache import cache_dir
from jaxmem.errors import BadValue, CompilerUnavailable, JaxmemError
from jaxmem.versions import installed_libtpu, installed_version

# The compilers a release of which may be asked for: the platform each compiles for, and the
# wheels that make it (the first names the release).
_WHEELS: dict[str, tuple[str, tuple[str, ...]]] = {
    "libtpu": ("tpu", ("libtpu",)),
    "jax-cuda12-plugin": ("gpu", ("jax-cuda12-plugin", "jax-cuda12-pjrt")),
    "jax-cuda13-plugin": ("gpu", ("jax-cuda13-plugin", "jax-cuda13-pjrt")),
}
_STACKS = ("jax", "jaxlib")
_SPEC = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([A-Za-z0-9][A-Za-z0-9.+!_-]*)\s*$")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CompilerSpec:
  """One compiler release: ``name`` (``libtpu``, ``jax-cuda12-plugin``) and ``version``."""

  name: str
  version: str

  @property
  def platform(self) -> str:
    """The platform it compiles for (``tpu``, ``gpu``)."""
    return _WHEELS[self.name][0]

  @property
  def text(self) -> str:
    return f"{self.name}=={self.version}"


def parse_spec(text: str) -> CompilerSpec:
  """``"libtpu==0.0.52"`` as a :class:`CompilerSpec`; anything else is one line."""
  m = _SPEC.match(str(text))
  if m is None:
    raise JaxmemError(f"`compiler` takes NAME==VERSION, e.g. libtpu==0.0.52 (got {text!r})")
  name = re.sub(r"[-_.]+", "-", m.group(1)).lower()
  if name in _STACKS:
    raise JaxmemError(
        f"`compiler` {text.strip()}: whole jax stacks are not swept (a worker runs this process's jax "
        f"{installed_version('jax')}); give the compiler's release: {', '.join(f'{n}==X' for n in _WHEELS)}"
    )
  if name not in _WHEELS:
    raise JaxmemError(f"`compiler` {text.strip()}: not a compiler jaxmem can sweep; give one of "
                      f"{', '.join(f'{n}==X' for n in _WHEELS)}")
  return CompilerSpec(name=name, version=m.group(2))


def parse(v: Any, name: str = "compiler") -> tuple[str, ...]:
  """The axis's values (``"libtpu==0.0.50.1,libtpu==0.0.52"``, a list, ``None``) as spec
  texts, each checked for form and once."""
  if v is None:
    return ()
  if not isinstance(v, (str, list, tuple)) or not all(isinstance(p, str) for p in ([v] if isinstance(v, str) else v)):
    raise BadValue(f"`{name}`", "compiler releases NAME==VERSION (a comma list or a list of them)", v)
  parts = [v] if isinstance(v, str) else list(v)
  return tuple(dict.fromkeys(parse_spec(n).text for p in parts for n in str(p).split(",") if n.strip()))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Environment:
  """What a worker process needs to load one compiler release: environment variables to set and
  folders to put first on ``sys.path`` (and ``PYTHONPATH``, for the processes it starts)."""

  spec: CompilerSpec
  variables: tuple[tuple[str, str], ...] = ()
  path: tuple[str, ...] = ()

  def apply(self) -> None:
    """Makes this process load the release (a worker, before JAX starts a backend)."""
    for k, v in self.variables:
      os.environ[k] = v
    if self.path:
      sys.path[:0] = list(self.path)
      os.environ["PYTHONPATH"] = os.pathsep.join([*self.path, *filter(None, [os.environ.get("PYTHONPATH")])])


# How a wheel is fetched into a folder: (requirement, folder) -> None, raising CompilerUnavailable.
Fetch = Callable[[str, Path], None]


def pip_download(requirement: str, folder: Path) -> None:
  """``pip download --no-deps --only-binary :all: REQUIREMENT -d FOLDER`` with this interpreter
  (a wheel for it and this machine); pip's reason for a failure, in one line."""
  cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--quiet", requirement,
         "-d", str(folder)]
  try:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL)
  except (OSError, subprocess.SubprocessError) as e:
    raise CompilerUnavailable(f"`compiler` {requirement}: cannot run pip to fetch it ({e})") from None
  if done.returncode != 0:
    raise CompilerUnavailable(f"`compiler` {requirement} is not installable here: {_pip_reason(done.stderr)}")


def _pip_reason(stderr: str) -> str:
  lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
  errors = [ln.removeprefix("ERROR: ") for ln in lines if ln.startswith("ERROR:")]
  reason = (errors or lines or ["pip failed"])[0]
  # pip lists every release there is ("(from versions: 0.0.1, ..., 0.0.52)"): the newest few say enough.
  m = re.search(r"\(from versions: ([^)]*)\)", reason)
  if m and len(listed := m.group(1).split(", ")) > 6:
    reason = reason.replace(m.group(0), f"(the newest: {', '.join(listed[-6:])})")
  return reason


# The fetcher in use, looked up when a release is first needed (tests replace it and never download).
FETCH: Fetch = pip_download


def compilers_dir() -> Path:
  """Where fetched compiler releases are unpacked: ``compilers/`` in the row cache's folder."""
  return cache_dir() / "compilers"


def environment(text: str) -> Environment:
  """The environment a worker needs for the release ``text`` (``libtpu==0.0.52``), fetching it
  first where it is neither installed here nor already fetched. Refuses one that cannot be had
  (:class:`jaxmem.errors.CompilerUnavailable`) in one line."""
  return _environment(parse_spec(text), str(compilers_dir()))


@functools.cache
def _environment(spec: CompilerSpec, root: str) -> Environment:
  if spec.platform == "tpu":
    path = installed_libtpu() if installed_version("libtpu") == spec.version else None
    if path is None:
      path = str(unpacked(spec, Path(root)) / "libtpu" / "libtpu.so")
      if not os.path.isfile(path):
        raise CompilerUnavailable(f"`compiler` {spec.text}: its wheel has no libtpu/libtpu.so")
    return Environment(spec=spec, variables=(("TPU_LIBRARY_PATH", path),))
  if installed_version(spec.name) == spec.version:
    return Environment(spec=spec)  # the installed plugin, as sys.path finds it
  return Environment(spec=spec, path=(str(unpacked(spec, Path(root))),))


def unpacked(spec: CompilerSpec, root: Path) -> Path:
  """The folder holding ``spec``'s wheels unpacked (their packages and ``*.dist-info``), fetched
  and unpacked on first use; a folder is complete or absent (unpacked beside, then renamed)."""
  final = root / f"{spec.name}-{spec.version}"
  if final.is_dir():
    return final
  root.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=root, prefix=f".{spec.name}-{spec.version}-") as tmp:
    wheels, into = Path(tmp) / "wheels", Path(tmp) / "unpacked"
    wheels.mkdir()
    for wheel in _WHEELS[spec.name][1]:
      FETCH(f"{wheel}=={spec.version}", wheels)
    found = sorted(wheels.glob("*.whl"))
    if not found:
      raise CompilerUnavailable(f"`compiler` {spec.text}: no wheel was fetched")
    for w in found:
      _unzip(w, into)
    try:
      os.replace(into, final)
    except OSError:  # another process unpacked it meanwhile
      if not final.is_dir():
        raise
  return final


def _unzip(wheel: Path, into: Path) -> None:
  with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
      out = Path(z.extract(info, into))
      mode = info.external_attr >> 16
      if mode & 0o777:
        out.chmod(mode & 0o777)


def check(text: str, platform: str) -> None:
  """One line where the release ``text`` is not for ``platform`` or cannot be had here."""
  spec = parse_spec(text)
  if spec.platform != platform:
    raise JaxmemError(f"`compiler` {spec.text} compiles for {spec.platform} targets; this target is {platform}")
  environment(text)


def forget() -> None:
  """Forgets the environments found in this process (a test that changes the cache folder)."""
  _environment.cache_clear()


def worker_died(text: str, *, returned: int = 0, total: int = 1) -> CompilerUnavailable:
  """The one line for a worker process of the release ``text`` that died (a crash in the library,
  or the process killed) after returning ``returned`` of its ``total`` results. A worker that dies
  before its first result most often could not load the release: a libtpu older than this jax's
  PJRT interface can crash the process as it compiles (libtpu 0.0.20 under jax 0.12.0.1, a
  segmentation fault in ``PjRtTopology::GetDefaultLayout``; docs/versions.md)."""
  spec = parse_spec(text)
  if returned == 0:
    return CompilerUnavailable(
        f"`compiler` {spec.text}: the worker process that loads it died before it compiled anything (the library "
        f"crashed or the process was killed); a release older than jax {installed_version('jax')}'s plugin interface "
        "can crash as it loads (docs/versions.md says which releases load)")
  return CompilerUnavailable(
      f"`compiler` {spec.text}: a worker process compiling under it died after {returned} of {total} results (the "
      "library crashed or the process was killed, e.g. for host memory)")


def versions_of(text: str) -> dict[str, str]:
  """The compiler versions a worker of release ``text`` loads, for the row cache's key."""
  spec = parse_spec(text)
  return {spec.name: spec.version}
