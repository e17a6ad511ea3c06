"""The training step jaxmem measures, built from abstract inputs only.

Next-token cross entropy, ``jax.value_and_grad``, an optax update, parameters and optimizer
state donated (so the new ones reuse their buffers, as a real training loop would). Every input
is a ``jax.ShapeDtypeStruct`` carrying its sharding: nothing is allocated, so a 405B model is
lowered on a laptop.

The step a production trainer runs, as MaxText builds it:

- attention through the implementation chosen for the target and mesh
  (:func:`jaxmem.models.choose_attention`; ``auto`` is splash on TPU, cuDNN on GPU); the fused
  kernels run under ``shard_map`` over the batch and head axes, and the program is lowered
  inside the choice's :meth:`~jaxmem.models.AttentionChoice.lowering` context;
- the loss through :meth:`Transformer.loss` with ``vocab_tiles`` (MaxText's
  ``num_vocab_tiling``);
- gradient accumulation over ``microbatches`` (MaxText's ``gradient_accumulation_steps``,
  ``gradient_accumulation.py``): the global batch split into microbatches run in sequence by
  ``lax.scan``, their gradients summed in float32, one optimizer update;
- pipeline parallelism over a ``stage`` mesh axis (:mod:`jaxmem.models.pipeline`, MaxText's
  ``layers/pipeline.py``): ``pipeline_microbatches`` and ``pipeline_repeats``
  (:class:`jaxmem.program.pipelining.PipelineOptions`);
- mixed precision as ZeRO and Megatron lay it out (:mod:`jaxmem.program.precision`): bf16
  parameters with a float32 master copy in the optimizer state, the moments' own dtype, and
  the dtype the gradients are formed and reduced in;
- Megatron's sequence parallelism (``sequence_parallel``: the residual stream, norms and
  dropouts split along the sequence over ``tensor``; :func:`jaxmem.program.sharding.activation_rules`)
  and the step's dropout (``choices.dropout``, the step's :class:`~jaxmem.models.StepChoices`: a
  PRNG key is then the step's fifth argument, one key per step as a training loop would pass in);
- a mixture of experts' routed experts as one configuration chooses them (:func:`moe_choice`).

The step's options are one configuration's value of every sweep axis, by name
(:func:`jaxmem.axes.one_each`): each piece of the step reads those it applies, and
:attr:`TrainProgram.recorded` says how it resolved them (the implementation ``auto`` became, the
moments' dtype), which the configuration's record takes. The model is built from its config and
the step's choices, each with the configuration's values (:func:`jaxmem.axes.configured`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxmem.axes import AXES, configured
from jaxmem.errors import BatchDoesNotDivide, JaxmemError
from jaxmem.program import sharding as shd
from jaxmem.models import (
    AttentionChoice, AttentionShapes, ExpertsFn, ModelConfig, StepChoices, Transformer, choose_attention,
    choose_moe_kernel, dropless_experts, grouped_matmul,
)
from jaxmem.models import context_attention as ctx
from jaxmem.models.attention_registry import AUTO, AUTO_PREFERENCE, FALLBACK
from jaxmem.models.dropout import Dropout
from jaxmem.models.moe_parallel import sharded_dropless
from jaxmem.models.pipeline import Pipeline
from jaxmem.program import precision as prec
from jaxmem.program.pipelining import PipelineOptions
from jaxmem.program.optimizers import Optimizer
from jaxmem.program.remat import RematPolicy
from jaxmem.hardware.targets import Target, target_peaks


@functools.lru_cache(maxsize=16)
def abstract_model(cfg: ModelConfig, choices: StepChoices = StepChoices()) -> tuple[Any, Any, Any]:
  """(graphdef, abstract params, logical specs) of the model run as ``choices`` say (the
  parameters are the config's alone); nothing allocated."""
  model = nnx.eval_shape(lambda: Transformer(cfg, choices=choices, rngs=nnx.Rngs(0)))
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
  choices: StepChoices = StepChoices()  # how the step runs the model: its dropout, its experts
  param_bytes: int  # per device
  param_bytes_global: int  # the whole model, unsharded
  optimizer_state_bytes: int  # per device
  attention: AttentionChoice | None = None  # how attention is computed (None: dot, as before)
  microbatches: int = 1
  vocab_tiles: int = 1
  # The precision asked. Where no gradient-reduction dtype is, the dtype a reduction runs in is
  # the compiler's choice (the TPU and GPU compilers reduce a matmul's weight gradient in the
  # compute dtype even for float32 parameters).
  precision: prec.Precision = prec.Precision()
  # The layers pipelined over the mesh's stage axis (None: no stage axis, one scan).
  pipeline: Pipeline | None = None
  sequence_parallel: bool = False
  step_notes: tuple[str, ...] = ()  # what the step's options do here (dropout under a fused kernel)
  moe_notes: tuple[str, ...] = ()  # how the MoE choice was made (moe_choice)
  # The grouped matmul the dropless experts run (gmm, ragged_dot); None without dropless experts.
  moe_kernel: str | None = None
  # The sweep axes as the program resolved them, by name (the implementation auto became, the
  # moments' dtype most optimizer-state elements are in beside any master copy, the pipeline's
  # schedule on this mesh), with the configuration's own pipeline fields: what its record takes.
  recorded: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def notes(self) -> tuple[str, ...]:
    """What a row of this program must say: how the MoE choice was made, why ``auto`` fell back,
    what a deviceless compile of the kernel leaves out, what the precision options mean for its
    figures."""
    own = () if self.attention is None else self.attention.notes
    return self.moe_notes + own + self.precision.notes(self.cfg.dtype) + self.step_notes

  def trace(self) -> jax.stages.Traced:
    return self.step.trace(*self.args)

  def lowering_context(self) -> contextlib.AbstractContextManager:
    """Where the step must be lowered: in the attention kernel's lowering context."""
    return self.attention.lowering() if self.attention is not None else contextlib.nullcontext()

  def lower(self, traced: jax.stages.Traced | None = None) -> jax.stages.Lowered:
    """``traced`` (else a fresh trace) lowered in the attention kernel's lowering context."""
    with self.lowering_context():
      return (traced or self.trace()).lower()

  def concrete_args(self, seed: int = 0) -> tuple[Any, ...]:
    """Real, initialised inputs laid out as the abstract ones (for running the step)."""
    shardings = lambda tree: jax.tree.map(lambda a: a.sharding, tree)  # noqa: E731
    p_sh, s_sh, tok = shardings(self.args[0]), shardings(self.args[1]), self.args[2]
    draw = lambda k: jax.random.randint(k, tok.shape, 0, self.cfg.vocab_size, tok.dtype)  # noqa: E731

    def init(key):  # one program, so one compile: a compile per piece costs more than the step's
      params = nnx.split(Transformer(self.cfg, choices=self.choices, rngs=nnx.Rngs(seed)), nnx.Param)[1]
      k1, k2, k3 = jax.random.split(key, 3)
      return params, self.tx.init(params), draw(k1), draw(k2), k3

    out = jax.jit(init, out_shardings=(p_sh, s_sh, tok.sharding, tok.sharding, None))(jax.random.key(seed))
    return out if len(self.args) > 4 else out[:4]  # the dropout key only where the step takes one


def check_batch(
    batch: int, seq: int, mesh: shd.MeshSpec, cfg: ModelConfig, *, microbatches: int = 1, vocab_tiles: int = 1,
    pipeline: PipelineOptions = PipelineOptions(), choices: StepChoices = StepChoices(),
) -> None:
  if batch < 1:
    raise JaxmemError(f"batch must be at least 1 (got {batch})")
  if seq < 1:
    raise JaxmemError(f"seq must be at least 1 (got {seq})")
  if not isinstance(microbatches, int) or microbatches < 1:
    raise JaxmemError(f"`microbatches` must be whole numbers of at least 1 (got {microbatches!r})")
  if not isinstance(vocab_tiles, int) or vocab_tiles < 1 or seq % vocab_tiles:
    raise JaxmemError(f"`vocab_tiles` must be a positive divisor of the sequence length {seq} (got {vocab_tiles!r})")
  ways = shd.data_parallel_size(mesh)
  # The pipeline cuts each (accumulation) microbatch again, into its pipeline microbatches.
  piped = pipeline.check_mesh(mesh, cfg, mesh_name=shd.format_mesh(mesh), moe_impl=choices.moe_impl)
  if batch % (ways * microbatches * piped):
    what = f"{microbatches} microbatches x " if microbatches > 1 else ""
    what += f"{piped} pipeline microbatches x " if piped > 1 else ""
    raise BatchDoesNotDivide(
        f"batch {batch} is not divisible by {what}the data axes of mesh {shd.format_mesh(mesh)} "
        f"({ways} ways); use a multiple of {ways * microbatches * piped}"
    )
  shd.check_seq(mesh, seq)
  if cfg.position_limit is not None and seq > cfg.position_limit:
    raise JaxmemError(f"`seq` {seq} exceeds {cfg.name}'s {cfg.position_limit} learned positions; use {cfg.position_limit} or less")
  shd.check_experts(mesh, cfg.num_experts, cfg.name)


def batch_multiple(mesh: shd.MeshSpec, options: Mapping[str, Any]) -> int:
  """What one configuration's global batch must be a multiple of (:func:`check_batch`): the data
  axes times the microbatches times the pipeline microbatches of each."""
  pipeline = PipelineOptions.of(options)
  return shd.data_parallel_size(mesh) * (options.get("microbatches") or 1) * pipeline.ways(mesh)


def seq_multiple(mesh: shd.MeshSpec, options: Mapping[str, Any], platform: str) -> int:
  """What one configuration's sequence must be a multiple of beside the axes that split it
  (:func:`jaxmem.program.sharding.check_seq`): the vocabulary tiles, and over a context axis what
  the context strategy's kernel needs (two load-balanced chunks per device, each whole 128-lane
  blocks for splash: :func:`jaxmem.models.context_attention.seq_multiple`)."""
  axes = shd.mesh_axes(mesh)
  tiles = options.get("vocab_tiles") or 1
  if "context" not in axes.seq:
    return tiles
  strategy = options.get("context_strategy") or ctx.DEFAULT_STRATEGY
  kernel = options.get("attention") or AUTO
  if kernel == AUTO:  # auto's kernel where the strategy can take it (the registry's choice)
    preferred = AUTO_PREFERENCE.get(platform, FALLBACK)
    kernel = preferred if ctx.strategy_problem(strategy, preferred) is None else FALLBACK
  return math.lcm(tiles, ctx.seq_multiple(strategy, kernel, axes.ways("seq")))


def routed_experts(
    cfg: ModelConfig, choices: StepChoices, jmesh: jax.sharding.Mesh, kernel: str | None = None
) -> ExpertsFn | None:
  """What runs an MoE layer's routed experts in the train step: for ``dropless``, its grouped
  matmuls through ``kernel`` (:func:`moe_kernel`'s choice; None: ``ragged_dot``), and on more
  than one device the experts per device under shard_map, tokens exchanged over ``expert``
  (:func:`jaxmem.models.moe_parallel.sharded_dropless`, on the axes the sharding rules give the
  batch, sequence, experts and expert width), since a global sort cannot be split by GSPMD.
  None (the model's own) otherwise: ``capacity`` is partitioned by its sharding constraints."""
  if not cfg.is_moe or choices.moe_impl != "dropless":
    return None
  matmul = grouped_matmul(kernel or "ragged_dot")
  if jmesh.size == 1:
    return None if kernel in (None, "ragged_dot") else functools.partial(dropless_experts, matmul=matmul)
  return sharded_dropless(jmesh, shd.mesh_axes(jmesh), matmul=matmul)


def moe_kernel(
    cfg: ModelConfig, choices: StepChoices, target: Target, options: Mapping[str, Any] | None = None
) -> str | None:
  """The grouped matmul a dropless MoE model's experts run on ``target``: the ``moe_kernel``
  option (``auto``, the default, is megablox's ``gmm`` on TPU, ``ragged_dot`` elsewhere:
  :func:`jaxmem.models.choose_moe_kernel`, which refuses one the target cannot compile); None
  where no dropless experts run (a dense model, ``capacity``), where a kernel asked is refused:
  it would change nothing, and silently so (the default on GPU targets is capacity)."""
  asked = (options or {}).get("moe_kernel")
  if not cfg.is_moe or choices.moe_impl != "dropless":
    if cfg.is_moe and asked not in (None, "auto"):
      raise JaxmemError(
          f"`moe_kernel` applies to `moe_impl` dropless, and {cfg.name} runs capacity here; add dropless to `moe_impl`"
      )
    return None
  return choose_moe_kernel(asked, target.platform)


# Why capacity is the default on GPU targets, and what dropless costs there (benchmarks/moe_layer.py).
_GPU_RAGGED_DOT = (
    "XLA's GPU compiler expands jax.lax.ragged_dot (the dropless path's grouped matmul) into a dense "
    "matmul over all E experts, so its temporaries hold E times the routed copies a grouped matmul "
    "would (qwen3-30b-a3b, one layer, 4096 tokens, gpu:h100: 48.85 GiB dropless against 0.90-1.66 "
    "capacity, benchmarks/moe_layer.py)"
)


def moe_choice(
    cfg: ModelConfig, choices: StepChoices, platform: str, options: Mapping[str, Any]
) -> tuple[StepChoices, tuple[str, ...]]:
  """How the step runs ``cfg``'s experts in one configuration: ``choices`` (with the
  configuration's values, :func:`jaxmem.axes.configured`) with the implementation resolved where
  ``options`` give no ``moe_impl`` (a capacity factor alone implies ``capacity``; else the
  choices' own, but on GPU targets), and what its row must say of the choice. A dense model's
  choices are as they are.

  The default on GPU targets is ``capacity``: XLA's GPU compiler expands ``ragged_dot``, so the
  dropless figure there describes a program GPU MoE training does not run (MaxText's GPU
  recipes set sparse_matmul=False, its dense capacity path; its megablox kernel is TPU-only)."""
  if not cfg.is_moe:
    return choices, ()
  impl = choices.moe_impl
  notes: list[str] = []
  if options.get("moe_impl") is None and options.get("capacity_factor") is not None:
    impl = "capacity"
  elif options.get("moe_impl") is None and platform == "gpu" and impl == "dropless":
    impl = "capacity"
    notes.append(f"moe_impl: capacity, the default on GPU targets: {_GPU_RAGGED_DOT}; --moe-impl dropless compiles it anyway")
  if impl == "dropless" and platform == "gpu" and not notes:
    notes.append(f"moe_impl dropless on GPU: {_GPU_RAGGED_DOT}; --moe-impl capacity is what GPU MoE training runs")
  return dataclasses.replace(choices, moe_impl=impl), tuple(notes)


def moe_fields(cfg: ModelConfig, choices: StepChoices) -> dict[str, Any]:
  """A record's ``moe_impl`` and ``capacity_factor`` (this one for capacity only) as ``choices``
  run the model ``cfg``; None for a dense model."""
  if not cfg.is_moe:
    return dict(moe_impl=None, capacity_factor=None)
  impl = choices.moe_impl
  return dict(moe_impl=impl, capacity_factor=choices.capacity_factor if impl == "capacity" else None)


def moe_summary(impl: str | None, capacity_factor: float | None, on_fsdp: bool | None = None) -> str | None:
  """A summary's experts in a few words (fit's and scale's ``moe``): ``dropless``, ``capacity
  1.25``, with ``, experts on fsdp`` where ``fsdp_shard_on_exp`` was on; None for a dense model."""
  if not impl:
    return None
  return impl + ("" if capacity_factor is None else f" {capacity_factor:g}") + (", experts on fsdp" if on_fsdp else "")


def check_configuration(
    cfg: ModelConfig, *, choices: StepChoices = StepChoices(), target: Target, mesh: shd.MeshSpec, batch: int,
    seq: int, options: Mapping[str, Any],
) -> None:
  """What :func:`build_train_program` would refuse of one configuration (``options``: its value
  of every sweep axis, by name), refused in the same words without building anything: the batch
  and sequence on the mesh, the pipeline's schedule, sequence parallelism, the precision's
  dtypes, the MoE kernel and the attention implementation on the target and mesh. The planner
  runs it on every configuration of a sweep before the first compile."""
  cfg, choices = configured(cfg, choices, options)
  choices, _ = moe_choice(cfg, choices, target.platform, options)
  check_batch(batch, seq, mesh, cfg, microbatches=options.get("microbatches") or 1,
              vocab_tiles=options.get("vocab_tiles") or 1, pipeline=PipelineOptions.of(options), choices=choices)
  check_step_options(cfg, mesh, seq, sequence_parallel=bool(options.get("sequence_parallel")))
  shd.check_experts(mesh, cfg.num_experts, cfg.name, on_fsdp=bool(experts_sharded_on_fsdp(cfg, mesh, options)))
  prec.Precision.of(options).check(cfg.param_dtype)
  moe_kernel(cfg, choices, target, options)
  check_fp8_matmul(choices, target)
  pick_attention(options.get("attention") or "auto", cfg, batch=batch, seq=seq, target=target, mesh=dict(mesh),
                 context_strategy=options.get("context_strategy"), options=options)


def check_step_options(cfg: ModelConfig, mesh: shd.MeshSpec, seq: int, *, sequence_parallel: bool) -> None:
  """Sequence parallelism needs a tensor axis that divides the sequence (after the sequence axes)."""
  if sequence_parallel:
    shd.check_sequence_parallel(mesh, seq)


def dropout_attend(attend: Any, name: str) -> tuple[Any, tuple[str, ...]]:
  """``attend`` for a model with dropout: dot attention drops the probabilities itself; a fused
  kernel (or chunked) takes no dropout, so it runs without and the row says so."""
  if name == "dot":
    return attend, ()

  def run(q, k, v, *, causal=True, dropout=None, **layer):
    del dropout  # the kernel has no attention dropout
    return attend(q, k, v, causal=causal, **layer)

  return run, (
      f"dropout: the attention probabilities are not dropped under {name} attention (its kernel takes no dropout); "
      "the embeddings and both sub-blocks' outputs are; --attention dot drops them too",
  )


def layer_attend(choice: AttentionChoice | None, choices: StepChoices) -> Any:
  """What one layer traced outside the step attends with (its saved residuals and FLOPs:
  :mod:`jaxmem.buffers.residuals`), taking the step's dropout as the step does
  (:func:`dropout_attend`); None: the model's own (dot)."""
  if choice is None:
    return None
  return dropout_attend(choice.attend, choice.name)[0] if choices.dropout else choice.attend


def step_attend(choice: AttentionChoice, choices: StepChoices, remat: RematPolicy) -> tuple[Any, tuple[str, ...]]:
  """The attention a layer of the step runs, and what its row must say: the choice's, taking the
  step's dropout (:func:`dropout_attend`), wrapped by the remat policy (``selective``
  recomputes the attention core)."""
  attend, notes = choice.attend, ()
  if choices.dropout:
    attend, notes = dropout_attend(attend, choice.name)
  return remat.attend(attend), notes


def dropout_key_args(choices: StepChoices, sharding: NamedSharding) -> tuple[jax.ShapeDtypeStruct, ...]:
  """The step's PRNG key argument for its dropout (one per step), or none without dropout."""
  return (jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=sharding),) if choices.dropout else ()


def key_shapes(choices: StepChoices) -> tuple[jax.ShapeDtypeStruct, ...]:
  """The abstract PRNG key a layer run as ``choices`` say takes for its dropout masks, or none
  without dropout."""
  return (jax.eval_shape(lambda: jax.random.key(0)),) if choices.dropout else ()


def keyed(choices: StepChoices, key: jax.Array | None) -> dict[str, Any]:
  """A layer's keyword arguments that draw from ``key`` (the step's dropout, one layer's key),
  none without a key."""
  return {} if key is None else {"dropout": Dropout(choices.dropout, key)}


def pick_attention(
    requested: str, cfg: ModelConfig, *, batch: int, seq: int, target: Target, mesh: Any,
    context_strategy: str | None = None, options: Mapping[str, Any] | None = None,
) -> AttentionChoice:
  """The attention implementation for ``requested`` on ``target`` over ``mesh`` (a Mesh, or
  axis sizes for a check before anything is built), at a (micro)batch of ``batch``.
  ``context_strategy`` applies on a mesh whose ``context`` axis splits the sequence (default
  ``all_gather``). ``options``: one configuration's value of every sweep axis, by name;
  attention reads ``qk_dtype``, dot attention's scores ("bfloat16", the default, is MaxText's:
  scores in the compute dtype), and passes the others by."""
  (qk_dtype,) = AXES["qk_dtype"].normalise((options or {}).get("qk_dtype") or "bfloat16")
  choice = choose_attention(
      requested,
      platform=target.platform,
      shapes=AttentionShapes.of(cfg, batch=batch, seq=seq),
      mesh=mesh if isinstance(mesh, jax.sharding.Mesh) else None,
      axes=None if mesh is None else shd.mesh_axes(mesh),
      qk_dtype=None if qk_dtype == "bfloat16" else qk_dtype,
      deviceless=not target.kind.attached,
      strategy=context_strategy,
  )
  if qk_dtype != "bfloat16" and choice.name != "dot":  # asked, and it changes nothing here: the row says so
    choice = dataclasses.replace(choice, notes=(*choice.notes, _unused_scores_dtype(qk_dtype, choice.name)))
  return choice


def _unused_scores_dtype(qk_dtype: str, kernel: str) -> str:
  return (f"qk_dtype {qk_dtype}: dot attention's scores; {kernel} keeps its block scores in float32 whatever it "
          "says (--attention dot forms the scores in it)")


def check_attention_options(chosen: Sequence[AttentionChoice], options: Mapping[str, Any]) -> None:
  """A one-line error where an attention option given (``options``: one configuration's values)
  changes none of the implementations ``chosen``: a scores dtype where none forms dot's scores.
  (A sweep's rows say so instead, where it changes some of them: :func:`pick_attention`.)"""
  (qk_dtype,) = AXES["qk_dtype"].normalise(options.get("qk_dtype") or "bfloat16")
  if qk_dtype != "bfloat16" and all(c.name != "dot" for c in chosen):
    raise JaxmemError(f"`qk_dtype` {qk_dtype} is the dtype of dot attention's scores; {', '.join(c.name for c in chosen)} "
                      "keeps its block scores in float32 whatever it says: add dot to `attention` or drop it")


def accumulated(grad_fn, microbatches: int, micro_sh: NamedSharding, param_sh: Any):
  """``grad_fn(p, tokens_bt, targets_bt) -> (loss, grads)`` over ``microbatches`` microbatches
  run in sequence by ``lax.scan``: the mean loss and the mean gradient, summed in float32.

  Microbatch i holds rows i, i + n, i + 2n, ... of the global batch, MaxText's split
  (``reshape_to_microbatch_accumulations``: [B/n, n] then swap): a data-parallel device's
  contiguous rows then hold its share of every microbatch, so no row moves between devices.
  """
  n = microbatches

  def split(x_bt: jax.Array) -> jax.Array:
    x_nbt = jnp.swapaxes(x_bt.reshape(x_bt.shape[0] // n, n, *x_bt.shape[1:]), 0, 1)
    return jax.lax.with_sharding_constraint(x_nbt, micro_sh)

  def run(p, tokens_bt, targets_bt, *dropout_key):
    zeros = jax.tree.map(lambda a: jnp.zeros(a.shape, jnp.float32), p)
    zeros = jax.lax.with_sharding_constraint(zeros, param_sh)
    # A dropout key per microbatch: each draws its own masks.
    keys = tuple(jax.random.split(k, n) for k in dropout_key)

    def body(carry, xs):
      loss_sum, acc = carry
      tokens, targets, key = xs
      loss, grads = grad_fn(p, tokens, targets, *key)
      acc = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), acc, grads)
      return (loss_sum + loss, acc), None

    xs = (split(tokens_bt), split(targets_bt), keys)
    (loss_sum, acc), _ = jax.lax.scan(body, (jnp.zeros((), jnp.float32), zeros), xs)
    return loss_sum / n, jax.tree.map(lambda a, x: (a / n).astype(x.dtype), acc, p)

  return run


def build_train_program(
    cfg: ModelConfig,
    *,
    choices: StepChoices = StepChoices(),
    remat: RematPolicy,
    optimizer: Optimizer,
    batch: int,
    seq: int,
    target: Target,
    mesh: shd.MeshSpec,
    options: Mapping[str, Any] | None = None,
    learning_rate: float = 1e-3,
) -> TrainProgram:
  """Builds the sharded, donated train step with abstract inputs, the model ``cfg`` run as
  ``choices`` say (its dropout and experts: :func:`moe_choice`), once JAX has started the
  target's backends (the attention choice reads them). ``options``: one configuration's value of
  every sweep axis, by name (:func:`jaxmem.axes.one_each`; ``None`` or absent: the default), which
  configure the model (:func:`jaxmem.axes.configured`); each piece of the step reads its own."""
  options = options or {}
  cfg, choices = configured(cfg, choices, options)
  choices, moe_notes = moe_choice(cfg, choices, target.platform, options)
  microbatches, vocab_tiles = options.get("microbatches") or 1, options.get("vocab_tiles") or 1
  precision, pipeline = prec.Precision.of(options), PipelineOptions.of(options)
  sequence_parallel = bool(options.get("sequence_parallel"))
  check_batch(batch, seq, mesh, cfg, microbatches=microbatches, vocab_tiles=vocab_tiles, pipeline=pipeline,
              choices=choices)
  check_step_options(cfg, mesh, seq, sequence_parallel=sequence_parallel)
  check_fp8_matmul(choices, target)
  jmesh = target.make_mesh(mesh)
  sched = pipeline.schedule(mesh)
  pipe = None if sched is None else Pipeline(mesh=jmesh, axes=shd.mesh_axes(jmesh), microbatches=sched[1], repeats=sched[2])
  # The kernel sees one (pipeline) microbatch at a time.
  choice = pick_attention(
      options.get("attention") or "auto", cfg, batch=batch // microbatches // (1 if pipe is None else pipe.microbatches),
      seq=seq, target=target, mesh=jmesh, context_strategy=options.get("context_strategy"), options=options,
  )
  graphdef, params, logical = abstract_model(cfg, choices)
  experts_on_fsdp = experts_sharded_on_fsdp(cfg, mesh, options)
  shd.check_experts(mesh, cfg.num_experts, cfg.name, on_fsdp=bool(experts_on_fsdp))
  param_sh = shd.param_shardings(params, logical, jmesh, shd.param_rules(experts_on_fsdp=bool(experts_on_fsdp)))
  precision.check(cfg.param_dtype)
  tx = precision.transformation(optimizer, learning_rate)
  opt_state = jax.eval_shape(tx.init, params)
  opt_sh = shd.state_shardings(opt_state, params, param_sh, jmesh)
  batch_spec = shd.logical_to_spec(("batch", "seq"), (batch, seq), jmesh, shd.ACTIVATION_RULES, what="batch")
  batch_sh = NamedSharding(jmesh, batch_spec)
  constrain = shd.activation_constrainer(jmesh, sequence_parallel=sequence_parallel)
  kernel = moe_kernel(cfg, choices, target, options)
  experts = routed_experts(cfg, choices, jmesh, kernel)
  attend, step_notes = step_attend(choice, choices, remat)

  def loss_fn(p, tokens_bt, targets_bt, key=None):
    model = nnx.merge(graphdef, p)
    return model.loss(
        tokens_bt, targets_bt, remat=remat.policy, constrain=constrain, attend=attend, vocab_tiles=vocab_tiles,
        experts=experts, pipeline=pipe, dropout_key=key,
    )

  grad_fn = precision.grads(jax.value_and_grad(loss_fn), param_sh)
  if microbatches > 1:
    grad_fn = accumulated(grad_fn, microbatches, NamedSharding(jmesh, PartitionSpec(None, *batch_spec)), param_sh)

  # The argument names are what explain shows the inputs as (params['blocks'], opt_state.mu).
  def train_step(params, opt_state, tokens_bt, targets_bt, *dropout_key):
    loss, grads = grad_fn(params, tokens_bt, targets_bt, *dropout_key)
    updates, opt_state = tx.update(grads, opt_state, params)
    return prec.apply(params, updates, opt_state), opt_state, loss

  step, args = _jitted(train_step, jmesh, (params, param_sh), (opt_state, opt_sh), batch_sh, (batch, seq), choices)
  return TrainProgram(
      step=step, args=args, cfg=cfg, choices=choices, tx=tx,
      param_bytes=tree_bytes_per_device(params, param_sh),
      param_bytes_global=sum(math.prod(a.shape) * jnp.dtype(a.dtype).itemsize for a in jax.tree.leaves(params)),
      optimizer_state_bytes=tree_bytes_per_device(opt_state, opt_sh),
      attention=choice, microbatches=microbatches, vocab_tiles=vocab_tiles, precision=precision, pipeline=pipe,
      sequence_parallel=sequence_parallel, step_notes=step_notes, moe_notes=moe_notes, moe_kernel=kernel,
      recorded=dict(attention=choice.name, context_strategy=choice.strategy, moe_kernel=kernel, **moe_fields(cfg, choices),
                    fsdp_shard_on_exp=experts_on_fsdp,
                    **precision.recorded(opt_state), **pipeline.fields(mesh)),
  )


def experts_sharded_on_fsdp(cfg: ModelConfig, mesh: shd.MeshSpec, options: Mapping[str, Any]) -> bool | None:
  """The ``fsdp_shard_on_exp`` option as it applies: whether the routed experts' weights are split
  on their expert dimension over fsdp (:func:`jaxmem.program.sharding.param_rules`); None where it
  does not apply (a dense model, a mesh without an fsdp axis)."""
  if not cfg.is_moe or dict(mesh).get("fsdp", 1) < 2:
    return None
  return bool(options.get("fsdp_shard_on_exp"))


def _jitted(train_step, jmesh: jax.sharding.Mesh, params: tuple[Any, Any], opt_state: tuple[Any, Any],
            batch_sh: NamedSharding, shape: tuple[int, int], choices: StepChoices):
  """``train_step`` jitted, and its abstract arguments: parameters and optimizer state (each with
  its shardings) donated, the tokens and targets at ``batch_sh``, the dropout key (where the
  step drops, as ``choices`` say) replicated."""
  (params, param_sh), (opt_state, opt_sh) = params, opt_state
  replicated = NamedSharding(jmesh, PartitionSpec())
  key_args = dropout_key_args(choices, replicated)
  step = jax.jit(
      train_step,
      in_shardings=(param_sh, opt_sh, batch_sh, batch_sh, *(replicated for _ in key_args)),
      out_shardings=(param_sh, opt_sh, replicated),
      donate_argnums=(0, 1),
  )
  sds = lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)  # noqa: E731
  tokens = jax.ShapeDtypeStruct(shape, jnp.int32, sharding=batch_sh)
  args = (jax.tree.map(sds, params, param_sh), jax.tree.map(sds, opt_state, opt_sh), tokens, tokens, *key_args)
  return step, args


def check_fp8_matmul(choices: StepChoices, target: Target) -> None:
  """``quantization`` fp8_full runs its matmuls on fp8 operands: a target whose part has no fp8
  matrix rate (:attr:`jaxmem.hardware.peaks.Peaks.peak_fp8_flops`: TPU v4, v5e and v6e publish
  an int8 rate, not fp8; NVIDIA parts before Ada and Hopper; a CPU) is refused in one line."""
  if choices.quantization == "none":
    return
  peaks, why = target_peaks(target)
  if peaks is None or peaks.peak_fp8_flops is None:
    part = why if peaks is None else f"{peaks.part} publishes no fp8 matrix rate"
    raise JaxmemError(f"`quantization` {choices.quantization} needs fp8 matmuls, which target {target.name} has not "
                      f"({part}); fp8 targets: TPU v5p, v7x; NVIDIA from Ada and Hopper (e.g. gpu:h100)")
