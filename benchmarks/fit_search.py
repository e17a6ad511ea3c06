"""Does fit's largest batch agree with compiling it on its own? The heavy case, on a TPU slice.

Run: python benchmarks/fit_search.py [--target tpu:v5e-1] [--seq 1024]. Searches the largest
batch that fits for a mid-sized model (d_model 256, vocab 8192, 2 layers) under remat ``full``
and AdamW, then compiles that batch and the next one as ``compare`` would, and prints both
verdicts side by side; the last line is a JSON object. ``agrees`` must be true: the largest batch
fits and one more does not. This was tests/test_planning.py's TPU case (about 95 s on a quiet
2-core machine, 500 s on a busy one); it and the tiny model's GPU case are ``slow`` tests,
and the fast suite checks the same agreement for a user's step on gpu:h100.

Why it is heavy: the TPU compiler's time grows with the shapes (measured with libtpu 0.0.42.1 on
the tiny model: 2 s at batch 1, 23 s at 64 and 52 s at 1024, seq 128), and a search probes the
largest batches that fit, near the chip's 16 GiB.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from jaxmem.models import get_config  # noqa: E402
from jaxmem.planning import fit, sweep  # noqa: E402
from jaxmem.resolve import plan  # noqa: E402
from jaxmem.render.units import unit_for  # noqa: E402
from jaxmem.versions import compiler_versions, describe  # noqa: E402

MID = get_config("tiny", d_model=256, d_ff=1024, num_heads=4, num_kv_heads=2, head_dim=64, vocab_size=8192, num_layers=2)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--target", default="tpu:v5e-1")
  ap.add_argument("--seq", type=int, default=1024)
  args = ap.parse_args()

  p = plan(model=MID, remat="full", optimizer="adamw", batch=1, seq=args.seq, target=args.target)
  p = dataclasses.replace(p, remats=p.remats[1:])  # search `full` only
  start = time.perf_counter()
  (found,) = fit.search(p)
  search_s = time.perf_counter() - start
  mesh, opt, rp = p.configs()[0]
  start = time.perf_counter()
  at = sweep.run_config(dataclasses.replace(p, batch=found.max_batch), mesh, opt, rp)
  above = sweep.run_config(dataclasses.replace(p, batch=found.max_batch + 1), mesh, opt, rp)
  check_s = time.perf_counter() - start

  u = unit_for([at.required_bytes, above.required_bytes, p.target.capacity_bytes])
  versions = compiler_versions(p.target.platform)
  print(f"{p.target.name}, seq {args.seq}, remat full, adamw ({describe(versions)}); capacity {u(p.target.capacity_bytes)} {u.name}")
  print(f"fit:     largest batch {found.max_batch} in {found.compiles} compiles, {search_s:.1f} s")
  for name, row in (("compare", at), ("compare", above)):
    print(f"{name}: batch {row.batch:5d} requires {u(row.required_bytes)} {u.name}, fits {row.fits}")
  print(f"checks:  {check_s:.1f} s")
  agrees = at.fits is True and above.fits is False
  print(json.dumps({
      "target": p.target.name, "seq": args.seq, "max_batch": found.max_batch, "compiles": found.compiles,
      "at_fits": at.fits, "above_fits": above.fits, "agrees": agrees, "search_seconds": round(search_s, 1),
      "check_seconds": round(check_s, 1), "versions": versions,
  }))


if __name__ == "__main__":
  main()
