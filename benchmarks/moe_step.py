"""An MoE train step with and without expert parallelism (the figures in docs/examples.md).

Run: python benchmarks/moe_step.py [--model qwen3-30b-a3b] [--target tpu:v5p-16]
[--mesh fsdp=8 --mesh expert=8,fsdp=1] [--remat full] [--batch 16] [--seq 2048] [--moe-impl M]
[--fit]. It compiles, without the hardware, the train step for every mesh (as
``jaxmem compare ... --format json`` does, but only for the named remat policy), prints one line per row (per-device memory and
all-to-all bytes), checks that every mesh with an ``expert`` axis exchanges tokens by all-to-all
(``comm_all_to_all_bytes > 0``), and with ``--fit`` also searches the largest batch that fits per
mesh. The last line is JSON: the rows, the fit results and the check. Exit status 1 if the check
fails.

The defaults are the issue's command:
``jaxmem compare --model qwen3-30b-a3b --target tpu:v5p-16 --mesh fsdp=8 --mesh expert=8,fsdp=1
--remat full --batch 16 --seq 2048 --format json``. These compiles are heavy (minutes each on 2
cores): run it once, late.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import dataclasses  # noqa: E402

from jaxmem.planning import fit as fitting  # noqa: E402
from jaxmem.cache import RowCache  # noqa: E402
from jaxmem.resolve import plan  # noqa: E402
from jaxmem.planning.runner import run_tasks  # noqa: E402
from jaxmem.planning.sweep import row_from_dict, run_task  # noqa: E402

GIB = 2**30


def _gib(v: int | None) -> str:
  return "-" if v is None else f"{v / GIB:.2f}"


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--model", default="qwen3-30b-a3b")
  ap.add_argument("--target", default="tpu:v5p-16")
  ap.add_argument("--mesh", action="append", default=None)
  ap.add_argument("--remat", default="full")
  ap.add_argument("--batch", type=int, default=16)
  ap.add_argument("--seq", type=int, default=2048)
  ap.add_argument("--moe-impl", default=None)
  ap.add_argument("--fit", action="store_true", help="also the largest batch that fits, per mesh")
  args = ap.parse_args()
  meshes = args.mesh or ["fsdp=8", "expert=8,fsdp=1"]
  work = dict(model=args.model, target=args.target, mesh=meshes, remat=args.remat, seq=args.seq, moe_impl=args.moe_impl)
  start = time.time()
  # compare's rows, but only the named policy's (compare adds the no-remat baseline: twice the compiles).
  p = plan(**work, batch=args.batch)
  tasks = [t for t in p.tasks() if t.remat == args.remat]
  rows = [row_from_dict(d) for d in run_tasks(tasks, run_task, cache=RowCache())]
  for r in rows:
    print(
        f"{r.mesh:18s} {r.moe_impl or '-':9s} params {_gib(r.param_bytes)} opt {_gib(r.optimizer_state_bytes)} "
        f"temp {_gib(r.temp_size_in_bytes)} peak {_gib(r.peak_memory_in_bytes)} required {_gib(r.required_bytes)} "
        f"fits {r.fits} all-to-all {_gib(r.comm_all_to_all_bytes)} comm {_gib(r.comm_bytes)} GiB"
        + (f" error {r.error}" if r.error else ""),
        flush=True,
    )
  fits = []
  if args.fit:
    fp = plan(fitting.template(p.workload.replace(batch=args.batch), "batch"))
    fp = dataclasses.replace(fp, remats=tuple(r for r in fp.remats if r.name == args.remat))
    fits = [f.as_dict() for f in fitting.search(fp, over="batch", cache=RowCache())]
    for f in fits:
      print(f"fit {f['mesh']:18s} max batch {f['max_batch']} ({f['compiles']} compiles) {f['fit_note'] or ''}", flush=True)
  expert_rows = [r for r in rows if "expert=" in r.mesh and "expert=1," not in r.mesh + ","]
  ok = bool(expert_rows) and all((r.comm_all_to_all_bytes or 0) > 0 for r in expert_rows)
  print(f"check: comm_all_to_all_bytes > 0 under every expert mesh: {'yes' if ok else 'NO'}", flush=True)
  print(json.dumps(dict(
      check=ok, seconds=round(time.time() - start, 1), versions=rows[0].versions if rows else {},
      rows=[r.as_dict() for r in rows], fit=fits,
  )))
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
