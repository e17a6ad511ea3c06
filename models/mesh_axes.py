"""Which mesh axes split what inside the models' ``shard_map``\\ s: one record, from the rules.

The model code names dimensions logically; the library's sharding rules
(``jaxmem.program.sharding``: every mesh axis and logical rule declared once, as MaxText's
``mesh_axes`` and ``logical_axis_rules``) say which mesh axes split each one, and
``jaxmem.program.sharding.mesh_axes(mesh)`` turns them into a :class:`MeshAxes` for one mesh.
Every ``shard_map`` in ``models/`` takes its PartitionSpecs and collective axis names from that
record (:meth:`MeshAxes.spec`, :meth:`MeshAxes.entry`) and runs through :func:`shard_map`,
which refuses a mesh the record was not built for. Nothing here falls back to axis names of its
own: a new axis that splits the batch (or the sequence, or the layers) is a change to the rules
plus the model code that uses it, and reaches every kernel.

Axes of size 1 are left out (they split nothing), as the rules' activation constraints leave
them out; an axis already used by an earlier dimension of the same spec is skipped, as
``logical_to_spec`` does (``expert`` splits both the batch and the experts).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import Mesh, PartitionSpec

# The dimensions a shard_map in models/ splits: the MeshAxes fields that :meth:`spec` reads.
DIMS = ("batch", "seq", "heads", "experts", "mlp", "layers")


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshAxes:
  """The mesh axes (of size > 1, in rule order) that split each dimension, for one mesh.

  Built by ``jaxmem.program.sharding.mesh_axes`` from the sharding rules; ``sizes`` is the
  mesh's (axis, size) pairs, so support checks need no :class:`~jax.sharding.Mesh`.
  """

  sizes: tuple[tuple[str, int], ...]
  batch: tuple[str, ...]  # the batch of tokens and activations
  seq: tuple[str, ...]  # positions of a sequence
  heads: tuple[str, ...]  # attention heads (query and kv)
  experts: tuple[str, ...]  # routed experts (expert parallelism)
  mlp: tuple[str, ...]  # an MLP's (or an expert's) hidden width
  layers: tuple[str, ...]  # the stacked layers (the pipeline stages: models/pipeline.py)

  def __post_init__(self):
    sizes = dict(self.sizes)
    for dim in DIMS:
      bad = [a for a in getattr(self, dim) if sizes.get(a, 1) < 2]
      if bad:
        raise ValueError(f"MeshAxes.{dim}: {bad} not axes of size > 1 of the mesh {sizes}")

  def ways(self, dim: str) -> int:
    """How many ways ``dim`` is split."""
    sizes = dict(self.sizes)
    return math.prod(sizes[a] for a in self._axes(dim))

  def entry(self, dim: str | None, used: tuple[str, ...] = ()) -> str | tuple[str, ...] | None:
    """``dim``'s PartitionSpec entry (also a collective's ``axis_name``): None when nothing
    splits it, the axis name for one axis, a tuple for several. Axes in ``used`` are skipped."""
    axes = tuple(a for a in self._axes(dim) if a not in used) if dim is not None else ()
    if not axes:
      return None
    return axes[0] if len(axes) == 1 else axes

  def spec(self, *dims: str | None) -> PartitionSpec:
    """The PartitionSpec of an array whose dimensions are ``dims`` (field names, or None for a
    dimension nothing splits), each mesh axis used once, by the first dimension that takes it."""
    used: list[str] = []
    entries = []
    for dim in dims:
      entry = self.entry(dim, tuple(used))
      used += [] if entry is None else [entry] if isinstance(entry, str) else list(entry)
      entries.append(entry)
    return PartitionSpec(*entries)

  def describe(self, dim: str) -> str:
    """``dim``'s axes with their sizes, for messages: ``tensor=4`` or ``data=2 x fsdp=4``."""
    sizes = dict(self.sizes)
    return " x ".join(f"{a}={sizes[a]}" for a in self._axes(dim)) or "no axis"

  def check(self, mesh: Mesh) -> None:
    """Refuses a mesh this record was not built for (a kernel would split by the wrong axes)."""
    if tuple(mesh.shape.items()) != tuple(self.sizes):
      raise ValueError(f"MeshAxes built for the mesh {dict(self.sizes)}, used with {dict(mesh.shape)}")

  def _axes(self, dim: str) -> tuple[str, ...]:
    if dim not in DIMS:
      raise ValueError(f"unknown MeshAxes dimension {dim!r}; valid: {', '.join(DIMS)}")
    return getattr(self, dim)


def require(axes: MeshAxes | None, mesh: Mesh, what: str) -> MeshAxes:
  """``axes``, checked against ``mesh``; a kernel given a mesh without its axes is an error
  (never a default set of axis names)."""
  if axes is None:
    raise TypeError(f"{what}: a mesh needs its MeshAxes (jaxmem.program.sharding.mesh_axes(mesh))")
  axes.check(mesh)
  return axes


def shard_map(
  fn: Callable[..., Any], *, mesh: Mesh, axes: MeshAxes, in_specs: Any, out_specs: Any, **kwargs: Any
) -> Callable[..., Any]:
  """``jax.shard_map`` over ``mesh`` for specs built from ``axes`` (checked against the mesh):
  the one way models/ enters a shard_map."""
  require(axes, mesh, getattr(fn, "__name__", "shard_map"))
  return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, **kwargs)
