"""A disk cache of sweep rows, so a repeated or interrupted sweep recompiles nothing it finished.

Rows are stored one JSON file per configuration under ``$JAXMEM_CACHE_DIR``, else
``$XDG_CACHE_HOME/jaxmem``, else ``~/.cache/jaxmem``. The key hashes everything that changes
the compiled program or its reading: the whole workload (the model's full config, batch,
sequence, target and slices, mesh, remat policy, optimizer, dtypes), a fingerprint of jaxmem's
own code and its models' (:func:`jaxmem.versions.code_fingerprint`: any edit to a ``.py`` file
of the package gives new rows, so two checkouts share rows only when their code is the same),
the versions of Python, jax, jaxlib, flax and optax, those of the libtpu and CUDA plugin the
process loads (``TPU_LIBRARY_PATH`` followed: :func:`jaxmem.versions.loaded`; a library of unknown
version by its file's hash), and the environment variables in
:data:`KEYED_ENVIRONMENT` that are set. A row that failed (out of memory, say) is cached too:
the compiler's answer does not change on a retry.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jaxmem.events import notice
from jaxmem.inputs import env_text
from jaxmem.versions import cache_versions


def cache_dir() -> Path:
  if d := env_text("JAXMEM_CACHE_DIR"):
    return Path(d)
  base = env_text("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return Path(base) / "jaxmem"


# Variables that change a row without changing the workload: the compilers' flags change the
# program, and the allocator's fraction changes a GPU's (or an attached device's) capacity_bytes
# and so `fits`.
KEYED_ENVIRONMENT = ("XLA_FLAGS", "LIBTPU_INIT_ARGS", "XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")


def key(parts: dict[str, Any], *, compilers: dict[str, str] | None = None) -> str:
  """A stable hash of a configuration's description, the versions it compiles with (the loaded
  compilers', or ``compilers``: a worker's of another release) and the keyed environment
  variables that are set."""
  env = {name: os.environ[name] for name in KEYED_ENVIRONMENT if name in os.environ}
  blob = json.dumps({"config": parts, "versions": cache_versions(compilers), "environment": env}, sort_keys=True,
                    default=str)
  return hashlib.sha256(blob.encode()).hexdigest()[:32]


class RowCache:
  """Rows by key on disk. ``enabled=False`` makes every lookup miss and every store a no-op."""

  def __init__(self, directory: Path | None = None, *, enabled: bool = True):
    self.directory = (directory or cache_dir()) / "rows"
    self.enabled = enabled
    self.hits = 0

  def get(self, k: str | None, *, check: Callable[[dict[str, Any]], bool] | None = None) -> dict[str, Any] | None:
    """The row stored under ``k``, or None. ``check`` says whether a stored dict reads back as
    a row; one that does not (nor a non-dict) is a miss, with a notice naming the file."""
    if not self.enabled or k is None:  # None: a configuration that is never cached
      return None
    path = self.directory / f"{k}.json"
    try:
      row = json.loads(path.read_text())
    except (OSError, ValueError):  # absent, or a torn file from a killed run: recompute
      return None
    if not isinstance(row, dict) or (check is not None and not check(row)):
      notice(f"cache entry {path} does not read back as a row; recompiling it")
      return None
    self.hits += 1
    return row

  def put(self, k: str | None, row: dict[str, Any]) -> None:
    if not self.enabled or k is None:
      return
    try:
      self.directory.mkdir(parents=True, exist_ok=True)
      # Write then rename, so a sweep killed mid-write leaves no half a row behind.
      fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
      with os.fdopen(fd, "w") as f:
        json.dump(row, f)
      os.replace(tmp, self.directory / f"{k}.json")
    except OSError:
      pass  # a read-only or full cache directory must not fail the sweep
