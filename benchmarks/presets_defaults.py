"""Every command with only ``--model PRESET --target T``, on every preset: does it run, or what
one line does it say? The defaults follow the model (a sequence no longer than its learned
positions, a batch its mesh divides); this runs them for real, compiles and all, one process per
command (``python -m jaxmem``), as a user would type them. ``estimate`` (a closed form) and
``validate`` (real steps on the attached devices) take no ``--target``: they run with ``--model``
alone, and ``validate`` says in one line where no accelerator is attached.

  nice -n 19 python benchmarks/presets_defaults.py                          # everything (hours)
  nice -n 19 python benchmarks/presets_defaults.py --only tiny,gpt2-small,infer,compare
  python benchmarks/presets_defaults.py --target gpu:h100 --timeout 600

``--only`` takes presets and commands, comma separated (each list empty: all of them). One line
per run as it finishes, then a markdown table (command x preset: ``ran`` with its seconds, the
one line it said, or ``timed out``) and a JSON line. The tests cover the planning stage of the
same runs without compiling (tests/test_presets_defaults.py); the compiles are this script's.
Large presets compile for minutes each on a 2-core machine; ``fit`` searches (several compiles).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

COMMANDS = ("compare", "explain", "fit", "plan", "scale", "infer", "estimate", "validate")
NO_TARGET = ("estimate", "validate")  # a closed form; real steps on the attached devices


def presets() -> list[str]:
  """The presets, as ``jaxmem models`` lists them."""
  import jaxmem

  return list(jaxmem.PRESETS)


def argv(command: str, model: str, target: str) -> list[str]:
  return [command, "--model", model, *([] if command in NO_TARGET else ["--target", target])]


def run_one(args: list[str], timeout: float, env: dict[str, str]) -> dict[str, object]:
  """One command in its own process: ``ran`` (exit 0), else the last line it said on stderr."""
  start = time.monotonic()
  try:
    proc = subprocess.run([sys.executable, "-m", "jaxmem", *args], capture_output=True, text=True, timeout=timeout,
                          env=env, check=False)
  except subprocess.TimeoutExpired:
    return dict(status="timed out", line=f"still running after {timeout:.0f} s", seconds=round(time.monotonic() - start))
  lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
  said = lines[-1] if lines else f"exit {proc.returncode}, nothing on stderr"
  status = "ran" if proc.returncode == 0 else f"exit {proc.returncode}"
  notes = [ln.removeprefix("jaxmem: ") for ln in lines if "(default " in ln]  # the defaults that had to change
  return dict(status=status, line="" if proc.returncode == 0 else said, notes=notes,
              seconds=round(time.monotonic() - start, 1))


def main() -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--target", default="tpu:v5p-8", help="a target whose compiler runs here; default tpu:v5p-8")
  p.add_argument("--only", default="", help="presets and commands to run, comma separated (default all)")
  p.add_argument("--timeout", type=float, default=1800, help="seconds per command before it is stopped; default 1800")
  p.add_argument("--cache", action="store_true", help="use the row cache (default: a fresh one, so every row compiles)")
  a = p.parse_args()
  only = {x.strip() for x in a.only.split(",") if x.strip()}
  names = presets()
  unknown = only - set(names) - set(COMMANDS)
  if unknown:
    p.error(f"--only: unknown {', '.join(sorted(unknown))}; presets: {', '.join(names)}; commands: {', '.join(COMMANDS)}")
  models = [m for m in names if m in only] or names
  commands = [c for c in COMMANDS if c in only] or list(COMMANDS)
  env = {**os.environ, "JAXMEM_NO_PROGRESS": "1"}
  with tempfile.TemporaryDirectory(prefix="jaxmem-presets-") as cache:
    if not a.cache:
      env["JAXMEM_CACHE_DIR"] = cache
    results = []
    for model in models:
      for command in commands:
        args = argv(command, model, a.target)
        r = {"command": command, "model": model, "argv": " ".join(args), **run_one(args, a.timeout, env)}
        results.append(r)
        print(f"{command:8} {model:14} {r['status']:10} {r['seconds']:>7} s  {r['line'] or '; '.join(r['notes'])}",
              flush=True)
  print()
  print(table(results, models, commands))
  print(json.dumps({"target": a.target, "results": results}))
  return 0


def table(results: list[dict[str, object]], models: list[str], commands: list[str]) -> str:
  """Markdown: a row per preset, a column per command; each cell ``ran (Ns)`` or what it said."""
  by = {(r["model"], r["command"]): r for r in results}
  out = ["| preset | " + " | ".join(commands) + " |", "|---" * (len(commands) + 1) + "|"]
  for m in models:
    cells = []
    for c in commands:
      r = by[m, c]
      cells.append(f"ran ({r['seconds']} s)" if r["status"] == "ran" else f"{r['status']}: {r['line']}".replace("|", "/"))
    out.append(f"| {m} | " + " | ".join(cells) + " |")
  return "\n".join(out)


if __name__ == "__main__":
  sys.exit(main())
