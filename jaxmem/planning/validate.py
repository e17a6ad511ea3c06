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
import subprocess
import sys
from typing import Any

import jax

from jaxmem.program import sharding as shd
from jaxmem.records import Record
from jaxmem.errors import JaxmemError
from jaxmem.compiler.report import read_compiled
from jaxmem.planning.sweep import Plan
from jaxmem.program.train import build_train_program

NEEDS_ACCELERATOR = (
    "validate runs real train steps and needs an attached TPU or GPU (this machine has none); "
    "use `jaxmem compare` for the compiler's prediction"
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Measurement(Record):
  model: str
  target: str
  mesh: str
  remat: str
  optimizer: str
  batch: int
  seq: int
  steps: int
  predicted_bytes: int | None  # compiler's peak per device (total_bytes where no peak)
  measured_bytes: int | None  # max over local devices of peak_bytes_in_use
  ratio: float | None  # measured / predicted
  loss: float | None  # last step's loss: the step really ran
  error: str | None = None
  notes: tuple[str, ...] = ()


def measure(p: Plan, mesh: shd.MeshSpec, opt, rp, *, steps: int = 3) -> Measurement:
  """Runs one configuration in this process. Call it in a fresh process for a clean peak."""
  program = build_train_program(p.cfg, remat=rp, optimizer=opt, batch=p.batch, seq=p.seq, target=p.target, mesh=mesh)
  compiled = program.trace().lower().compile()
  predicted = read_compiled(compiled).required_bytes
  params, state, tokens, targets = program.concrete_args()
  loss = None
  for _ in range(steps):
    params, state, loss = compiled(params, state, tokens, targets)
  loss = float(jax.device_get(loss))
  notes: list[str] = []
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
      model=p.cfg.name,
      target=p.target.name,
      mesh=shd.format_mesh(mesh),
      remat=rp.name,
      optimizer=opt.name,
      batch=p.batch,
      seq=p.seq,
      steps=steps,
      predicted_bytes=predicted,
      measured_bytes=measured,
      ratio=ratio,
      loss=loss if math.isfinite(loss) else None,
      notes=tuple(notes),
  )


def measure_in_subprocess(argv: list[str]) -> dict[str, Any]:
  """Runs `python -m jaxmem _measure ARGV` and returns its JSON measurement."""
  proc = subprocess.run([sys.executable, "-m", "jaxmem", "_measure", *argv], capture_output=True, text=True, check=False)
  lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
  if proc.returncode != 0 or not lines:
    err = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"measurement process failed (exit {proc.returncode}): {err}"}
  return json.loads(lines[-1])


def require_accelerator(platform: str) -> None:
  if platform == "cpu":
    raise JaxmemError(NEEDS_ACCELERATOR)
