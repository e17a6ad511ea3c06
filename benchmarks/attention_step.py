"""The attention figures of docs/examples.md: the train step with the real attention kernels, by the CLI.

Run: python benchmarks/attention_step.py --out DIR [--parts done,readme,fit] [--targets tpu,gpu]

Each part runs the exact ``jaxmem`` commands below in a subprocess (``python -m jaxmem``), keeps
their JSON and markdown output in DIR/jaxVERSION (the markdown run is answered from jaxmem's row cache, so
each configuration compiles once), and prints the ratios the issue asks for:

- ``done``: ``compare --model llama3-3b --target tpu:v5p-8 --seq 8192 --batch 8
  --attention dot,splash --remat dots_with_no_batch_dims_saveable --format json``: the splash
  row's temp against the dot row's (under half), or, where the compiler refuses dot for memory,
  splash fitting with a smaller required_bytes; the same on ``gpu:h100x8`` for cudnn and triton.
- ``readme``: Llama 3 8B at seq 8192 on ``tpu:v5p-8`` and ``gpu:h100x8`` with
  ``--attention dot,auto`` under ``--remat full,minimal`` (and the no-remat baseline), then
  ``fit`` on the same workload, which ranks them and recommends one (from the cache).
- ``fit``: the largest global batch that fits for Llama 3 8B at seq 8192 with the target's kernel
  and ``minimal`` remat (``fit --attention auto``), against dot attention.

These compiles are heavy (a minute or more each on 2 cores); every figure depends on the
compiler release, printed with it.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

GIB = 2**30
TARGETS = {"tpu": "tpu:v5p-8", "gpu": "gpu:h100x8"}
KERNELS = {"tpu": ("splash",), "gpu": ("cudnn", "triton")}
DONE_REMAT = "dots_with_no_batch_dims_saveable"


def jaxmem(args: list[str], out: pathlib.Path, name: str) -> dict | str:
  """Runs ``python -m jaxmem ARGS``, writes its stdout to OUT/NAME, returns it (JSON parsed)."""
  env = {**os.environ, "JAXMEM_NO_PROGRESS": "1", "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
  start = time.perf_counter()
  proc = subprocess.run([sys.executable, "-m", "jaxmem", *args], capture_output=True, text=True, env=env, check=False)
  seconds = time.perf_counter() - start
  (out / name).write_text(proc.stdout)
  line = "jaxmem " + " ".join(args)
  print(f"$ {line}   ({seconds:.0f} s, exit {proc.returncode})", flush=True)
  if proc.returncode != 0:
    print(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "(no stderr)", flush=True)
    return ""
  return json.loads(proc.stdout) if args[args.index("--format") + 1] == "json" else proc.stdout


def both(args: list[str], out: pathlib.Path, stem: str) -> dict:
  """The command in JSON (compiles) and markdown (from the row cache)."""
  doc = jaxmem([*args, "--format", "json"], out, f"{stem}.json")
  jaxmem([*args, "--format", "markdown"], out, f"{stem}.md")
  return doc or {"rows": []}


def gib(v: int | None) -> str:
  return "-" if v is None else f"{v / GIB:.2f}"


def done(kind: str, out: pathlib.Path) -> list[str]:
  target = TARGETS[kind]
  args = ["compare", "--model", "llama3-3b", "--target", target, "--seq", "8192", "--batch", "8"]
  args += ["--attention", ",".join(("dot", *KERNELS[kind])), "--remat", DONE_REMAT]
  doc = both(args, out, f"done-{kind}-llama3-3b")
  lines = []
  rows = {(r["attention"], r["remat"]): r for r in doc["rows"]}
  dot = rows.get(("dot", DONE_REMAT))
  for k in KERNELS[kind]:
    r = rows.get((k, DONE_REMAT))
    if r is None or dot is None:
      lines.append(f"{target} {k}: rows missing")
      continue
    if dot["error"] is None and r["error"] is None:
      ratio = r["temp_size_in_bytes"] / dot["temp_size_in_bytes"]
      verdict = "PASS" if ratio < 0.5 else "FAIL"
      lines.append(
          f"{target} {k}/dot temp = {gib(r['temp_size_in_bytes'])}/{gib(dot['temp_size_in_bytes'])} GiB "
          f"= {ratio:.3f} ({verdict}: under 0.5)"
      )
    else:
      ok = r["fits"] and r["required_bytes"] is not None and dot["required_bytes"] is not None
      ok = ok and r["required_bytes"] < dot["required_bytes"]
      lines.append(
          f"{target} dot refused ({dot['error'] is not None}); {k} fits {r['fits']}, required "
          f"{gib(r['required_bytes'])} vs dot {gib(dot['required_bytes'])} GiB ({'PASS' if ok else 'FAIL'})"
      )
  return lines


def readme(kind: str, out: pathlib.Path) -> list[str]:
  target = TARGETS[kind]
  args = ["--model", "llama3-8b", "--target", target, "--seq", "8192", "--batch", "8", "--attention", "dot,auto"]
  args += ["--remat", "full,minimal"]
  doc = both(["compare", *args], out, f"readme-{kind}-llama3-8b-compare")
  ranked = jaxmem(["fit", *args, "--format", "markdown"], out, f"readme-{kind}-llama3-8b-fit.md")
  lines = [
      f"{target} {r['attention']:7s} {r['remat']:8s} temp {gib(r['temp_size_in_bytes'])} required "
      f"{gib(r['required_bytes'])} of {gib(r['capacity_bytes'])} GiB fits {r['fits']}"
      for r in doc["rows"]
  ]
  if ranked:
    lines.append(f"{target} fit: {ranked.splitlines()[0]}")
  return lines


def fit_search(kind: str, out: pathlib.Path) -> list[str]:
  target = TARGETS[kind]
  lines = []
  for attention in ("auto", "dot"):
    args = ["fit", "--model", "llama3-8b", "--target", target, "--seq", "8192", "--attention", attention]
    doc = jaxmem([*args, "--remat", "minimal", "--format", "json"], out, f"fit-{kind}-llama3-8b-{attention}.json")
    for r in (doc or {"rows": []})["rows"]:
      lines.append(f"{target} fit --attention {attention}: {r['attention']} {r['remat']} max batch {r['max_batch']}")
  return lines


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", required=True, help="directory for the commands' outputs")
  p.add_argument("--parts", default="done,readme,fit")
  p.add_argument("--targets", default="tpu,gpu")
  a = p.parse_args()
  import jax

  out = pathlib.Path(a.out) / f"jax{jax.__version__}"  # one directory per compiler release
  out.mkdir(parents=True, exist_ok=True)

  summary = [f"python {sys.version.split()[0]}, jax {jax.__version__}"]
  for part in a.parts.split(","):
    for kind in a.targets.split(","):
      summary += {"done": done, "readme": readme, "fit": fit_search}[part](kind, out)
  text = "\n".join(summary)
  print("\n" + text)
  (out / "summary.txt").write_text(text + "\n")


if __name__ == "__main__":
  main()
