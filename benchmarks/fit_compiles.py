"""Compiles and seconds per answer of fit's searches, side by side in one run.

Run: python benchmarks/fit_compiles.py [--model llama3-1b] [--target tpu:v5e-4] [--mesh fsdp=4]
[--seq 2048] [--remat full,minimal] [--depth-probe] [--capacity-gib G] (a quick run: ``--model
tiny --target cpu --mesh fsdp=1 --seq 32 --capacity-gib 0.01``). For every configuration (the ``none``
baseline included, as ``fit`` searches it) it runs:

- ``previous``: the search ``fit`` had before the affine one (the first two batches, then a
  secant through the two largest fitting ones, alternating with bisection once bracketed),
  reproduced here verbatim to measure against;
- ``bisect``: plain doubling then bisection (MaxText's ``estimator.py``);
- ``affine``: today's (:mod:`jaxmem.planning.boundary`);
- with ``--depth-probe``, ``affine`` with each probe predicted from 2 and 4 layers.

One row cache is shared by all, so a batch two searches probe is compiled once; "compile s" is
the compiler's own time for every probe a search made (from its rows, cached or not), so the
columns compare what each search would cost alone. The answers must agree (``agree``). The last
line is a JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from jaxmem.hardware.targets import get_target  # noqa: E402
from jaxmem.planning import fit  # noqa: E402
from jaxmem.planning.boundary import Probe, row_probe  # noqa: E402
from jaxmem.cache import RowCache  # noqa: E402
from jaxmem.resolve import plan  # noqa: E402
from jaxmem.planning.sweep import run_rows  # noqa: E402
from jaxmem.program import sharding as shd  # noqa: E402
from jaxmem.versions import compiler_versions, describe  # noqa: E402
from jaxmem.workload import Workload  # noqa: E402


@dataclasses.dataclass
class Previous:
  """fit's search before the affine one (jaxmem/planning/fit.py ``_Search``, commit 25d3936)."""

  capacity: int
  cap: int = 1 << 16
  lo: int = 0
  hi: int | None = None
  compiles: int = 0
  points: dict[int, int] = dataclasses.field(default_factory=dict)
  secant_missed: bool = False

  def record(self, k: int, probe: Probe) -> None:
    self.compiles += 1
    if probe.required is not None:
      self.points[k] = probe.required
    if probe.fits:
      self.lo = max(self.lo, k)
    else:
      self.hi = k if self.hi is None else min(self.hi, k)

  def _predict(self) -> int | None:
    if self.hi in self.points and self.lo in self.points:
      (k1, r1), (k2, r2) = (self.lo, self.points[self.lo]), (self.hi, self.points[self.hi])
    else:
      below = sorted((k, r) for k, r in self.points.items() if k <= self.lo)
      if len(below) < 2:
        return None
      (k1, r1), (k2, r2) = below[-2:]
    slope = (r2 - r1) / (k2 - k1)
    return None if slope <= 0 else k1 + int((self.capacity - r1) // slope)

  def next_probe(self) -> int | None:
    if self.lo == 0:
      return None if self.hi is not None else 1
    upper = self.cap if self.hi is None else self.hi - 1
    if self.lo >= upper:
      return None
    guess = self._predict()
    if guess is None or (self.hi is not None and self.secant_missed):
      guess = self.lo * 2 if self.hi is None else (self.lo + self.hi) // 2
      self.secant_missed = False
    else:
      self.secant_missed = True
    return min(max(guess, self.lo + 1), upper)


def previous_search(p, cache, on_row):
  """The previous search driven in lockstep over ``p``'s configurations, as fit drove it."""
  tasks = p.tasks()
  steps = [shd.data_parallel_size(t.mesh) * t.microbatches for t in tasks]
  searches = [Previous(capacity=p.target.capacity_bytes) for _ in tasks]
  while probes := [(i, k) for i, s in enumerate(searches) if (k := s.next_probe()) is not None]:
    rows = run_rows(p, [tasks[i].replace(batch=k * steps[i]) for i, k in probes], cache=cache, on_row=on_row)
    for (i, k), row in zip(probes, rows, strict=True):
      searches[i].record(k, row_probe(row))
  return [(t.remat, s.lo * step or None, s.compiles) for t, s, step in zip(tasks, searches, steps, strict=True)]


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--model", default="llama3-1b")
  ap.add_argument("--target", default="tpu:v5e-4")
  ap.add_argument("--mesh", default="fsdp=4")
  ap.add_argument("--seq", type=int, default=2048)
  ap.add_argument("--remat", default="full,minimal")
  ap.add_argument("--depth-probe", action="store_true")
  ap.add_argument("--capacity-gib", type=float, default=None, help="the target's capacity replaced (a quick run on cpu)")
  args = ap.parse_args()

  target = args.target
  if args.capacity_gib is not None:
    target = dataclasses.replace(get_target(target), capacity_bytes=int(args.capacity_gib * 2**30), capacity_note="--capacity-gib")
  w = Workload.of(None, model=args.model, target=target, mesh=args.mesh, seq=args.seq, remat=args.remat)
  p = plan(fit.template(w, "batch"))
  cache = RowCache(Path(tempfile.mkdtemp(prefix="fit-compiles-")))
  strategies = ["previous", "bisect", "affine"] + (["affine+depth"] if args.depth_probe else [])
  table: dict[str, dict[str, tuple]] = {}
  for name in strategies:
    rows: list = []
    start = time.perf_counter()
    if name == "previous":
      answers = previous_search(p, cache, rows.append)
    else:
      found = fit.search(p, cache=cache, on_row=rows.append, strategy=name.split("+")[0], depth_probe=name.endswith("depth"))
      answers = [(r.remat, r.max_batch, r.compiles) for r in found]
    wall = time.perf_counter() - start
    seconds = sum(r.compile_seconds or 0 for r in rows)
    table[name] = {"answers": answers, "compile_seconds": round(seconds, 1), "wall_seconds": round(wall, 1)}

  versions = compiler_versions(p.target.platform)
  print(f"{args.model} on {args.target} (mesh {args.mesh}, seq {args.seq}; {describe(versions)})")
  head = f"{'remat':<10}" + "".join(f"{n + ' batch':>22}{n + ' compiles':>22}" for n in strategies)
  print(head)
  for i, (remat, *_) in enumerate(table["previous"]["answers"]):
    print(f"{remat:<10}" + "".join(f"{str(table[n]['answers'][i][1]):>22}{table[n]['answers'][i][2]:>22}" for n in strategies))
  for n in strategies:
    c = [a[2] for a in table[n]["answers"]]
    print(f"{n}: {sum(c)} compiles ({sum(c) / len(c):.2f} per configuration), "
          f"{table[n]['compile_seconds']} s of compiles ({table[n]['compile_seconds'] / len(c):.1f} s per answer), "
          f"{table[n]['wall_seconds']} s wall in this run (shared cache)")
  agree = len({tuple(a[1] for a in table[n]["answers"]) for n in strategies}) == 1
  print(json.dumps({"model": args.model, "target": args.target, "mesh": args.mesh, "seq": args.seq, "agree": agree,
                    "strategies": table, "versions": versions}))


if __name__ == "__main__":
  main()
