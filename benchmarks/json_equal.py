"""Are the commands' JSON outputs the same before and after a change? A fixed set of commands
(compare, fit, scale, plan, infer, explain, estimate; the ``tiny`` model on ``cpu`` and on
``tpu:v5e-4``, small shapes) run through ``jaxmem.cli.main``, each output saved as JSON, and a
later run compared with a saved one field by field, the order of a mapping's keys aside.

    python benchmarks/json_equal.py --save /tmp/json-before       # on the old code
    python benchmarks/json_equal.py --against /tmp/json-before    # on the new code

With ``--against`` it prints one line per command, ``equal`` or ``differs:`` with the paths of
the fields that differ, and exits 1 if any differs (or failed). Each run uses a fresh private row
cache (``JAXMEM_CACHE_DIR`` in a temporary folder), so every row is compiled by the code under
test, never read from rows an earlier version cached. The whole set takes a few minutes on two
loaded cores. ``--only NAME`` runs the named commands alone (repeatable).

``--rename OLD=NEW`` (repeatable) compares a change that renames fields: OLD is a field's path as
the differences print it, list indices folded (``rows[].comm_time_s``; it matches that path at
any depth, so ``op_times.step_time_s`` is not ``rows[].step_time_s``), NEW the field's new name;
the saved output's fields are renamed (all at once, so two may swap names) before comparing.
Each rename must be in the CHANGELOG.

``--ignore-added`` compares a change that adds fields (a new column, a new figure, each said in
the CHANGELOG): a field only the new output has is listed apart (``added:``) and does not count as
a difference; a field gone or a value changed still does.

Only the fields in :data:`VOLATILE` are left out of the comparison; each says why it may differ
from one run of the same code to the next. Everything else (every figure, note, label and key)
must match exactly, floats included: the same compiler given the same program gives the same
numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from typing import Any

# name -> the command's arguments (each gets `--format json`). Small shapes, so each compiles in
# seconds; the TPU target compiles through libtpu without a TPU.
COMMANDS: dict[str, list[str]] = {
    "compare-cpu": ["compare", "--model", "tiny", "--target", "cpu", "--batch", "2", "--seq", "64",
                    "--remat", "none,dots_saveable", "--optimizer", "adamw,sgd"],
    "compare-tpu": ["compare", "--model", "tiny", "--target", "tpu:v5e-4", "--batch", "4", "--seq", "64",
                    "--remat", "none,full", "--with-estimate"],
    # fit needs a capacity, which the CPU has not: on the TPU target, at a fixed workload (ranked).
    # Its batch search is left out: tiny fits 16 GiB at batches so large that the search took
    # over 20 minutes on two loaded cores.
    "fit-ranked": ["fit", "--model", "tiny", "--target", "tpu:v5e-4", "--batch", "4", "--seq", "64", "--remat", "none,full"],
    "scale-cpu": ["scale", "--model", "tiny", "--target", "cpu", "--batch", "2", "--over", "seq=32,64"],
    "plan-tpu": ["plan", "--model", "tiny", "--target", "tpu:v5e-4", "--batch", "4", "--seq", "64", "--budget", "4"],
    "infer-cpu": ["infer", "--model", "tiny", "--target", "cpu", "--prompt", "32", "--context", "64,128"],
    "infer-tpu": ["infer", "--model", "tiny", "--target", "tpu:v5e-4", "--batch", "4", "--prompt", "32",
                  "--context", "64", "--weights", "bf16,int8"],
    "explain-cpu": ["explain", "--model", "tiny", "--target", "cpu", "--batch", "2", "--seq", "64", "--top", "5"],
    "explain-tpu": ["explain", "--model", "tiny", "--target", "tpu:v5e-4", "--batch", "4", "--seq", "64",
                    "--top", "5", "--top-ops", "5"],
    "estimate": ["estimate", "--model", "tiny", "--batch", "2", "--seq", "64", "--recompute", "selective"],
}

# Keys (at any depth) left out of the comparison, each with why it may differ between two runs of
# the same code on the same machine.
VOLATILE: dict[str, str] = {
    # Wall-clock time of XLA's compile: the machine's load, not the program, sets it.
    "compile_seconds": "wall-clock compile time",
}


def run_one(argv: list[str]) -> tuple[int, Any, str]:
  """(exit status, parsed JSON or None, stderr) of ``jaxmem ARGV --format json`` run in this
  process through the CLI's ``main``."""
  from jaxmem.cli import main

  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    code = main([*argv, "--format", "json"])
  try:
    data = json.loads(out.getvalue()) if code == 0 else None
  except json.JSONDecodeError as e:
    return 1, None, f"{err.getvalue()}\nstdout is not JSON: {e}"
  return code, data, err.getvalue()


def differences(a: Any, b: Any, path: str = "") -> list[str]:
  """The paths where ``a`` and ``b`` differ: mappings compared key by key whatever their order,
  lists item by item, the keys in :data:`VOLATILE` skipped."""
  if isinstance(a, dict) and isinstance(b, dict):
    out = []
    for k in sorted(set(a) | set(b)):
      if k in VOLATILE:
        continue
      p = f"{path}.{k}" if path else k
      if k not in a:
        out.append(f"{p} (new)")
      elif k not in b:
        out.append(f"{p} (gone)")
      else:
        out += differences(a[k], b[k], p)
    return out
  if isinstance(a, list) and isinstance(b, list):
    if len(a) != len(b):
      return [f"{path or '.'} (length {len(a)} -> {len(b)})"]
    return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
  return [] if a == b and type(a) is type(b) else [f"{path or '.'} ({_short(a)} -> {_short(b)})"]


def renamed(data: Any, renames: dict[str, str], path: str = "") -> Any:
  """``data`` with each mapping key whose folded path (``rows[].x``) ends with an OLD of
  ``renames`` (whole components) renamed to its NEW, every key of a mapping at once."""
  if isinstance(data, list):
    return [renamed(x, renames, f"{path}[]") for x in data]
  if not isinstance(data, dict):
    return data
  out = {}
  for k, v in data.items():
    p = f"{path}.{k}" if path else k
    new = next((n for old, n in renames.items() if p == old or p.endswith("." + old)), k)
    out[new] = renamed(v, renames, p)
  return out


def _short(v: Any) -> str:
  s = json.dumps(v)
  return s if len(s) <= 40 else s[:37] + "..."


def summary(paths: list[str], limit: int = 8) -> str:
  """The differing paths with list indices folded (``rows[3].temp_size_in_bytes`` counted once
  as ``rows[].temp_size_in_bytes``), the first ``limit`` of them."""
  import re

  folded: dict[str, int] = {}
  for p in paths:
    key = re.sub(r"\[\d+\]", "[]", p.split(" (")[0])
    folded[key] = folded.get(key, 0) + 1
  words = [f"{k}" + (f" x{n}" if n > 1 else "") for k, n in folded.items()]
  more = f" (+{len(words) - limit} more)" if len(words) > limit else ""
  return ", ".join(words[:limit]) + more


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--save", metavar="DIR", help="write each command's JSON to DIR/NAME.json")
  ap.add_argument("--against", metavar="DIR", help="compare each command's JSON with DIR/NAME.json")
  ap.add_argument("--ignore-added", action="store_true",
                  help="list the fields only the new output has apart, without counting them as differences")
  ap.add_argument("--only", action="append", default=None, metavar="NAME", help=f"run only these: {', '.join(COMMANDS)}")
  ap.add_argument("--rename", action="append", default=[], metavar="OLD=NEW",
                  help="a renamed field: its old path (rows[].comm_time_s) and its new name")
  args = ap.parse_args(argv)
  if any("=" not in r for r in args.rename):
    ap.error("--rename takes OLD=NEW (rows[].comm_time_s=roofline_comm_time_s)")
  renames = dict(r.split("=", 1) for r in args.rename)
  if not (args.save or args.against):
    ap.error("give --save DIR and/or --against DIR")
  names = args.only or list(COMMANDS)
  unknown = [n for n in names if n not in COMMANDS]
  if unknown:
    ap.error(f"unknown command name {unknown[0]} (the names: {', '.join(COMMANDS)})")
  os.environ["JAXMEM_CACHE_DIR"] = tempfile.mkdtemp(prefix="jaxmem-json-equal-")  # compiled here, never reused
  os.environ["JAXMEM_NO_PROGRESS"] = "1"
  if args.save:
    os.makedirs(args.save, exist_ok=True)
  failed = 0
  t0 = time.perf_counter()
  for name in names:
    start = time.perf_counter()
    code, data, err = run_one(COMMANDS[name])
    took = f"{time.perf_counter() - start:.0f} s"
    if code != 0:
      failed += 1
      last = err.strip().splitlines()[-1] if err.strip() else ""
      print(f"{name}: failed (exit {code}): {last} [{took}]", flush=True)
      continue
    if args.save:
      with open(os.path.join(args.save, f"{name}.json"), "w") as f:
        json.dump({"argv": COMMANDS[name], "output": data}, f, indent=1, sort_keys=True)
    if args.against:
      path = os.path.join(args.against, f"{name}.json")
      if not os.path.exists(path):
        failed += 1
        print(f"{name}: no saved output {path} [{took}]", flush=True)
        continue
      with open(path) as f:
        saved = json.load(f)
      if saved["argv"] != COMMANDS[name]:
        print(f"{name}: note: saved with other arguments {saved['argv']}", flush=True)
      diff = differences(renamed(saved["output"], renames), data)
      added = [d for d in diff if d.endswith(" (new)")] if args.ignore_added else []
      diff = [d for d in diff if d not in added]
      if diff:
        failed += 1
      extra = f"; added: {summary(added)}" if added else ""
      print(f"{name}: " + (f"differs: {summary(diff)}" if diff else "equal") + extra + f" [{took}]", flush=True)
    else:
      print(f"{name}: saved [{took}]", flush=True)
  print(f"{len(names)} commands, {failed} failed or differ, {time.perf_counter() - t0:.0f} s", flush=True)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
