"""A compiled row's runtime account, term by term: the device as its runtime will hold the program.

Compiles one configuration (a published-runs case by name, or compare's arguments) with its
named remat policy alone, and prints the runtime account (jaxmem.hardware.runtime): each term in
GiB with where it sits and its source, the sums, what is left, the verdict and, where it is at
risk, the term that decides it and the remedy. ``--json PATH`` keeps the row for docs.

  python benchmarks/runtime_account.py --case llama2-70b-v5p-128-b4
  python benchmarks/runtime_account.py -- --model tiny --target tpu:v5e-4 --batch 8 --seq 256 --remat full

The 70B cases are heavy (about 10 minutes and 6 GiB of host memory each on a loaded 2-core machine):
run them one at a time. The figures in docs/backends.md ("The runtime account") came from here.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

GiB = 1 << 30


def account_lines(row: dict) -> list[str]:
  """The account of ``row`` (a row's dict) as lines to print."""
  def gib(v):
    return "-" if v is None else f"{v / GiB:.2f}"

  lines = [f"capacity {gib(row.get('capacity_bytes'))} GiB; required {gib(row.get('required_bytes'))} "
           f"({row.get('judged_figure')}); verdict {row.get('verdict')}"]
  for name, t in (row.get("runtime_terms") or {}).items():
    lines.append(f"  {name:<48} {gib(t['bytes']):>8} GiB  [{t['part']}]  {t['source']}")
  lines.append(f"heap {gib(row.get('runtime_heap_bytes'))} + program block {gib(row.get('runtime_program_bytes'))}; "
               f"left {gib(row.get('runtime_available_bytes'))} GiB; runtime verdict {row.get('runtime_verdict')}"
               + (f" ({row['runtime_term']}): {row['runtime_remedy']}" if row.get("runtime_term") else ""))
  return lines


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--case", help="a case of benchmarks/published_runs.py (--list there names them)")
  ap.add_argument("--json", help="write the row's dict here")
  ap.add_argument("args", nargs="*", help="compare's arguments (after --), where no --case is given")
  ns = ap.parse_args(argv)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import published_runs

  if ns.case:
    case = published_runs.BY_NAME.get(ns.case)
    if case is None or case.args is None:
      print(f"runtime_account: no case {ns.case!r} with arguments; published_runs.py --list names them", file=sys.stderr)
      return 2
    argv_compare = shlex.split(case.args)
  else:
    argv_compare = ns.args
  os.chdir(published_runs.ROOT)
  start = time.perf_counter()
  _, row = published_runs.compile_policy(argv_compare)
  d = row.as_dict()
  d["_seconds"] = round(time.perf_counter() - start, 1)
  print("\n".join(account_lines(d)))
  if ns.json:
    Path(ns.json).write_text(json.dumps(d, indent=2))
  return 0


if __name__ == "__main__":
  sys.exit(main())
