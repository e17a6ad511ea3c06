"""The training step jaxmem measures, built from abstract inputs only.

Next-token cross entropy, ``jax.value_and_grad``, an optax update, parameters and optimizer
state donated (so the new ones reuse their buffers, as a real training loop would). Every input
is a ``jax.ShapeDtypeStruct`` carrying its sharding: nothing is allocated, so a 405B model is
lowered on a laptop.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxmem.program import sharding as shd
from jaxmem.errors import JaxmemError
from jaxmem.models import ExpertsFn, ModelConfig, Transformer
from jaxmem.models.moe_parallel import ExpertMeshAxes, sharded_dropless
from jaxmem.program.optimizers import Optimizer
from jaxmem.program.remat import RematPolicy
from jaxmem.compiler.targets import Target


@functools.lru_cache(maxsize=16)
def abstract_model(cfg: ModelConfig) -> tuple[Any, Any, Any]:
  """(graphdef, abstract params, logical specs) of the model; nothing allocated."""
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  graphdef, params = nnx.split(model, nnx.Param)
  logical = nnx.get_partition_spec(params)
  return graphdef, params, logical


def tree_bytes_per_device(abstract: Any, shardings: Any) -> int:
  """Bytes one device holds of a tree: each leaf's shard shape times its item size."""
  total = 0
  for leaf, s in zip(jax.tree_util.tree_leaves(abstract), jax.tree_util.tree_leaves(shardings), strict=True):
    total += math.prod(s.shard_shape(leaf.shape)) * jnp.dtype(leaf.dtype).itemsize
  return total


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainProgram:
  """A lowered-ready train step and what jaxmem knows about its inputs."""

  step: Any  # jax.jit-wrapped step
  args: tuple[Any, ...]  # ShapeDtypeStructs with shardings
  cfg: ModelConfig
  tx: optax.GradientTransformation
  param_bytes: int  # per device
  param_bytes_global: int  # the whole model, unsharded
  optimizer_state_bytes: int  # per device

  def trace(self) -> jax.stages.Traced:
    return self.step.trace(*self.args)

  def concrete_args(self, seed: int = 0) -> tuple[Any, ...]:
    """Real, initialised inputs laid out as the abstract ones (for running the step)."""
    shardings = lambda tree: jax.tree.map(lambda a: a.sharding, tree)  # noqa: E731
    p_sh, s_sh, tok = shardings(self.args[0]), shardings(self.args[1]), self.args[2]

    def init_params():
      return nnx.split(Transformer(self.cfg, rngs=nnx.Rngs(seed)), nnx.Param)[1]

    params = jax.jit(init_params, out_shardings=p_sh)()
    state = jax.jit(self.tx.init, out_shardings=s_sh)(params)
    draw = lambda k: jax.random.randint(k, tok.shape, 0, self.cfg.vocab_size, tok.dtype)  # noqa: E731
    k1, k2 = jax.random.split(jax.random.key(seed))
    tokens = jax.jit(draw, out_shardings=tok.sharding)(k1)
    targets = jax.jit(draw, out_shardings=tok.sharding)(k2)
    return params, state, tokens, targets


def check_batch(batch: int, seq: int, mesh: shd.MeshSpec, cfg: ModelConfig) -> None:
  if batch < 1:
    raise JaxmemError(f"batch must be at least 1 (got {batch})")
  if seq < 1:
    raise JaxmemError(f"seq must be at least 1 (got {seq})")
  ways = shd.data_parallel_size(mesh)
  if batch % ways:
    raise JaxmemError(
        f"batch {batch} is not divisible by the data axes of mesh {shd.format_mesh(mesh)} "
        f"({ways} ways); use a multiple of {ways}"
    )
  seq_ways = dict(mesh).get("sequence", 1)
  if seq % seq_ways:
    raise JaxmemError(f"seq {seq} is not divisible by the sequence axis ({seq_ways}); use a multiple of {seq_ways}")
  if cfg.style == "gpt2" and seq > cfg.max_seq_len:
    raise JaxmemError(f"seq {seq} exceeds {cfg.name}'s {cfg.max_seq_len} learned positions; use --seq {cfg.max_seq_len} or less")
  shd.check_experts(mesh, cfg.num_experts, cfg.name)


def routed_experts(cfg: ModelConfig, jmesh: jax.sharding.Mesh) -> ExpertsFn | None:
  """What runs an MoE layer's routed experts in the train step: for ``dropless`` on more than
  one device, the experts per device under shard_map, tokens exchanged over ``expert``
  (:func:`jaxmem.models.moe_parallel.sharded_dropless`, on the axes the sharding rules give the
  batch, sequence, experts and expert width), since a global sort cannot be split by GSPMD.
  None (the model's own) otherwise: ``capacity`` is partitioned by its sharding constraints."""
  if not cfg.is_moe or cfg.moe_impl != "dropless" or jmesh.size == 1:
    return None
  axes = ExpertMeshAxes(
      batch=shd.ACTIVATION_RULES["batch"], seq=shd.ACTIVATION_RULES["seq"][0],
      expert=shd.PARAM_RULES["exp"][0], tensor=shd.PARAM_RULES["mlp"][0],
  )
  return sharded_dropless(jmesh, axes)


def build_train_program(
    cfg: ModelConfig,
    *,
    remat: RematPolicy,
    optimizer: Optimizer,
    batch: int,
    seq: int,
    target: Target,
    mesh: shd.MeshSpec,
    learning_rate: float = 1e-3,
) -> TrainProgram:
  """Builds the sharded, donated train step with abstract inputs."""
  check_batch(batch, seq, mesh, cfg)
  jmesh = target.make_mesh(mesh)
  graphdef, params, logical = abstract_model(cfg)
  param_sh = shd.param_shardings(params, logical, jmesh)
  tx = optimizer.build(learning_rate)
  opt_state = jax.eval_shape(tx.init, params)
  opt_sh = shd.state_shardings(opt_state, params, param_sh, jmesh)
  batch_sh = NamedSharding(
      jmesh, shd.logical_to_spec(("batch", "seq"), (batch, seq), jmesh, shd.ACTIVATION_RULES, what="batch")
  )
  constrain = shd.activation_constrainer(jmesh)
  experts = routed_experts(cfg, jmesh)

  def loss_fn(p, tokens_bt, targets_bt):
    model = nnx.merge(graphdef, p)
    logits_btv = model(tokens_bt, remat=remat.policy, constrain=constrain, experts=experts)
    return optax.softmax_cross_entropy_with_integer_labels(logits_btv, targets_bt).mean()

  def train_step(p, state, tokens_bt, targets_bt):
    loss, grads = jax.value_and_grad(loss_fn)(p, tokens_bt, targets_bt)
    updates, state = tx.update(grads, state, p)
    return optax.apply_updates(p, updates), state, loss

  step = jax.jit(
      train_step,
      in_shardings=(param_sh, opt_sh, batch_sh, batch_sh),
      out_shardings=(param_sh, opt_sh, NamedSharding(jmesh, PartitionSpec())),
      donate_argnums=(0, 1),
  )
  sds = lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)  # noqa: E731
  tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32, sharding=batch_sh)
  args = (jax.tree.map(sds, params, param_sh), jax.tree.map(sds, opt_state, opt_sh), tokens, tokens)
  return TrainProgram(
      step=step,
      args=args,
      cfg=cfg,
      tx=tx,
      param_bytes=tree_bytes_per_device(params, param_sh),
      param_bytes_global=sum(math.prod(a.shape) * jnp.dtype(a.dtype).itemsize for a in jax.tree.leaves(params)),
      optimizer_state_bytes=tree_bytes_per_device(opt_state, opt_sh),
  )
