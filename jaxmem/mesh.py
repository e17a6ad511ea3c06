"""The mesh description: the mesh axes jaxmem knows, a mesh written ``data=2,fsdp=4`` and its
``(axis, size)`` pairs, and the key paths of a pytree as shardings and argument names spell them.

A leaf: every layer may use it. What each axis shards is :mod:`jaxmem.program.sharding`'s.
"""

from __future__ import annotations

import math

from jaxmem.errors import JaxmemError

MESH_AXES = ("data", "stage", "fsdp", "tensor", "sequence", "context", "expert")
MeshSpec = tuple[tuple[str, int], ...]


def parse_mesh(spec: str) -> MeshSpec:
  """``"data=2,fsdp=4"`` to ``(("data", 2), ("fsdp", 4))``."""
  axes: list[tuple[str, int]] = []
  for part in spec.split(","):
    part = part.strip()
    if not part:
      continue
    name, eq, size = part.partition("=")
    name = name.strip()
    if not eq or not size.strip().isdigit():
      raise JaxmemError(f"bad mesh {spec!r}: write axis=size pairs separated by commas, e.g. data=2,fsdp=4")
    if name not in MESH_AXES:
      raise JaxmemError(f"bad mesh {spec!r}: unknown axis {name!r}; valid axes: {', '.join(MESH_AXES)}")
    if any(name == a for a, _ in axes):
      raise JaxmemError(f"bad mesh {spec!r}: axis {name!r} given twice")
    n = int(size)
    if n < 1:
      raise JaxmemError(f"bad mesh {spec!r}: axis {name} has size 0; sizes must be at least 1")
    axes.append((name, n))
  if not axes:
    raise JaxmemError(f"bad mesh {spec!r}: give at least one axis, e.g. data=4")
  return tuple(axes)


def format_mesh(mesh: MeshSpec) -> str:
  return ",".join(f"{a}={s}" for a, s in mesh)


def default_mesh(num_devices: int) -> MeshSpec:
  """FSDP over every device, MaxText's default (``ici_fsdp_parallelism=-1``)."""
  return (("fsdp", num_devices),)


def mesh_size(mesh: MeshSpec) -> int:
  return math.prod(s for _, s in mesh)


def path_keys(path) -> tuple[str, ...]:
  """A pytree key path as plain strings: dict keys, attribute names and sequence indices."""
  out = []
  for k in path:
    for attr in ("key", "name", "idx"):
      if hasattr(k, attr):
        out.append(str(getattr(k, attr)))
        break
    else:
      out.append(str(k))
  return tuple(out)
