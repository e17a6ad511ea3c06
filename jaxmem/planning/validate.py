"""Check the prediction against reality on attached devices.

For each configuration, a fresh process initialises real parameters and optimizer state, runs a
few train steps and reads ``device.memory_stats()["peak_bytes_in_use"]`` (the allocator's high
water mark, which cannot be reset, hence one process per configuration). The prediction is the
compiler's ``peak_memory_in_bytes`` for the same program (``total_bytes`` where the backend has
no peak). The measured peak includes initialisation and the allocator's own overhead.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
import sys
from typing import Any

import jax

from jaxmem.compiler.figures import compile_figures
from jaxmem.compiler.report import Refusal
from jaxmem.hardware.startup import start_distributed, start_jax
from jaxmem.hardware.targets import get_target
from jaxmem.errors import JaxmemError
from jaxmem.options import RunOptions
from jaxmem.resolve import Plan, build_program, configuration, for_task, one_of_each, plan
from jaxmem.program import sharding as shd
from jaxmem.program.optimizers import Optimizer
from jaxmem.program.remat import RematPolicy
from jaxmem.records import Configuration
from jaxmem.workload import Workload

NEEDS_ACCELERATOR = (
    "validate runs real train steps and needs an attached TPU or GPU (this machine has none); "
    "use `jaxmem compare` for the compiler's prediction"
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Measurement(Configuration):
  """One configuration run for real: the compiler's prediction and the allocator's peak."""

  steps: int
  predicted_bytes: int | None  # compiler's peak per device (total_bytes where no peak)
  measured_bytes: int | None  # max over local devices of peak_bytes_in_use
  ratio: float | None  # measured / predicted
  loss: float | None  # last step's loss: the step really ran
  error: str | None = None
  # The largest scratch buffer a cuDNN call of the program compiled on this device asks for
  # (None: no cuDNN call). A compile without a GPU leaves it u8[0], so the prediction lacks it.
  cudnn_workspace_bytes: int | None = None
  notes: tuple[str, ...] = ()


# validate's workload runs where it is: on the attached devices.
ATTACHED = {"target": "attached"}


def measure(p: Plan, mesh: shd.MeshSpec, opt: Optimizer, rp: RematPolicy, *, steps: int = 3) -> Measurement:
  """Runs one configuration in this process (``p``'s first value of every other axis: a task's
  plan, :func:`jaxmem.resolve.for_task`, has its own). Call it in a fresh process for a clean
  peak."""
  program = build_program(p, mesh, opt, rp)
  outcome = compile_figures(program.trace(), p.target, args=None if p.workload.always_compile else program.args,
                            lowering_context=program.lowering_context())
  if isinstance(outcome, Refusal):  # nothing to run: the prediction is that it does not fit
    raise JaxmemError(f"validate: configuration {rp.name}, {opt.name}, mesh {shd.format_mesh(mesh)} was refused: {outcome.error}")
  compiled, predicted = outcome.compiled, outcome.required_bytes
  workspace = cudnn_workspace_bytes(compiled.as_text() or "")
  params, state, tokens, targets, *key = program.concrete_args()  # key: the step's PRNG key, where it takes one
  loss = None
  for _ in range(steps):
    params, state, loss = compiled(params, state, tokens, targets, *key)
  loss = float(jax.device_get(loss))
  notes: list[str] = list(program.notes)
  measured = None
  peaks = []
  for d in jax.local_devices():
    s = d.memory_stats() if d.platform != "cpu" else None
    if s and "peak_bytes_in_use" in s:
      peaks.append(int(s["peak_bytes_in_use"]))
  if peaks:
    measured = max(peaks)
  else:
    notes.append(f"{jax.local_devices()[0].platform} devices report no peak_bytes_in_use")
  ratio = None if not (measured and predicted) else measured / predicted
  return Measurement(
      **configuration(p, mesh, opt, rp, program),
      steps=steps,
      predicted_bytes=predicted,
      measured_bytes=measured,
      ratio=ratio,
      loss=loss if math.isfinite(loss) else None,
      cudnn_workspace_bytes=workspace,
      notes=tuple(notes),
  )


# A cuDNN custom call returns its outputs then its scratch, a u8 array, last in the tuple
# (XLA's cudnn_custom_call_rewriter / the fused attention thunk's workspace operand).
_CUDNN_CALL = re.compile(r"=\s*\((?P<shapes>[^=]*?)\)\s*custom-call\(.*custom_call_target=\"__cudnn")
_SCRATCH = re.compile(r"u8\[(\d+)\]\{0\}\s*$")


def cudnn_workspace_bytes(hlo_text: str) -> int | None:
  """The largest workspace of the cuDNN custom calls in an optimized module's text, None for a
  module without one."""
  sizes = []
  for line in hlo_text.splitlines():
    m = _CUDNN_CALL.search(line)
    if m:
      scratch = _SCRATCH.search(m.group("shapes"))
      sizes.append(int(scratch.group(1)) if scratch else 0)
  return max(sizes) if sizes else None


def validation_plan(workload: Workload, *, distributed: bool = False) -> Plan:
  """The workload on the attached devices; a one-line error where none is attached."""
  if workload.target != "attached":
    raise JaxmemError(f"validate runs on the attached devices, not {workload.target_name}; drop `target`")
  if workload.slices != 1:
    raise JaxmemError("validate runs on the attached devices, the slices they are; drop `slices`")
  if workload.compiler:
    raise JaxmemError("validate runs real steps on the attached devices with the compiler this process loads; drop "
                      "`compiler` (compare takes it)")
  # Each configuration of the sweep is measured; the outer axes (the model's config) take one value.
  one_of_each(workload, "validate")
  if distributed:
    start_distributed()
  start_jax()
  require_accelerator(get_target("attached").platform)
  return plan(workload, target="attached", slices=1)


def measure_one(workload: Workload, *, steps: int = 3, distributed: bool = False) -> Measurement:
  """The measurement of a workload of one configuration (its remat policy, not the baseline)."""
  p = validation_plan(workload, distributed=distributed)
  ((mesh, opt, rp),) = [c for c in p.configs() if c[2].name == workload.remat[-1]]
  return measure(p, mesh, opt, rp, steps=steps)


def argv(workload: Workload) -> list[str]:
  """The CLI flags that describe ``workload`` (one flag per field, named after it), for the
  measuring process. The model is given by name: a preset or a config file."""
  out: list[str] = []
  for f in dataclasses.fields(workload):
    v = getattr(workload, f.name)
    if f.name in ("target", "slices") or v is None or v in ((), (None,)):
      continue
    if isinstance(v, bool):  # a switch (--sequence-parallel): given when on
      if v:
        out.append(f"--{f.name.replace('_', '-')}")
      continue
    if f.name == "model":
      v = workload.model_name
    elif isinstance(v, tuple):
      v = ",".join(map(str, v))
    out.append(f"--{f.name.replace('_', '-')}={v}")
  return out


def validate(
    workload: Workload | None = None,
    /,
    *,
    steps: int = 3,
    distributed: bool = False,
    run: RunOptions | None = None,
    **fields: Any,
) -> list[Measurement]:
  """Runs every configuration of ``workload`` (``fields`` replaced) for ``steps`` real steps on
  the attached devices, each in a fresh process (the allocator's peak cannot be reset), and
  holds the measured peak against the compiler's prediction. ``run`` (or its fields as
  keywords, :class:`jaxmem.options.RunOptions`): ``on_start`` is told the number of
  configurations, ``on_row`` each measurement as it finishes; ``jobs``, ``scheduler`` and
  ``cache`` are refused (the devices measure one configuration at a time, and a measurement is
  never cached)."""
  run = RunOptions.of(run, fields)
  run.refuse("validate", "it measures one configuration at a time on the attached devices, and caches nothing",
             "jobs", "scheduler", "cache")
  if steps < 1:
    raise JaxmemError(f"`steps` must be at least 1 (got {steps})")
  p = validation_plan(Workload.of(workload, ATTACHED, **fields), distributed=distributed)
  out: list[Measurement] = []
  tasks = p.tasks()
  run.start(len(tasks), p.cfg)
  for task in tasks:
    one, mesh, opt, rp = for_task(p, task)
    # The measuring process is given the model by name (its flags), as asked of this one.
    asked = task.workload.replace(model=p.workload.model_name)
    out.append(measure_in_subprocess(asked, configuration(one, mesh, opt, rp), steps=steps))
    run.row(out[-1])
  return out


def measure_in_subprocess(workload: Workload, configuration: dict[str, Any], *, steps: int) -> Measurement:
  """Runs `python -m jaxmem _measure` for one configuration and reads its JSON measurement; a
  failed process is a measurement with ``error`` set."""
  cmd = [sys.executable, "-m", "jaxmem", "_measure", *argv(workload), f"--steps={steps}"]
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
  lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
  if proc.returncode != 0 or not lines:
    err = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return Measurement(
        **configuration, steps=steps, predicted_bytes=None, measured_bytes=None, ratio=None, loss=None,
        error=f"measurement process failed (exit {proc.returncode}): {err}",
    )
  d = json.loads(lines[-1])
  return Measurement(**{**d, "notes": tuple(d.get("notes") or ())})


def require_accelerator(platform: str) -> None:
  if platform == "cpu":
    raise JaxmemError(NEEDS_ACCELERATOR)
