"""``plan --emit maxtext`` checked against MaxText: the plan's overrides through MaxText's own
config parser and, with ``--compile``, through its ``train_compile``, its peak beside jaxmem's.

Runs in a venv with MaxText and jaxmem (``pip install "maxtext==0.2.5"`` and its requirements,
then ``pip install --no-deps -e .``), as ``benchmarks/maxtext_compile.py`` does:

  python benchmarks/emit_maxtext.py                      # tiny on tpu:v5e-4: plan, then MaxText's parser
  python benchmarks/emit_maxtext.py --compile            # and MaxText's train_compile (its peak beside jaxmem's)
  python benchmarks/emit_maxtext.py --model llama3-8b --target tpu:v5p-16 --batch 64 --seq 8192 --compile

MaxText runs in processes of its own (it starts JAX with its own settings): the parser through
``pyconfig.initialize``, the compile through ``benchmarks/maxtext_compile.py``. The TPU topology
is the target's accelerator type (``tpu:v5e-4`` -> ``compile_topology=v5e-4``) and its slices.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

# MaxText's parser on the overrides (argv[1], JSON): the batch, mesh and remat policy it resolved.
_PARSE = """
import json, os, sys
import maxtext
from maxtext.configs import pyconfig
base = os.path.join(os.path.dirname(maxtext.__file__), "configs", "base.yml")
cfg = pyconfig.initialize(["train", base, *json.loads(sys.argv[1]), "run_name=jaxmem-emit",
                           "skip_jax_distributed_system=true"])
print("PARSED " + json.dumps(dict(global_batch=cfg.global_batch_size_to_train_on, ici=list(cfg.ici_parallelism),
                                  dcn=list(cfg.dcn_parallelism), remat_policy=cfg.remat_policy,
                                  attention=cfg.attention, max_target_length=cfg.max_target_length)))
"""


def _args() -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--model", default="tiny")
  p.add_argument("--target", default="tpu:v5e-4", help="a TPU target (MaxText's train_compile compiles for TPU topologies)")
  p.add_argument("--slices", type=int, default=1)
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--seq", type=int, default=128)
  p.add_argument("--budget", type=int, default=2)
  p.add_argument("--compile", action="store_true", help="also compile MaxText's train step with the overrides")
  p.add_argument("--json", help="write the overrides, the parse and the peaks here")
  return p.parse_args()


def main() -> int:
  args = _args()
  import jaxmem

  if not args.target.startswith("tpu:"):
    print("emit_maxtext: MaxText's train_compile compiles for TPU topologies; give a tpu: target", file=sys.stderr)
    return 2
  target = jaxmem.target(args.target, slices=args.slices)
  result = jaxmem.plan(model=args.model, target=target, batch=args.batch, seq=args.seq, budget=args.budget)
  best = result.recommended
  if best is None:
    print(f"emit_maxtext: nothing of {result.compiles} compiles fits; no launch to check", file=sys.stderr)
    return 1
  launch = jaxmem.maxtext_overrides(result)
  topology = [f"compile_topology={args.target.removeprefix('tpu:')}", f"compile_topology_num_slices={args.slices}"]
  overrides = launch.line().split()
  print(f"jaxmem plan: {launch.configuration} on {result.target}")
  print("overrides: " + launch.line())
  for n in launch.notes:
    print(f"note: {n}")
  out = dict(configuration=launch.configuration, overrides=launch.overrides, notes=list(launch.notes),
             jaxmem_peak_bytes=best.peak_memory_in_bytes, jaxmem_required_bytes=best.required_bytes)
  out["parsed"] = _parse([*overrides, *topology])
  print("MaxText's parser: " + json.dumps(out["parsed"]))
  if out["parsed"]["global_batch"] != args.batch:
    print(f"emit_maxtext: MaxText's global batch {out['parsed']['global_batch']} is not jaxmem's {args.batch}",
          file=sys.stderr)
    return 1
  if args.compile:
    out["maxtext"] = _compile([*overrides, *topology])
    gib = 1024**3
    mt = out["maxtext"].get("peak")
    print(f"peak per device: jaxmem {best.peak_memory_in_bytes / gib:.4f} GiB, MaxText "
          f"{'-' if mt is None else f'{mt / gib:.4f} GiB'} (MaxText {out['maxtext'].get('maxtext')}, "
          f"jax {out['maxtext'].get('jax')}, libtpu {out['maxtext'].get('libtpu')})")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=2)
  return 0


def _parse(overrides: list[str]) -> dict:
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}  # the parser needs no accelerator
  proc = subprocess.run([sys.executable, "-c", _PARSE, json.dumps(overrides)], capture_output=True, text=True, env=env)
  if proc.returncode:
    sys.stderr.write(proc.stderr[-4000:])
    raise SystemExit("emit_maxtext: MaxText's parser refused the overrides (above)")
  return json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("PARSED "))[len("PARSED "):])


def _compile(overrides: list[str]) -> dict:
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "maxtext.json")
    proc = subprocess.run([sys.executable, os.path.join(HERE, "maxtext_compile.py"), "--top", "5", "--json", path,
                           "--", *overrides, "run_name=jaxmem-emit"], text=True)
    if proc.returncode or not os.path.exists(path):
      raise SystemExit("emit_maxtext: MaxText's train_compile failed (above)")
    with open(path) as f:
      return json.load(f)


if __name__ == "__main__":
  sys.exit(main())
