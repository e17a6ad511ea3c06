"""MaxText's own train step as a step source: a MaxText config and its overrides, built the way
MaxText's ``train_compile`` builds them, compiled by jaxmem's own-step path.

``--maxtext base.yml model_name=llama3-8b per_device_batch_size=1 remat_policy=minimal`` (and
``maxtext=("base.yml", "model_name=llama3-8b", ...)`` in the library) makes the workload's step
:func:`make_step`, a factory like any user's (:mod:`jaxmem.program.step`): it initialises
MaxText's config (``pyconfig``), builds the abstract train state, the batch and
``train.train_step`` with their shardings through ``train_compile``'s own functions
(``get_shaped_inputs``, ``get_functional_train_with_signature``), and traces the step under the
contexts ``train_compile`` traces it in (the mesh, the logical axis rules, ``unsafe_rbg`` keys,
``remove_size_one_mesh_axis_from_type``). The program is then the one MaxText's
``train_compile`` compiles, and its memory fields are the same, byte for byte
(tests/test_maxtext.py).

What jaxmem varies maps onto MaxText's options through the one table (:mod:`jaxmem.maxtext.table`):
the target onto ``compile_topology`` and ``compile_topology_num_slices`` (:func:`topology`), and
per configuration (:func:`task_settings`) the mesh, batch, sequence, microbatches, remat policy,
attention and, where they apply, the context strategy and pipeline schedule; the options set once
for a sweep are in the workload's overrides already (:mod:`jaxmem.maxtext.plan`). What jaxmem
does not give is MaxText's own (the config's or the overrides').

MaxText is an optional extra (``pip install 'jaxmem[maxtext]'``, Python 3.12 or later),
imported only when a workload names it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from jaxmem.axes import AXES
from jaxmem.errors import JaxmemError
from jaxmem.hardware import runtime
from jaxmem.inputs import override
from jaxmem.maxtext.table import (
    ROWS, At, attention, maxtext_remat, mesh_of, mesh_settings, per_device_batch, row, text,
)

# The factory a MaxText workload's step is (Workload.step), by import path like any other.
SPEC = "jaxmem.maxtext.step:make_step"
INSTALL = "pip install 'jaxmem[maxtext]' (MaxText needs Python 3.12 or later)"


def overrides(args: Sequence[str]) -> dict[str, str]:
  """The ``key=value`` overrides of a workload's ``maxtext``, the last of a key winning."""
  return dict(override(p) for p in args[1:])


def label(args: Sequence[str]) -> str:
  """The model name a MaxText step's rows carry: ``maxtext:llama3-8b`` (its ``model_name``), or
  the config's name."""
  name = overrides(args).get("model_name") or os.path.splitext(os.path.basename(args[0]))[0]
  return f"maxtext:{name}"


# The MaxText modules jaxmem builds the step with. MaxText's wheel declares none of its own
# dependencies (0.2.5's metadata lists no Requires), so a plain `pip install maxtext` imports
# `maxtext` and fails on these; the extra lists what they need.
_MODULES = ("maxtext.configs.pyconfig", "maxtext.trainers.pre_train.train_compile")


def require() -> Any:
  """The ``maxtext`` package with the modules jaxmem uses, or a one-line error saying how to
  install what is missing."""
  try:
    mx = importlib.import_module("maxtext")
  except ImportError as e:
    raise JaxmemError(f"`maxtext` needs MaxText, which is not installed ({e}): {INSTALL}") from None
  for name in _MODULES:
    try:
      with quiet():  # its optional integrations print a line each as they import
        importlib.import_module(name)
    except ModuleNotFoundError as e:
      raise JaxmemError(f"`maxtext`: MaxText is installed but {name} cannot import its dependency {e.name!r}: "
                        f"{INSTALL}, which lists MaxText's dependencies") from None
  return mx


def config_path(name: str) -> str:
  """A config as given: an existing file, else one of MaxText's ``configs`` (``base.yml``)."""
  if os.path.isfile(name):
    return os.path.abspath(name)
  mx = require()
  path = os.path.join(os.path.dirname(mx.__file__), "configs", name)
  if not os.path.isfile(path):
    raise JaxmemError(f"`maxtext` config {name!r}: no such file here nor in MaxText's configs ({os.path.dirname(path)})")
  return path


def topology(target: Any) -> tuple[str, int]:
  """MaxText's ``compile_topology`` and ``compile_topology_num_slices`` for a jaxmem target."""
  if target.platform != "tpu":
    raise JaxmemError(
        f"`maxtext` compiles for TPU targets (MaxText's compile_topology), not {target.name}; pick one such as tpu:v5p-8"
    )
  from maxtext.utils import accelerator_to_spec_map

  from jaxmem.hardware.tpu import tpu_generation

  # The slice's accelerator type (v4-128), not the target's name, which carries its slices
  # (v4-128x2slices); by libtpu's name of the generation, which MaxText's table keys by
  # (utils/accelerator_to_spec_map.py: "tpu7x-128", never "v7x-128").
  name = f"{tpu_generation(target.kind.generation).libtpu_name}-{target.kind.size}"
  if name not in accelerator_to_spec_map.UserFacingNameToSystemCharacteristics:
    raise JaxmemError(f"`maxtext`: MaxText has no compile_topology {name!r} (target {target.name})")
  return name, target.slices


# ------------------------------------------------------------------------ MaxText's config


@dataclasses.dataclass(frozen=True, kw_only=True)
class Resolved:
  """What MaxText's config says of the values jaxmem shows in its rows."""

  batch: int  # global_batch_size_to_train_on
  seq: int  # max_target_length
  remat_policy: str
  attention: str
  mesh: tuple[tuple[str, int], ...]  # the mesh MaxText makes, in jaxmem's axis names
  microbatches: int  # gradient_accumulation_steps
  experts: int  # routed experts (1 for a dense model)
  version: str


class MaxTextRefused(JaxmemError):
  """MaxText's config parser refused the config: ``cause``, its error's type and first line."""

  def __init__(self, cause: str):
    self.cause = cause
    super().__init__(f"MaxText refused the config: {cause}")


def initialise(args: Sequence[str], settings: Mapping[str, str]) -> Any:
  """MaxText's config (``pyconfig.initialize``) for the config and overrides ``args`` with
  ``settings`` (the values jaxmem maps) on top, its output kept off stdout; a config MaxText
  refuses is one line."""
  return _initialise(tuple(args), tuple(sorted(settings.items())))


@functools.lru_cache(maxsize=32)
def _initialise(args: tuple[str, ...], settings: tuple[tuple[str, str], ...]) -> Any:
  require()
  from maxtext.configs import pyconfig

  given = {**overrides(args), **dict(settings)}
  # The JAX compilation cache is MaxText's run's business (base.yml turns it on, for the whole
  # process): left off unless the overrides ask for it.
  given.setdefault("jax_cache_dir", "")
  argv = ["train_compile", config_path(args[0]), *(f"{k}={v}" for k, v in given.items())]
  with quiet(), contexts():
    try:
      return pyconfig.initialize(argv)
    except (ValueError, TypeError, AssertionError, KeyError, FileNotFoundError) as e:
      raise MaxTextRefused(f"{type(e).__name__}: {_first_line(e)}") from e


def resolve(args: Sequence[str], settings: Mapping[str, str], target: Any) -> Resolved:
  """MaxText's own values at ``settings`` (the target's topology and what jaxmem maps)."""
  config = initialise(args, settings)
  from maxtext.utils import maxtext_utils

  with quiet():
    devices = maxtext_utils.create_device_mesh(config, list(target.devices))
  return Resolved(
      batch=int(config.global_batch_size_to_train_on), seq=int(config.max_target_length),
      remat_policy=str(config.remat_policy), attention=str(config.attention),
      mesh=mesh_of(dict(zip(config.mesh_axes, devices.shape, strict=True)), len(target.devices)),
      microbatches=int(config.gradient_accumulation_steps), experts=experts(config), version=version(),
  )


def note(args: Sequence[str]) -> str:
  """A MaxText row's note: what built the step, so a reader can run the same."""
  return (
      f"maxtext: MaxText {version()}'s train step (train_compile's), config {os.path.basename(args[0])} "
      f"with {' '.join(args[1:]) or 'no overrides'}, and per row its remat_policy, attention, batch, sequence and mesh; "
      "no no-remat program to compare recompute with (MaxText checkpoints every decoder layer)"
  )


def state_bytes(leaf_bytes: Mapping[str, int]) -> dict[str, int]:
  """Per-device parameter and optimizer-state bytes from the compiled step's argument leaves
  (``state.model...``, ``state.optimizer...``: MaxText's ``TrainStateNNX``), the model's random
  number generator state left out."""
  model = [n for k, n in leaf_bytes.items() if k.startswith("state.model.") and ".rngs." not in k]
  optimizer = [n for k, n in leaf_bytes.items() if k.startswith("state.optimizer.")]
  return dict(param_bytes=sum(model) if model else None, optimizer_state_bytes=sum(optimizer) if optimizer else None)


def global_params(traced: Any) -> dict[str, Any]:
  """The parameters' bytes over every device and their most common dtype, from the traced
  state's shapes (``state.model``, its generator state left out)."""
  import math
  from collections import Counter

  import jax

  from jaxmem.mesh import path_keys

  total, elements = 0, Counter()
  for path, a in jax.tree_util.tree_leaves_with_path(traced.args_info[0][0]):
    keys = path_keys(path)
    if not keys or keys[0] != "model" or "rngs" in keys or jax.dtypes.issubdtype(a.dtype, jax.dtypes.extended):
      continue
    total += -(-math.prod(a.shape) * jax.dtypes.itemsize_bits(a.dtype) // 8)
    elements[str(a.dtype)] += math.prod(a.shape)
  return dict(param_bytes_global=total or None, param_dtype=elements.most_common(1)[0][0] if elements else None)


def version() -> str:
  from importlib.metadata import version as installed

  return installed("maxtext")


# ------------------------------------------------------------------------------ the step


def make_step(*, batch: int, seq: int, remat: Any, mesh: Any, target: Any, workload: Any) -> tuple:
  """MaxText's train step at one configuration of a sweep: ``workload.maxtext`` (the config,
  its overrides and what the plan mapped), at ``batch`` and ``seq`` on ``target``, with the
  task's remat policy, attention and mesh mapped onto MaxText's options (``remat``, a
  ``jax.checkpoint`` policy, is jaxmem's and unused: MaxText builds its own from the name)."""
  settings = task_settings(workload, target, batch=batch, seq=seq, mesh=tuple(
      (str(a), int(s)) for a, s in zip(mesh.axis_names, mesh.devices.shape, strict=True)))
  config = initialise(workload.maxtext, settings)
  return build(config, target)


def task_settings(w: Any, target: Any, *, batch: int, seq: int, mesh: tuple[tuple[str, int], ...]) -> dict[str, str]:
  """The MaxText options one task sets (the table's rows a sweep sets per configuration): the
  topology, batch, sequence, microbatches, policy, attention, the mesh (over several slices, where
  it is not MaxText's own: the slices' split is the overrides' then) and, where given and where
  they apply, the rest (the context strategy, the pipeline schedule)."""
  name, slices = topology(target)
  at = At(mesh=mesh, devices=target.num_devices, slices=slices, microbatches=w.microbatches[0],
          attention=attention(w.attention[0]), layers=_layers(w, target, mesh))
  out: dict[str, object] = dict(compile_topology=name, compile_topology_num_slices=slices)
  out.update(per_device_batch(batch, at))
  out.update(row("seq").write(seq, at))
  out.update(row("microbatches").write(w.microbatches[0], at))
  out.update(maxtext_remat(w.remat[0]))
  out.update(row("attention").write(w.attention[0], at))
  if slices == 1 or dict(mesh) != dict(own_mesh(w.maxtext, target)):
    out.update(mesh_settings(mesh, at))
  for r in ROWS.values():
    if r.when_given:
      out.update(r.write(given_value(w, r.name), at))
  return {k: text(v) for k, v in out.items()}


def given_value(w: Any, name: str) -> Any:
  """A workload's one value of the axis ``name``, None where it is at its default (or empty):
  MaxText's own."""
  axis = AXES[name]
  return None if getattr(w, name) == axis.normalise(axis.default) else axis.first(w)


def own_mesh(args: Sequence[str], target: Any) -> tuple[tuple[str, int], ...]:
  """The mesh MaxText's config makes of ``args`` on ``target``'s topology."""
  name, slices = topology(target)
  return resolve(args, dict(compile_topology=name, compile_topology_num_slices=str(slices)), target).mesh


def _layers(w: Any, target: Any, mesh: tuple[tuple[str, int], ...]) -> int | None:
  """MaxText's decoder layers, where a pipeline schedule given over a stage axis needs them."""
  if dict(mesh).get("stage", 1) < 2 or given_value(w, "pipeline_repeats") is None:
    return None
  name, slices = topology(target)
  config = initialise(w.maxtext, dict(compile_topology=name, compile_topology_num_slices=str(slices)))
  return int(config.num_decoder_layers)


def build(config: Any, target: Any) -> tuple:
  """``(fn, args, {})``: MaxText's ``train_step`` jitted with its shardings, as ``train_compile``
  makes it (MaxText 0.2.5, ``train_compile.main`` without DiLoCo), on ``target``'s devices."""
  if config.enable_diloco:
    raise JaxmemError("`maxtext` with enable_diloco has no mapping in jaxmem (train_compile's DiLoCo step)")
  import jax
  from jax.sharding import AxisType, Mesh
  from maxtext.common.common_types import ShardMode
  from maxtext.trainers.pre_train import train, train_compile
  from maxtext.utils import maxtext_utils, sharding

  axis_type = AxisType.Explicit if config.shard_mode == ShardMode.EXPLICIT else AxisType.Auto
  with quiet(), contexts(config):
    devices = maxtext_utils.create_device_mesh(config, list(target.devices))
    mesh = Mesh(devices, config.mesh_axes, axis_types=(axis_type,) * len(config.mesh_axes))
    args, kwargs, state_shardings, _, model = train_compile.get_shaped_inputs(mesh, config)
    params_shardings, state_shardings = sharding.maybe_update_params_sharding_with_opt(config, state_shardings)
    input_shardings = sharding.build_zero1_input_state_mesh_shardings(config, state_shardings, params_shardings)
    data_sharding = sharding.get_input_data_sharding(config, mesh)
    fn, in_shard, out_shard, static, donate = maxtext_utils.get_functional_train_with_signature(
        train.train_step, data_sharding, input_shardings, model, config, params_shardings
    )
  if kwargs:
    raise JaxmemError("`maxtext`: this MaxText's train step takes keyword inputs, which jaxmem does not map")
  jitted = jax.jit(fn, in_shardings=in_shard, out_shardings=out_shard, static_argnums=static, donate_argnums=donate)
  return TrainStep(jitted, config=config, mesh=mesh), tuple(args), {}


class TrainStep:
  """MaxText's jitted ``train_step``, traced under the contexts ``train_compile`` traces it in
  (``jax.set_mesh`` cannot be entered inside a trace, so the step is traced, not called, in
  them). jaxmem's :func:`~jaxmem.compiler.analysis.lower_for_target` takes it as a function
  already jitted (it has ``trace`` and ``lower``)."""

  def __init__(self, jitted: Any, *, config: Any, mesh: Any):
    self._jitted, self._config, self._mesh = jitted, config, mesh
    self.__name__ = self.__qualname__ = "train_step"

  def __call__(self, state: Any, batch: Any) -> Any:
    with self._contexts():
      return self._jitted(state, batch)

  def trace(self, *args: Any) -> Any:
    with self._contexts():
      return self._jitted.trace(*args)

  def lower(self, *args: Any) -> Any:
    with self._contexts():
      return self._jitted.lower(*args)

  @contextlib.contextmanager
  def _contexts(self) -> Iterator[None]:
    import jax
    from flax.core.spmd import logical_axis_rules

    with contexts(self._config), jax.set_mesh(self._mesh), logical_axis_rules(self._config.logical_axis_rules):
      yield


@contextlib.contextmanager
def contexts(config: Any = None) -> Iterator[None]:
  """The JAX settings ``train_compile`` makes for the whole process, here for the build and the
  trace only: ``unsafe_rbg`` keys (``train_compile.main``) and, with a config, its
  ``remove_size_one_mesh_axis_from_type`` (``get_topology_mesh``)."""
  import jax

  with contextlib.ExitStack() as stack:
    # jax's own context managers for these two flags (jax.config.update would set them for good)
    stack.enter_context(jax.default_prng_impl("unsafe_rbg"))
    if config is not None:
      stack.enter_context(jax.remove_size_one_mesh_axis_from_type(config.remove_size_one_mesh_axis_from_type))
    yield


@contextlib.contextmanager
def quiet() -> Iterator[None]:
  """MaxText's prints on stderr: jaxmem's stdout is its result."""
  with contextlib.redirect_stdout(sys.stderr):
    yield


def _first_line(e: BaseException) -> str:
  text = str(e).strip()
  return text.splitlines()[0] if text else type(e).__name__


# ------------------------------------------------------------------ MaxText's model, in jaxmem's terms


def model_config(config: Any) -> Any:
  """A Llama-shaped :class:`~jaxmem.models.ModelConfig` of MaxText's dimensions (``emb_dim``,
  ``mlp_dim``, ``num_query_heads``, ``num_kv_heads``, ``head_dim``, ``num_decoder_layers``,
  ``vocab_size``, as its config derives them): what jaxmem's closed forms (parameters, FLOPs,
  activations) take. Only an estimate of MaxText's model: its decoder block's own features
  (MoE, local attention, norms) are not in it."""
  from jaxmem.models.config import ModelConfig

  return ModelConfig(
      name=f"maxtext:{config.model_name}", style="llama3", vocab_size=int(config.vocab_size),
      d_model=int(config.emb_dim), num_layers=int(config.num_decoder_layers), num_heads=int(config.num_query_heads),
      num_kv_heads=int(config.num_kv_heads), head_dim=int(config.head_dim), d_ff=int(config.mlp_dim),
      max_seq_len=int(config.max_target_length), tie_embeddings=bool(config.logits_via_embedding),
      norm_eps=float(config.normalization_layer_epsilon), rope_theta=float(config.rope_max_timescale),
      param_dtype=_dtype_name(config.weight_dtype), dtype=_dtype_name(config.dtype),
  )


def experts(config: Any) -> int:
  """MaxText's routed experts (1 for a dense model)."""
  return max(1, int(getattr(config, "num_experts", 1) or 1))


def _dtype_name(dtype: Any) -> str:
  import numpy as np

  return np.dtype(dtype).name


# What MaxText's train loop holds beside its train step, read from its source (MaxText 0.2.5):
# maxtext/common/data_loader.py, DataLoader.load_next_batch, puts each step's batch on the device
# with jax.device_put (the previous one freed when the loop rebinds it), and
# maxtext/trainers/pre_train/train.py, train_loop, loads the initialisation program
# (train_utils.setup_train_loop), the eval step where eval_interval > 0, and jax.jit helpers
# (jax.random.fold_in under DiLoCo) beside the train step, whose state it donates
# (maxtext_utils.get_functional_train_with_signature). The buffers are the step's own arguments;
# the other programs are evicted when buffers need room (openxla/xla docs/errors/error_0101.md).
LOOP_BATCH_SOURCE = ("MaxText 0.2.5 maxtext/common/data_loader.py (DataLoader.load_next_batch: jax.device_put of each "
                     "step's batch; the previous one freed when the loop rebinds it)")
LOOP_PROGRAMS_SOURCE = (
    "MaxText 0.2.5 maxtext/trainers/pre_train/train.py (train_loop: the initialisation program of "
    "train_utils.setup_train_loop, the eval step where eval_interval > 0, jax.jit(jax.random.fold_in) under DiLoCo, "
    "beside the train step); evicted for buffers, each reloads into its own contiguous block "
    "(openxla/xla docs/errors/error_0101.md): their size is not known without compiling them")


def loop_terms(argument_bytes: Mapping[str, int]) -> tuple[dict[str, dict], int]:
  """The terms MaxText's train loop adds to its step's runtime account
  (:func:`jaxmem.hardware.runtime.with_job`), and the bytes of the step's arguments they move:
  the batch, put on the device anew each step, is a per-step buffer."""
  batch = argument_bytes.get("batch", 0)
  return {
      "batch (MaxText's loop: put anew each step)": runtime.term(runtime.STEP_HEAP, batch, LOOP_BATCH_SOURCE),
      "programs loaded besides the step (MaxText's loop)": runtime.term(runtime.PROGRAMS, None, LOOP_PROGRAMS_SOURCE),
  }, batch
