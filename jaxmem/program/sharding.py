"""Meshes and logical-axis sharding rules.

A mesh is written ``data=2,fsdp=4``. Mesh axes and what they shard:

- ``data``: the batch (data parallel; parameters and optimizer state replicated).
- ``fsdp``: the batch *and* every weight's ``embed`` dimension, so parameters, gradients and
  optimizer state are divided over it (FSDP / ZeRO-3, Rajbhandari et al. 2020).
- ``tensor``: attention heads, MLP width and vocabulary (Megatron tensor parallelism,
  Shoeybi et al. 2019).
- ``sequence``: the sequence dimension of activations only (for long context); every device
  still holds all of the weights, their gradients and optimizer state.
- ``context``: context parallelism as MaxText's rules have it: the sequence dimension of
  activations (after ``sequence``) *and* every weight's ``embed`` dimension (after ``fsdp``), so
  ``context=8`` alone divides parameters, gradients and optimizer state by 8 as ``fsdp=8`` does,
  while the batch is not split (one sequence can span the devices). MaxText's
  ``logical_axis_rules`` shard ``embed`` over ``fsdp``, ``context`` and ``expert`` together and
  ``activation_length`` over ``sequence`` and ``context`` (``src/MaxText/configs/base.yml``).
  Attention over a context-sharded sequence gathers keys and values across the axis (GSPMD,
  under the ``chunked`` and ``dot`` kernels); the fused kernels refuse it (their
  ``mesh_problem``).
- ``stage``: pipeline parallelism (GPipe, Huang et al. 2019; MaxText's ``stage`` axis): the
  stacked layers are split over it (``layers -> stage``, MaxText's rule), so each device holds
  ``1/stage`` of the decoder layers' parameters, gradients and optimizer state, and runs its
  layers on one pipeline microbatch at a time (``jaxmem.models.pipeline``). It does not split
  the batch, and the embeddings and the output head (no ``layers`` dimension) are held whole
  by every stage, as under MaxText's rules.
- ``expert``: the routed experts of a mixture-of-experts model (expert parallelism, GShard,
  Lepikhin et al. 2020): expert weights, their gradients and optimizer state are divided over
  it, and it also splits the batch (after ``data`` and ``fsdp``, as MaxText's
  ``activation_batch`` rule does), so outside the experts it acts as data parallelism; tokens
  reach their experts' devices by all-to-all. On a dense model it is data parallelism.

Megatron's sequence parallelism (Korthikanti et al. 2022, section 4.2.2; ``sequence_parallel``
with a ``tensor`` axis) splits the residual stream, the norms and the masks on it (the logical
``norm_seq``, MaxText's ``activation_norm_length``) along the sequence over ``tensor`` as well:
:func:`activation_rules` gives the rules with it, and the compiler then all-gathers before each
column-parallel matmul and reduce-scatters after each row-parallel one, where plain tensor
parallelism all-reduces.

Model code names dimensions logically (``jaxmem.models.LOGICAL_AXES``); the rules below map those
names to mesh axes, separately for weights and for activations, as MaxText's
``logical_axis_rules`` do. A mesh axis that does not divide the dimension it shards is an error.
The model code's ``shard_map``\\ s read the same rules, through :func:`mesh_axes` (a
:class:`jaxmem.models.MeshAxes` for one mesh): a new mesh axis is its entry in ``MESH_AXES`` (:mod:`jaxmem.mesh`),
its rules here, and the model code that uses it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxmem.errors import DimensionDoesNotDivide, ExpertsDoNotDivide, JaxmemError, SeqDoesNotDivide
# The mesh description is the leaf jaxmem.mesh; its names stay reachable here, beside the rules.
from jaxmem.mesh import MESH_AXES, MeshSpec, default_mesh, format_mesh, mesh_size, parse_mesh, path_keys  # noqa: F401
from jaxmem.models.mesh_axes import MeshAxes


# Logical dimension -> mesh axes, for parameters (and so gradients and optimizer state).
PARAM_RULES: dict[str, tuple[str, ...]] = {
    # fsdp and context together, MaxText's order; expert does not shard the weights here (it
    # acts as data parallelism outside the experts, see the module docstring).
    "embed": ("fsdp", "context"),
    "vocab": ("tensor",),
    "heads": ("tensor",),
    "kv_heads": ("tensor",),
    "mlp": ("tensor",),
    "exp": ("expert",),  # the router's column is "exp_scores": no rule, never sharded
    # The stacked layers over the pipeline stages (MaxText's rule layers -> stage); the
    # embeddings, the final norm and the output head have no layers dimension, so they are
    # not split over stage: every stage holds them (see the module docstring).
    "layers": ("stage",),
}
# MaxText's fsdp_shard_on_exp (layers/moe.py: the experts' kernels name their expert dimension
# "embed_no_exp", which its rules split over fsdp, and leave d_model unsplit): the routed experts'
# weights split on the expert dimension over expert and what splits embed (fsdp, context), so
# d_model, after them, is split by nothing (logical_to_spec uses a mesh axis once per array).
EXPERTS_ON_FSDP_RULES: dict[str, tuple[str, ...]] = {**PARAM_RULES, "exp": ("expert", *PARAM_RULES["embed"])}


def param_rules(*, experts_on_fsdp: bool = False) -> dict[str, tuple[str, ...]]:
  """The parameters' rules: :data:`PARAM_RULES`, or with ``experts_on_fsdp`` (the
  ``fsdp_shard_on_exp`` option) :data:`EXPERTS_ON_FSDP_RULES`. The same bytes a device, split on
  another dimension: the experts' grouped matmuls gather the expert dimension over fsdp at the
  edge of their shard_map, where the default gathers d_model (:mod:`jaxmem.models.moe_parallel`)."""
  return EXPERTS_ON_FSDP_RULES if experts_on_fsdp else PARAM_RULES


# Logical dimension -> mesh axes, for activations.
ACTIVATION_RULES: dict[str, tuple[str, ...]] = {
    "batch": ("data", "fsdp", "expert"),
    "exp": ("expert",),
    "seq": ("sequence", "context"),
    # The residual stream's sequence (norms, masks, residual adds): as "seq" here, and over
    # "tensor" too with sequence parallelism (activation_rules).
    "norm_seq": ("sequence", "context"),
    "heads": ("tensor",),
    "kv_heads": ("tensor",),
    "mlp": ("tensor",),
    "vocab": ("tensor",),
}


def data_parallel_size(mesh: MeshSpec) -> int:
  """How many ways the batch is split (data x fsdp x expert)."""
  return mesh_axes(mesh).ways("batch")


def mesh_axes(mesh: Mesh | Mapping[str, int] | MeshSpec) -> MeshAxes:
  """Which of ``mesh``'s axes (a Mesh, axis sizes, or a MeshSpec) split each dimension the
  models' ``shard_map``\\ s split, read from the rules: the batch, sequence and heads as
  activations are split, the experts and their hidden width (``mlp``) and the stacked layers
  as weights are. Axes of size 1 split nothing and are left out."""
  sizes = dict(mesh.shape) if isinstance(mesh, Mesh) else dict(mesh)

  def split(rules: dict[str, tuple[str, ...]], logical: str) -> tuple[str, ...]:
    return tuple(a for a in rules.get(logical, ()) if sizes.get(a, 1) > 1)

  return MeshAxes(
      sizes=tuple(sizes.items()),
      batch=split(ACTIVATION_RULES, "batch"),
      seq=split(ACTIVATION_RULES, "seq"),
      heads=split(ACTIVATION_RULES, "heads"),
      experts=split(PARAM_RULES, "exp"),
      mlp=split(PARAM_RULES, "mlp"),
      layers=split(PARAM_RULES, "layers"),
  )


def check_seq(mesh: MeshSpec, seq: int) -> None:
  """The axes that split the sequence (``sequence`` and ``context``) must divide it: each
  device holds ``seq / ways`` positions. The error names the nearest length they divide."""
  axes = mesh_axes(mesh)
  ways = axes.ways("seq")
  if seq % ways:
    below = seq // ways * ways
    nearest = below if below and seq - below <= below + ways - seq else below + ways
    raise SeqDoesNotDivide(
        f"seq {seq} is not divisible by the sequence axes of mesh {format_mesh(mesh)} "
        f"({axes.describe('seq')}); use a multiple of {ways}, nearest {nearest}"
    )


def activation_rules(*, sequence_parallel: bool = False) -> dict[str, tuple[str, ...]]:
  """The activation rules; with ``sequence_parallel``, ``norm_seq`` also split over ``tensor``
  (after ``sequence`` and ``context``), Megatron's sequence parallelism."""
  if not sequence_parallel:
    return ACTIVATION_RULES
  return {**ACTIVATION_RULES, "norm_seq": (*ACTIVATION_RULES["norm_seq"], "tensor")}


def check_sequence_parallel(mesh: MeshSpec, seq: int) -> None:
  """Sequence parallelism splits the residual stream over ``tensor`` after the sequence axes: it
  needs a ``tensor`` axis of size > 1, and the sequence must divide by all of them."""
  sizes = dict(mesh)
  t = sizes.get("tensor", 1)
  if t < 2:
    raise JaxmemError(
        f"`sequence_parallel` splits the residual stream over the tensor axis, and mesh {format_mesh(mesh)} has "
        "none; add tensor=N (N > 1) to `mesh` or drop `sequence_parallel`"
    )
  ways = mesh_axes(mesh).ways("seq") * t
  if seq % ways:
    by = f"tensor={t}" if ways == t else f"tensor={t} x the sequence axes ({mesh_axes(mesh).describe('seq')}) = {ways}"
    raise JaxmemError(f"`sequence_parallel`: `seq` {seq} is not divisible by {by}; use a multiple of {ways}")


def check_experts(mesh: MeshSpec, num_experts: int, model: str, *, on_fsdp: bool = False) -> None:
  """An ``expert`` axis must divide the model's routed experts (each device holds E / expert);
  with ``on_fsdp`` (``fsdp_shard_on_exp``: :func:`param_rules`) so must its product with the
  fsdp and context axes, which then split the expert dimension too."""
  ways = dict(mesh).get("expert", 1)
  if num_experts and ways > 1 and num_experts % ways:
    raise ExpertsDoNotDivide(
        f"mesh {format_mesh(mesh)}: expert={ways} does not divide {model}'s {num_experts} experts; "
        f"use an expert axis size that divides {num_experts}"
    )
  sizes = dict(mesh)
  axes = [a for a in param_rules(experts_on_fsdp=on_fsdp)["exp"] if sizes.get(a, 1) > 1]
  ways = math.prod(sizes[a] for a in axes)
  if on_fsdp and num_experts and num_experts % ways:
    by = " x ".join(f"{a}={sizes[a]}" for a in axes)
    raise ExpertsDoNotDivide(
        f"`fsdp_shard_on_exp` splits {model}'s {num_experts} experts over {by} of mesh {format_mesh(mesh)}, which "
        f"do not divide them; use axis sizes whose product divides {num_experts}, or drop fsdp_shard_on_exp"
    )


def logical_to_spec(
    logical: Sequence[str | None], shape: Sequence[int], mesh: Mesh, rules: dict[str, tuple[str, ...]], *, what: str
) -> PartitionSpec:
  """Maps logical dimension names to a PartitionSpec over ``mesh``, checking divisibility."""
  used: set[str] = set()
  entries: list[Any] = []
  for name, dim in zip(logical, shape, strict=True):
    axes = tuple(a for a in rules.get(name or "", ()) if a in mesh.shape and mesh.shape[a] > 1 and a not in used)
    if not axes:
      entries.append(None)
      continue
    ways = math.prod(mesh.shape[a] for a in axes)
    if dim % ways:
      by = " x ".join(f"{a}={mesh.shape[a]}" for a in axes) + (f" = {ways}" if len(axes) > 1 else "")
      raise DimensionDoesNotDivide(
          f"{what}: dimension {name}={dim} is not divisible by mesh {by}; pick axis sizes that divide {dim}"
          + (" (or pad the vocabulary)" if name == "vocab" else "")
      )
    used.update(axes)
    entries.append(axes[0] if len(axes) == 1 else axes)
  return PartitionSpec(*entries)


def param_shardings(
    abstract_params: Any, logical_specs: Any, mesh: Mesh, rules: dict[str, tuple[str, ...]] | None = None,
) -> Any:
  """NamedShardings for a parameter tree from its logical specs (one name per dimension), by
  ``rules`` (:func:`param_rules`; default :data:`PARAM_RULES`)."""
  rules = PARAM_RULES if rules is None else rules

  def one(path, leaf, logical):
    spec = logical_to_spec(tuple(logical), leaf.shape, mesh, rules, what=f"parameter {_keystr(path)}")
    return NamedSharding(mesh, spec)

  return jax.tree_util.tree_map_with_path(
      one, abstract_params, logical_specs, is_leaf=lambda x: isinstance(x, PartitionSpec)
  )


def state_shardings(abstract_state: Any, abstract_params: Any, shardings: Any, mesh: Mesh) -> Any:
  """Shardings for optimizer state: a leaf shaped like a parameter (same path suffix and shape)
  is sharded like that parameter; anything else (step counts, factored statistics) is
  replicated, which is small by construction."""
  by_path: dict[tuple[str, ...], tuple[tuple[int, ...], NamedSharding]] = {}
  for (path, p), (_, s) in zip(
      jax.tree_util.tree_leaves_with_path(abstract_params), jax.tree_util.tree_leaves_with_path(shardings), strict=True
  ):
    by_path[path_keys(path)] = (tuple(p.shape), s)
  replicated = NamedSharding(mesh, PartitionSpec())

  def one(path, leaf):
    keys = path_keys(path)
    for start in range(len(keys)):
      hit = by_path.get(keys[start:])
      if hit is not None and hit[0] == tuple(leaf.shape):
        return hit[1]
    return replicated

  return jax.tree_util.tree_map_with_path(one, abstract_state)


def lenient_spec(
    logical: Sequence[str | None], shape: Sequence[int], mesh: Mesh, rules: dict[str, tuple[str, ...]] | None = None
) -> tuple[PartitionSpec, list[tuple[str | None, int, tuple[str, ...], int]]]:
  """Activation rules (``rules``, else :data:`ACTIVATION_RULES`) over ``mesh``, leaving a dimension
  unsharded where its mesh axes do not divide it (rather than refusing); also the dimensions so
  left, as (name, size, axes, ways)."""
  rules = ACTIVATION_RULES if rules is None else rules
  entries: list[Any] = []
  used: set[str] = set()
  left: list[tuple[str | None, int, tuple[str, ...], int]] = []
  for name, dim in zip(logical, shape, strict=True):
    axes = tuple(a for a in rules.get(name or "", ()) if a in mesh.shape and mesh.shape[a] > 1 and a not in used)
    ways = math.prod(mesh.shape[a] for a in axes) if axes else 1
    if not axes or dim % ways:
      if axes:
        left.append((name, dim, axes, ways))
      entries.append(None)
      continue
    used.update(axes)
    entries.append(axes[0] if len(axes) == 1 else axes)
  return PartitionSpec(*entries), left


def activation_constrainer(
    mesh: Mesh, *, sequence_parallel: bool = False
) -> Callable[[jax.Array, tuple[str | None, ...]], jax.Array]:
  """A ``constrain(x, logical_axes)`` for the models: pins activations to the mesh
  (:func:`activation_rules`: ``sequence_parallel`` splits the residual stream over ``tensor``).

  Dimensions that a mesh axis does not divide are left unsharded here rather than refused:
  the batch and weights are checked up front, and heads fewer than the tensor axis are
  common (grouped-query attention), where XLA then replicates.
  """
  rules = activation_rules(sequence_parallel=sequence_parallel)

  def constrain(x: jax.Array, logical: tuple[str | None, ...]) -> jax.Array:
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, lenient_spec(logical, x.shape, mesh, rules)[0]))

  return constrain


def _keystr(path) -> str:
  return "/".join(path_keys(path))


def fsdp_shardings(tree: Any, mesh: Mesh, axis: str | Sequence[str] = "fsdp") -> Any:
  """FSDP-style ``NamedSharding``\\ s for any pytree of shapes (arrays, ``ShapeDtypeStruct``\\ s,
  anything with ``.shape``), with no logical axis names needed: each leaf's largest dimension
  that the ``axis`` (or axes, together) divides is sharded over it, and everything else, such as
  scalars and leaves no dimension of which divides, is replicated. This is ZeRO-3's layout of
  parameters and optimizer state (Rajbhandari et al. 2020, "ZeRO", section 5.3: each device holds
  1/N of every tensor); which dimension is split changes the collectives, not the bytes.

  >>> import jax, numpy as np
  >>> mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("fsdp",))
  >>> fsdp_shardings({"w": jax.ShapeDtypeStruct((8, 64), "float32")}, mesh)["w"].spec
  PartitionSpec(None, 'fsdp')
  """
  axes = (axis,) if isinstance(axis, str) else tuple(axis)
  missing = [a for a in axes if a not in mesh.shape]
  if missing:
    raise JaxmemError(f"fsdp_shardings: mesh has no axis {missing[0]!r}; its axes are {', '.join(mesh.axis_names)}")
  ways = math.prod(mesh.shape[a] for a in axes)
  entry = axes[0] if len(axes) == 1 else axes

  def one(leaf: Any) -> NamedSharding:
    shape = tuple(getattr(leaf, "shape", ()))
    # The largest dimension the axis divides; the first of equals, so the choice is stable.
    fits = [(-d, i) for i, d in enumerate(shape) if d % ways == 0 and d >= ways]
    if not fits:
      return NamedSharding(mesh, PartitionSpec())
    _, dim = min(fits)
    return NamedSharding(mesh, PartitionSpec(*[entry if i == dim else None for i in range(len(shape))]))

  return jax.tree_util.tree_map(one, tree)
