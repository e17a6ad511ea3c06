"""What jaxmem costs on top of the compiler, and what its cache and parallelism save.

Run: python benchmarks/overhead.py [--target cpu] [--jobs N]. Everything is measured side by
side in this one run on this machine, so the ratios hold even on a busy one; the last line
printed is a JSON object:

- overhead_ratio: jaxmem's time for one configuration (trace, FLOP count, compile, reading
  memory, cost and collectives) over the raw ``jit(...).lower(...).compile()`` of the same
  program (median of 3, caches cleared before each). Goal <= 1.05.
- cached_sweep_seconds: a 12-configuration sweep repeated from the row cache. Goal < 1.
- parallel_speedup: the same sweep, uncached, with one process against ``--jobs`` (default:
  all cores).
- depth_80_over_8: compile time of an 80-layer model over an 8-layer one (scanned layers).
  Goal <= 1.2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

from jaxmem.models import get_config  # noqa: E402
from jaxmem.planning import sweep  # noqa: E402
from jaxmem.cache import RowCache  # noqa: E402
from jaxmem.resolve import plan  # noqa: E402
from jaxmem.program import train  # noqa: E402


def _timed(fn):
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def overhead_ratio(target: str) -> tuple[float, float, float]:
  cfg = get_config("gpt2-small", num_layers=4)
  p = plan(model=cfg, remat="full", optimizer="adamw", batch=8, seq=512, target=target)
  mesh, opt, rp = p.configs()[-1]
  raws, ours = [], []
  for _ in range(3):
    jax.clear_caches()
    prog = train.build_train_program(cfg, remat=rp, optimizer=opt, batch=8, seq=512, target=p.target, mesh=mesh)
    raws.append(_timed(lambda: prog.step.lower(*prog.args).compile()))
    jax.clear_caches()
    ours.append(_timed(lambda: sweep.run_config(p, mesh, opt, rp)))
  raw, our = statistics.median(raws), statistics.median(ours)
  return our / raw, our, raw


def sweep_kwargs(target: str) -> dict:
  # 12 configurations: 3 optimizers x 4 remat policies (none is the baseline).
  return dict(model="tiny", batch=8, seq=128, target=target, optimizer="sgd,adamw,lion", remat="full,dots_saveable,save_qkv_proj")


def cached_sweep_seconds(target: str) -> float:
  with tempfile.TemporaryDirectory() as d:
    cache = RowCache(Path(d))
    sweep.compare(**sweep_kwargs(target), cache=cache)
    return _timed(lambda: sweep.compare(**sweep_kwargs(target), cache=RowCache(Path(d))))


def parallel_speedup(target: str, jobs: int) -> tuple[float, float, float]:
  jax.clear_caches()
  one = _timed(lambda: sweep.compare(**sweep_kwargs(target), jobs=1))
  jax.clear_caches()
  many = _timed(lambda: sweep.compare(**sweep_kwargs(target), jobs=jobs))
  return one / many, one, many


def depth_ratio(target: str) -> tuple[float, float, float]:
  secs = {}
  for layers in (8, 80):
    cfg = get_config("tiny", d_model=512, d_ff=2048, num_heads=8, num_kv_heads=4, head_dim=64, num_layers=layers)
    jax.clear_caches()
    (row,) = [r for r in sweep.compare(model=cfg, remat="full", batch=8, seq=256, target=target) if r.remat == "full"]
    secs[layers] = row.compile_seconds
  return secs[80] / secs[8], secs[8], secs[80]


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--target", default="cpu")
  ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
  args = ap.parse_args(argv)
  ratio, ours, raw = overhead_ratio(args.target)
  print(f"one configuration: jaxmem {ours:.2f} s, raw compile {raw:.2f} s", file=sys.stderr)
  cached = cached_sweep_seconds(args.target)
  print(f"12-configuration sweep from the cache: {cached:.3f} s", file=sys.stderr)
  speedup, one, many = parallel_speedup(args.target, args.jobs)
  print(f"12-configuration sweep: {one:.1f} s with 1 process, {many:.1f} s with {args.jobs}", file=sys.stderr)
  depth, s8, s80 = depth_ratio(args.target)
  print(f"compile: 8 layers {s8:.2f} s, 80 layers {s80:.2f} s", file=sys.stderr)
  result = {
      "target": args.target,
      "cpus": os.cpu_count(),
      "jobs": args.jobs,
      "overhead_ratio": round(ratio, 3),
      "cached_sweep_seconds": round(cached, 3),
      "parallel_speedup": round(speedup, 3),
      "depth_80_over_8": round(depth, 3),
  }
  print(json.dumps(result))
  return 0


if __name__ == "__main__":
  sys.exit(main())
