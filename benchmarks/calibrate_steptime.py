"""Calibration of jaxmem's simulated step time against published runs with measured step times.

Each run is a case of ``benchmarks/published_runs.py`` (its configuration as jaxmem arguments and
its source there) with the step time it was measured at:

- MaxText's reference configurations on v5e-256 and v5p-128 (MaxText/configs/v5e/README.md and the
  performance-results page): their TFLOP/s per chip are published, so the measured step is the
  model FLOPs per chip over that rate. MaxText formed those figures with the attention term not
  halved for the causal mask (its accounting before July 2025), so the same count is used here.
  The model is MaxText's default decoder at ``global_parameter_scale`` k (base emb 2048, 16 heads
  of 128, mlp 7168, 16 layers; k = 2^(3b + r): heads and mlp x 2^(b + (r > 0)), emb x
  2^(b + (r > 1)), layers x 2^b, MaxText's pyconfig), and the compile is MaxText's own step.
- MaxText's deepseek2-16b on v5p-8 (5.667 s/step, its logs guide), tpu-recipes' Llama 3.1 70B on
  v6e-256 (34.56 s/step), NVIDIA JAX-Toolbox's llama2-7b on 8 x H100 (0.721 s/step) and
  dgxc-benchmarking's llama2-70b on 64 x H100 (6.999 s/step).
- tpu-recipes' Ironwood (TPU7x) table and DeepSeek-V3 on v5p-1024 (``recipe_runs.py``: each run's
  overrides as its recipe published them, its measured step, source and versions), MaxText's own
  step on the slice as the recipe names it (``tpu7x-4x4x4``), with the XLA flags its recipe passes
  libtpu (``--without-recipe-flags``: without). These compiles are hundreds of devices of
  MaxText's step: they run by name only, one at a time (``--case NAME``).

Nothing here is fitted: the simulated step comes from the compiled program and the datasheet
figures jaxmem's targets carry (:mod:`jaxmem.steptime`). Each compile's optimized HLO is
kept (``--hlo-dir``, default ``$JAXMEM_CACHE_DIR``'s or ``~/.cache/jaxmem``'s ``calibration/``), so
``--resimulate`` times the same programs again with the current simulator without compiling.

Run from the repository root, in a venv with the ``maxtext`` extra:
``nice -n 10 python benchmarks/calibrate_steptime.py [--resimulate] [--table] [CASE ...] [--case NAME]``;
one JSON line per run, and with ``--table`` the markdown table of docs/examples.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import os
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import published_runs  # noqa: E402  (benchmarks/ is not a package)
import recipe_runs  # noqa: E402

SEQ = 2048  # MaxText's reference configurations' max_target_length


@dataclasses.dataclass(frozen=True, kw_only=True)
class Run:
  """A published run: its published_runs case, and its measured step (``step_s``) or the
  TFLOP/s per chip it was published at (``tflops``, for MaxText's scale-``scale`` decoder)."""

  case: str
  step_s: float | None = None
  tflops: float | None = None
  scale: int | None = None
  measured: str = ""  # the published figure, as published


RUNS = (
    Run(case="maxtext-v5p-32b", tflops=328, scale=32, measured="328 TFLOP/s/chip, 71.47% MFU"),
    Run(case="maxtext-v5p-64b", tflops=323, scale=64, measured="323 TFLOP/s/chip, 70.31% MFU"),
    Run(case="maxtext-v5e-16b", tflops=120, scale=16, measured="120 TFLOP/s/chip, 61.10% MFU"),
    Run(case="maxtext-v5e-32b", tflops=132, scale=32, measured="132 TFLOP/s/chip, 66.86% MFU"),
    Run(case="maxtext-v5e-64b", tflops=118, scale=64, measured="118 TFLOP/s/chip, 59.90% MFU"),
    Run(case="maxtext-v5e-128b", tflops=110, scale=128, measured="110 TFLOP/s/chip, 56.06% MFU"),
    Run(case="deepseek2-16b-v5p-8", step_s=5.667, measured="5.667 s/step"),
    Run(case="llama3.1-70b-v6e-256-offload", step_s=34.56, measured="34.56 s/step"),
    Run(case="llama2-7b-h100x8", step_s=0.721, measured="0.721 s/step"),
    Run(case="llama2-70b-h100x64", step_s=6.999, measured="6.999 s/step"),
    # tpu-recipes' runs (benchmarks/recipe_runs.py: the Ironwood table, DeepSeek-V3 on v5p-1024),
    # each at the step its recipe's table or log line gives.
    *(Run(case=r.name, step_s=r.step_s, measured=r.measured) for r in recipe_runs.RECIPES),
)
BY_CASE = {r.case: r for r in RUNS}


def maxtext_geometry(scale: int) -> dict[str, int]:
  """MaxText's default decoder at ``global_parameter_scale`` (pyconfig's scaling rule)."""
  k = int(round(math.log2(scale)))
  b, r = divmod(k, 3)
  return {"layers": 16 << b, "emb": 2048 << (b + (r > 1)), "heads": 16 << (b + (r > 0)),
          "mlp": 7168 << (b + (r > 0))}


def rate_step_s(run: Run, batch: int, chips: int) -> float:
  """The step a published TFLOP/s per chip implies: model FLOPs per chip over it."""
  from jaxmem.models import get_config
  from jaxmem.models.model_flops import training_flops

  g = maxtext_geometry(run.scale)
  cfg = get_config("llama3-8b", num_layers=g["layers"], d_model=g["emb"], num_heads=g["heads"],
                   num_kv_heads=g["heads"], head_dim=128, d_ff=g["mlp"], vocab_size=32000, tie_embeddings=False,
                   param_dtype="float32")
  return training_flops(cfg, batch=batch, seq=SEQ, causal=False) / chips / (run.tflops * 1e12)


def hlo_path(hlo_dir: Path, case: str) -> Path:
  return hlo_dir / f"{case}.hlo.txt.gz"


def compile_case(run: Run, hlo_dir: Path) -> dict:
  """Compiles the case (its one remat policy) and keeps its optimized HLO."""
  import jaxmem.compiler.report as report

  case = published_runs.BY_NAME[run.case]
  if (why := case.skipped()) is not None:
    return {"case": run.case, "error": f"skipped: needs {why}"}
  kept: list[str] = []
  assigned: list[tuple] = []
  parse, assignment = report.parse_module, report.device_assignment

  def keep(text: str):  # the optimized HLO the row is read from, kept for --resimulate
    kept.append(text)
    return parse(text)

  def keep_devices(compiled):  # and where its devices sit, which times its collectives on their links
    assigned.append(assignment(compiled))
    return assigned[-1]

  report.parse_module, report.device_assignment = keep, keep_devices
  try:
    t = time.time()
    p, row = published_runs.compile_policy(shlex.split(case.args))
    wall = time.time() - t
  finally:
    report.parse_module, report.device_assignment = parse, assignment
  if row.error:
    return {"case": run.case, "error": row.error}
  hlo_dir.mkdir(parents=True, exist_ok=True)
  with gzip.open(hlo_path(hlo_dir, run.case), "wt") as f:
    f.write(kept[-1])
  meta = {"target": p.target.name, "slices": p.target.slices if hasattr(p.target, "slices") else 1,
          "libtpu_init_args": os.environ.get("LIBTPU_INIT_ARGS"),
          "num_devices": p.target.num_devices, "batch": row.batch, "flops": row.flops,
          "model_flops": row.model_flops, "versions": row.versions, "compile_s": wall,
          "coords": report.placement(assigned[-1]) if assigned else None}
  (hlo_dir / f"{run.case}.json").write_text(json.dumps(meta))
  return result(run, meta, row.step_time(), moe=next((n for n in row.notes if n.startswith("moe (")), None))


def resimulate(run: Run, hlo_dir: Path) -> dict:
  """The kept HLO of the case timed again with the current simulator (no compile)."""
  from jaxmem.hardware.targets import get_target
  from jaxmem.hlo.ops import hlo_costs_of_module
  from jaxmem.hlo.text import parse_module
  from jaxmem.steptime import Work, step_time

  meta = json.loads((hlo_dir / f"{run.case}.json").read_text())
  with gzip.open(hlo_path(hlo_dir, run.case), "rt") as f:
    costs = hlo_costs_of_module(parse_module(f.read()))
  target = get_target(meta["target"], slices=meta.get("slices") or 1)
  n = meta["num_devices"]
  model = None if meta["model_flops"] is None else meta["model_flops"] * n
  est = step_time(costs, target, flops=meta["flops"], bytes_accessed=costs.bytes_accessed, comm_bytes=costs.comm_bytes,
                  num_devices=n, coords=meta.get("coords"), work=Work(model_flops=model, tokens=None))
  return result(run, meta, est.step, moe=None if est.moe is None else est.moe.summary())


def result(run: Run, meta: dict, step, moe: str | None = None) -> dict:
  """One run's JSON line; ``moe``: the walk's MoE terms (jaxmem.steptime.MoeTerms.summary), for a
  step with grouped matmul kernels."""
  chips = meta["num_devices"]
  measured = run.step_s if run.step_s is not None else rate_step_s(run, meta["batch"], chips)
  fields = step.as_dict()
  return {
      "case": run.case, "target": meta["target"], "measured": run.measured, "measured_step_s": measured,
      "source": published_runs.BY_NAME[run.case].source, "published_versions": published_runs.BY_NAME[run.case].versions,
      "ratio": None if not step.step_time_s else step.step_time_s / measured,
      "roofline_ratio": None if not step.roofline_step_time_s else step.roofline_step_time_s / measured,
      "op_time_ratio": None if not step.op_time_s else step.op_time_s / measured,
      **{k: fields.get(k) for k in FIELDS}, "flops": meta["flops"], "versions": meta["versions"],
      "compile_s": meta.get("compile_s"), "moe": moe, "libtpu_init_args": meta.get("libtpu_init_args"),
  }


FIELDS = ("step_time_s", "roofline_step_time_s", "op_time_s", "roofline_compute_time_s", "roofline_memory_time_s",
          "roofline_comm_time_s", "exposed_comm_time_s", "ici_comm_time_s", "dcn_comm_time_s", "nvlink_comm_time_s",
          "network_comm_time_s", "compute_bound_share", "memory_bound_share", "comm_bound_share", "bound", "mfu")


def responsible(r: dict) -> str:
  """The term responsible where the simulated step is outside [0.85, 1.15]. Below (the walk is
  faster than the run), the term that bounds most of the step: what the walk times at a peak the
  run does not reach. Above (slower), the term that adds the most beyond the roofline bound:
  each term's share of the step less what the bound already gives it (its largest term)."""
  if r.get("ratio") is None or 0.85 <= r["ratio"] <= 1.15:
    return "-"
  step = r["step_time_s"]
  times = {t: (r.get(f"{t}_bound_share") or 0.0) * step for t in ("compute", "memory", "comm")}
  if r["ratio"] < 0.85:
    term = max(times, key=times.__getitem__)
    moe = r.get("moe")  # the MoE term that decides, where the step has grouped matmuls
    decides = "" if not moe else "; " + moe.split(": ", 1)[1].split(";", 1)[0]
    return f"{term} ({times[term] / step:.0%} of the simulated step{decides})"
  bound = {t: r.get(f"roofline_{t}_time_s") or 0.0 for t in times}
  largest = max(bound, key=bound.__getitem__)
  beyond = {t: times[t] - (bound[t] if t == largest else 0.0) for t in times}
  term = max(beyond, key=beyond.__getitem__)
  return f"{term} ({beyond[term]:.3g} s beyond the roofline bound)"


def table(rows: list[dict]) -> str:
  head = ("| run (published) | target | measured step s | simulated step s (/ measured) | roofline bound s (/ measured) "
          "| sum over ops s (/ measured) | compute / memory / comm bound shares | exposed comm s | outside: the term |")
  lines = [head, "|" + "---|" * 9]
  for r in rows:
    if "error" in r:
      lines.append(f"| {r['case']} | | | error: {r['error'][:80]} | | | | | |")
      continue
    f = lambda k, q: "-" if r.get(k) is None else f"{r[k]:.3g} ({r[q]:.2f})"  # noqa: E731
    shares = " / ".join("-" if r.get(f"{t}_bound_share") is None else f"{r[f'{t}_bound_share']:.0%}"
                        for t in ("compute", "memory", "comm"))
    exposed = "-" if r.get("exposed_comm_time_s") is None else f"{r['exposed_comm_time_s']:.3g}"
    lines.append(f"| {r['case']} ({r['measured']}) | {r['target']} | {r['measured_step_s']:.3g} | "
                 f"{f('step_time_s', 'ratio')} | {f('roofline_step_time_s', 'roofline_ratio')} | "
                 f"{f('op_time_s', 'op_time_ratio')} | {shares} | {exposed} | {responsible(r)} |")
  inside = sum(1 for r in rows if r.get("ratio") is not None and 0.85 <= r["ratio"] <= 1.15)
  return "\n".join(lines) + f"\n\nsimulated / measured within [0.85, 1.15]: {inside} of {len(rows)}"


def use_recipe_flags(names: list[str]) -> str | None:
  """Sets ``LIBTPU_INIT_ARGS`` to the XLA flags of the tpu-recipes run among ``names``, as its
  recipe runs it (libtpu reads them once, as it loads: so such a run compiles alone), or says why
  it cannot, in one line."""
  flagged = [n for n in names if n in recipe_runs.XLA_FLAGS]
  if not flagged:
    return None
  if len(names) > 1:
    return (f"{flagged[0]} compiles with its recipe's XLA flags, which libtpu reads once as it loads: run it alone "
            "(--case NAME), or pass --without-recipe-flags")
  flags, given = recipe_runs.XLA_FLAGS[flagged[0]], os.environ.get("LIBTPU_INIT_ARGS")
  if given and given != flags:
    return f"LIBTPU_INIT_ARGS is set ({given!r}) and {flagged[0]}'s recipe sets its own: unset it, or pass --without-recipe-flags"
  os.environ["LIBTPU_INIT_ARGS"] = flags
  return None


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("cases", nargs="*", help=f"runs (default: all): {', '.join(BY_CASE)}")
  ap.add_argument("--case", action="append", default=[], metavar="NAME", help="this run (repeatable; as a positional name)")
  ap.add_argument("--resimulate", action="store_true", help="time the kept HLO again instead of compiling")
  ap.add_argument("--table", action="store_true", help="print the markdown table after the JSON lines")
  cache = Path(os.environ.get("JAXMEM_CACHE_DIR") or Path.home() / ".cache" / "jaxmem")
  ap.add_argument("--hlo-dir", type=Path, default=cache / "calibration")
  ap.add_argument("--without-recipe-flags", action="store_true",
                  help="compile a tpu-recipes run without its recipe's XLA flags (LIBTPU_INIT_ARGS)")
  args = ap.parse_args(argv)
  args.cases = [*args.cases, *args.case]
  unknown = [c for c in args.cases if c not in BY_CASE]
  if unknown:
    print(f"unknown run {unknown[0]!r}; valid: {', '.join(BY_CASE)}", file=sys.stderr)
    return 2
  # By default the runs that compile in minutes; tpu-recipes' (hundreds of devices) by name, or all kept ones again.
  names = args.cases or [n for n in BY_CASE if args.resimulate or n not in recipe_runs.BY_NAME]
  if not args.resimulate and not args.without_recipe_flags:
    why = use_recipe_flags(names)
    if why:
      print(why, file=sys.stderr)
      return 2
  os.chdir(published_runs.ROOT)
  rows = []
  for name in names:
    run = BY_CASE[name]
    if args.resimulate and not hlo_path(args.hlo_dir, name).exists():
      r = {"case": name, "error": f"no kept HLO in {args.hlo_dir}: run without --resimulate first"}
    else:
      r = resimulate(run, args.hlo_dir) if args.resimulate else compile_case(run, args.hlo_dir)
    rows.append(r)
    print(json.dumps(r), flush=True)
  if args.table:
    print(table(rows))
  return 0


if __name__ == "__main__":
  sys.exit(main())
