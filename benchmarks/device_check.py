"""The device check: the compiler's predicted peak against the allocator's
measured peak on the one accelerator attached, for two models x three remat policies with the
target's default attention (``auto``: cuDNN on a GPU, splash on a TPU).

Run, on the lent machine, from the repository root (nothing is downloaded: the package goes in
over the jax already installed there):

    python -m pip install --no-deps -e . && python benchmarks/device_check.py --output device_check.md

``--dry-run`` lists the configurations and their arguments without running anything (it needs no
accelerator: the test suite runs it on the CPU). Each configuration is ``jaxmem validate``'s
(:func:`jaxmem.planning.validate.validate`): a fresh process builds real parameters and optimizer
state, compiles the step on the device (``predicted``: that compile's ``peak_memory_in_bytes``),
runs ``--steps`` steps and reads ``memory_stats()["peak_bytes_in_use"]`` (``measured``: the
allocator's high-water mark, initialisation and its own overhead included). ``cuDNN workspace`` is
the largest scratch buffer a cuDNN call of the on-device compile asks for (XLA sizes it when it
builds the cuDNN graph on the GPU; a compile without a GPU leaves it 0). Sizes were chosen to run
in about 5 minutes on one H200 (141 GB): GPT-2 small at batch 8 x 1024 and Llama 3.2 1B at batch
4 x 2048, AdamW, f32 master weights, bf16 compute. Once ``--budget-s`` has passed, the
configurations left are written as skipped rather than started.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

# (model, batch, seq): both fit one H200 without remat (Llama 3.2 1B's AdamW step about 45 GB).
CASES: tuple[tuple[str, int, int], ...] = (("gpt2-small", 8, 1024), ("llama3-1b", 4, 2048))
REMATS: tuple[str, ...] = ("none", "minimal", "full")
COLUMNS = ("model", "remat", "attention", "batch", "seq", "predicted GiB", "measured GiB", "measured / predicted",
           "cuDNN workspace MiB", "loss", "error")
GIB, MIB = 2**30, 2**20


@dataclasses.dataclass(frozen=True, kw_only=True)
class Case:
  """One model's workload: its remat policies are validated in one ``validate`` call."""

  model: str
  batch: int
  seq: int
  remats: tuple[str, ...]

  def fields(self) -> dict[str, Any]:
    # validate puts "none" first itself; the others are named after it.
    return dict(model=self.model, batch=self.batch, seq=self.seq, remat=",".join(r for r in self.remats if r != "none"))


def cases(models: Sequence[tuple[str, int, int]] = CASES, remats: Sequence[str] = REMATS) -> list[Case]:
  """One case per model; ``none`` first, as validate runs it (its baseline) whether named or not."""
  policies = ("none", *(r for r in remats if r != "none"))
  return [Case(model=m, batch=b, seq=s, remats=policies) for m, b, s in models]


def planned(cs: Sequence[Case], target: str) -> list[dict[str, Any]]:
  """The configurations the check runs, planned for ``target`` (a target name: on the device
  validate plans for ``attached``), without compiling anything."""
  from jaxmem.resolve import plan
  from jaxmem.program.sharding import format_mesh
  from jaxmem.program.train import pick_attention
  from jaxmem.workload import Workload

  out = []
  for c in cs:
    p = plan(Workload.of(None, {}, target=target, **c.fields()))
    for t in p.tasks():  # the configurations validate runs, in its order
      out.append(dict(model=p.cfg.name, remat=t.remat, attention=_attention(pick_attention, t.attention, p, dict(t.mesh)),
                      batch=p.batch, seq=p.seq, mesh=format_mesh(t.mesh), optimizer=t.optimizer,
                      microbatches=t.microbatches))
  return out


def _attention(pick: Any, attention: str, p: Any, mesh: Any) -> str:
  """``auto`` resolved for the target, as the train step resolves it (no compile)."""
  return pick(attention, p.cfg, batch=p.batch, seq=p.seq, target=p.target, mesh=mesh).name


class _OutOfTime(Exception):
  """Raised from validate's callback to start no further configuration."""


def measure(cs: Sequence[Case], *, steps: int, budget_s: float, progress: Any = None) -> list[dict[str, Any]]:
  """Runs every case on the attached device (one process per configuration) and returns a
  record per configuration; once ``budget_s`` has passed, no configuration is started and those
  left are records saying so."""
  from jaxmem.planning.validate import validate

  start, out = time.monotonic(), []
  for i, c in enumerate(cs):
    done: list[Any] = []

    def seen(measurement: Any, c: Case = c, done: list[Any] = done) -> None:
      done.append(measurement)
      if progress is not None:
        progress(record(measurement), time.monotonic() - start)
      if time.monotonic() - start > budget_s and len(done) < len(c.remats):
        raise _OutOfTime

    if i == 0 or time.monotonic() - start <= budget_s:  # the first always runs
      try:
        validate(**c.fields(), steps=steps, on_row=seen)
      except _OutOfTime:
        pass
    out += [record(m) for m in done]
    out += [dict(model=c.model, remat=r, batch=c.batch, seq=c.seq, error=f"skipped: past --budget-s {budget_s:g}")
            for r in c.remats[len(done):]]
  return out


def record(m: Any) -> dict[str, Any]:
  """A :class:`~jaxmem.planning.validate.Measurement` as the table's record (bytes kept)."""
  d = m.as_dict()
  return {k: d.get(k) for k in ("model", "remat", "attention", "batch", "seq", "predicted_bytes", "measured_bytes",
                                "ratio", "cudnn_workspace_bytes", "loss", "error", "notes")}


def table(records: Sequence[dict[str, Any]], *, device: str = "") -> str:
  """The records as a markdown table (GiB, MiB), with a heading naming the device."""
  def num(v: Any, unit: float, fmt: str = "{:,.2f}") -> str:
    return "-" if v is None else fmt.format(v / unit)

  lines = [f"device check{f' on {device}' if device else ''}: predicted (compiled on the device) vs measured peak",
           "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
  for r in records:
    cells = [r.get("model"), r.get("remat"), r.get("attention") or "-", r.get("batch"), r.get("seq"),
             num(r.get("predicted_bytes"), GIB), num(r.get("measured_bytes"), GIB), num(r.get("ratio"), 1, "{:.3f}"),
             num(r.get("cudnn_workspace_bytes"), MIB), num(r.get("loss"), 1, "{:.3f}"), r.get("error") or ""]
    lines.append("| " + " | ".join(str(c) for c in cells) + " |")
  return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--steps", type=int, default=3, help="train steps per configuration (default 3)")
  ap.add_argument("--remat", default=",".join(REMATS), help=f"remat policies (default {','.join(REMATS)})")
  ap.add_argument("--budget-s", type=float, default=390.0,
                  help="start no configuration after this many seconds (default 390: the last ends before 8 minutes)")
  ap.add_argument("--output", default=None, help="also write the markdown table here")
  ap.add_argument("--json", default=None, help="write the records (bytes) as JSON here")
  ap.add_argument("--dry-run", action="store_true", help="list the configurations for --plan-target; run nothing")
  ap.add_argument("--plan-target", default="gpu:h200", help="the target --dry-run plans for (default gpu:h200)")
  args = ap.parse_args(argv)
  cs = cases(remats=[r.strip() for r in args.remat.split(",") if r.strip()])
  if args.dry_run:
    rows = planned(cs, args.plan_target)
    print(json.dumps(rows, default=str, indent=1))
    print(f"{len(rows)} configurations; on the device: python benchmarks/device_check.py --output device_check.md",
          file=sys.stderr)
    return 0
  import jax

  from jaxmem.errors import JaxmemError

  device = f"{jax.devices()[0].device_kind} (jax {jax.__version__})"
  progress = lambda r, t: print(f"[{t:5.0f} s] {r['model']} {r['remat']}: {r.get('ratio')} {r.get('error') or ''}",  # noqa: E731
                                file=sys.stderr, flush=True)
  try:
    records = measure(cs, steps=args.steps, budget_s=args.budget_s, progress=progress)
  except JaxmemError as e:  # no accelerator attached, above all
    print(f"device_check: error: {e}", file=sys.stderr)
    return 2
  text = table(records, device=device)
  print(text)
  if args.output:
    with open(args.output, "w") as f:
      f.write(text + "\n")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(device=device, records=records), f, indent=1, default=str)
  return 0 if all(not r.get("error") for r in records) else 1


if __name__ == "__main__":
  sys.exit(main())
