"""jaxmem: will this fit, what is eating the memory, and what do I change?

Memory figures read from the XLA compiler itself for JAX programs, per device, for CPU, TPU and
GPU targets, with abstract inputs (nothing is allocated).

>>> import jax, jax.numpy as jnp, jaxmem
>>> x = jax.ShapeDtypeStruct((1024, 1024), jnp.float32)
>>> report = jaxmem.analyze(lambda a: a @ a, x)
>>> report.argument_size_in_bytes
4194304
"""

from jaxmem._quiet import quiet as _quiet

with _quiet():
  # Importing jax loads the TPU and CUDA plugins, which print start-up noise on machines
  # without the hardware; keep it off the user's terminal.
  import jax as _jax  # noqa: F401

# Nothing here configures JAX or the environment: the functions below start JAX on first use
# (jaxmem/hardware/startup.py), so importing jaxmem leaves the user's process as it was.
from jaxmem.compiler.analysis import analyze  # noqa: E402
from jaxmem.steptime import OpTime, OpTimes, op_times  # noqa: E402
from jaxmem.compiler.report import MemoryReport  # noqa: E402
from jaxmem.hardware.targets import Target, target  # noqa: E402
from jaxmem.errors import BadValue, JaxmemError, NotAResult, NotComparable, UnknownField  # noqa: E402
from jaxmem.events import Compiling, JaxmemWarning, Notice, listen  # noqa: E402
from jaxmem.buffers.analyse import Explanation  # noqa: E402
from jaxmem.planning.refusal import RefusalExplanation, explain  # noqa: E402
from jaxmem.render.timeline import plot_timeline, timeline_text  # noqa: E402
from jaxmem.planning.estimate import Estimate, estimate  # noqa: E402
from jaxmem.inference.infer import InferRow, infer  # noqa: E402
from jaxmem.inference.serving import TRAINING_ONLY, ServingFit, fit_serving  # noqa: E402
from jaxmem.options import RunOptions, Started  # noqa: E402
from jaxmem.cache import RowCache  # noqa: E402
from jaxmem.planning.fit import FitResult, fit  # noqa: E402
from jaxmem.planning.scale import Scaling, scale  # noqa: E402
from jaxmem.planning.planner import plan  # noqa: E402
from jaxmem.planning.search import PlanResult  # noqa: E402
from jaxmem.maxtext.emit import MaxTextLaunch, maxtext_overrides  # noqa: E402
# MaxText's planner, registered with jaxmem.resolve (STEP_PLANNERS) as its module is imported.
from jaxmem.maxtext import plan as _maxtext_plan  # noqa: E402,F401
from jaxmem.planning.sweep import Row, compare, with_overheads  # noqa: E402
# The registries' modules as attributes, as the README spells them (jaxmem.remat.REMAT_POLICIES).
from jaxmem.program import optimizers, remat  # noqa: E402
# The parsers of every value from outside (flags, variables, config.json fields), which the CLI's flags use.
from jaxmem import inputs  # noqa: E402
from jaxmem.program.sharding import fsdp_shardings  # noqa: E402
from jaxmem.program.optimizers import OPTIMIZERS  # noqa: E402
from jaxmem.program.remat import REMAT_POLICIES  # noqa: E402
from jaxmem.render.diff import diff  # noqa: E402
from jaxmem.render.table import table  # noqa: E402
from jaxmem.versions import __version__  # noqa: E402
from jaxmem.workload import Workload  # noqa: E402
from jaxmem.axes import AXES, Axis  # noqa: E402

# What the command line (jaxmem/cli, which imports only this package's names and jaxmem.render)
# calls besides the functions above: sweep callbacks' plan, the row cache, process start-up, the
# extra sections and plots of compare, infer and scale, listings and versions.
from jaxmem.buffers.residuals import saved_residuals_by_policy  # noqa: E402
from jaxmem.hardware.startup import start_distributed, start_jax, started  # noqa: E402
from jaxmem.hardware.targets import cpu_devices_needed, default_target_name, list_targets  # noqa: E402
from jaxmem.planning.estimate import estimate_vs_compiler, estimates  # noqa: E402
from jaxmem.inference.infer import InferWorkload, kv_cache_table, training_vs_inference  # noqa: E402
from jaxmem.render.infer_plot import plot as plot_inference  # noqa: E402
from jaxmem.models import PRESETS, ModelConfig, attention_help, count_active_params, count_params, load_model  # noqa: E402
from jaxmem.planning.fit import rank_configurations  # noqa: E402
from jaxmem.resolve import Plan  # noqa: E402
from jaxmem.planning.tensors import TensorSearchResult  # noqa: E402
from jaxmem.planning.tensors import search as remat_search  # noqa: E402
from jaxmem.render.scale_plot import plot as plot_scaling  # noqa: E402
from jaxmem.planning.validate import measure_one, validate  # noqa: E402
from jaxmem.versions import compiler_versions  # noqa: E402

__all__ = [
    "AXES",
    "Axis",
    "PRESETS",
    "TRAINING_ONLY",
    "InferWorkload",
    "ModelConfig",
    "Plan",
    "attention_help",
    "compiler_versions",
    "count_active_params",
    "count_params",
    "cpu_devices_needed",
    "default_target_name",
    "estimate_vs_compiler",
    "estimates",
    "kv_cache_table",
    "list_targets",
    "load_model",
    "measure_one",
    "plot_inference",
    "plot_scaling",
    "rank_configurations",
    "remat_search",
    "saved_residuals_by_policy",
    "start_distributed",
    "start_jax",
    "started",
    "training_vs_inference",
    "validate",
    "with_overheads",
    "OPTIMIZERS",
    "REMAT_POLICIES",
    "BadValue",
    "Compiling",
    "Estimate",
    "Explanation",
    "RefusalExplanation",
    "FitResult",
    "InferRow",
    "JaxmemError",
    "JaxmemWarning",
    "MaxTextLaunch",
    "MemoryReport",
    "NotAResult",
    "NotComparable",
    "Notice",
    "OpTime",
    "OpTimes",
    "PlanResult",
    "Row",
    "RowCache",
    "RunOptions",
    "Scaling",
    "ServingFit",
    "Started",
    "Target",
    "TensorSearchResult",
    "UnknownField",
    "Workload",
    "__version__",
    "analyze",
    "compare",
    "diff",
    "estimate",
    "explain",
    "fit",
    "fit_serving",
    "fsdp_shardings",
    "infer",
    "inputs",
    "listen",
    "maxtext_overrides",
    "op_times",
    "optimizers",
    "plan",
    "plot_timeline",
    "remat",
    "scale",
    "table",
    "target",
    "timeline_text",
]

# Serving as the engines run it (issue 42; the `serving` branch): an engine's capacity rule
# (--engine), the KV cache's stored dtype (--kv-cache-dtype) and the launch writers (--emit).
from jaxmem.inference.engines import EMITTERS as ENGINE_EMITTERS  # noqa: E402
from jaxmem.inference.engines import ENGINES, EngineCapacity, EngineSettings, engine_capacity  # noqa: E402
from jaxmem.inference.kv import KV_CACHE_DTYPES  # noqa: E402
from jaxmem.launch import Emitter, Launch, emitters, taking  # noqa: E402
from jaxmem.maxtext.search import EMITTER as _MAXTEXT_EMITTER  # noqa: E402

# Every --emit writer, by name: the serving engines' serve commands and MaxText's overrides.
EMITTERS = emitters(ENGINE_EMITTERS, (_MAXTEXT_EMITTER,))

__all__ += [
    "EMITTERS", "ENGINES", "ENGINE_EMITTERS", "KV_CACHE_DTYPES", "Emitter", "EngineCapacity", "EngineSettings",
    "Launch", "emitters", "engine_capacity", "taking",
]
