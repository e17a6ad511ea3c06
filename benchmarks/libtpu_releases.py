"""Which libtpu releases load under this jax, and which of them compile a Pallas kernel.

For each release (fetched once by jaxmem's ``--compiler`` machinery into the row cache's folder),
three small compiles in fresh processes whose ``TPU_LIBRARY_PATH`` names its ``libtpu.so``, for
``v5e:2x2`` without a device:

- plain: a jitted matmul (an XLA program, no kernel);
- kernel: JAX's splash attention kernel (causal, 2 heads, seq 512), as this jax writes it (what
  jaxmem's ``--attention splash``, ``auto`` on TPU, compiles);
- kernel@15: the same kernel written in Mosaic's forward-compatible version 15, the version jax
  writes when exporting (``jax._src.tpu_custom_call.get_ir_version``; set here through that
  module's ``ir_version_override`` hook, to probe the format, not as a fix).

Each cell is "compiles", the error's first line, or "crashed" (the process died with no error).
The build date is the ``Built on`` line in the library. docs/versions.md ("The releases of a
run's date") came from here, run with jax 0.12.0.1 and with jax 0.10.2:

  python benchmarks/libtpu_releases.py 0.0.20 0.0.22 0.0.33 0.0.39 0.0.43 0.0.50
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

_PROBE = r'''
import os, sys
kind, irv = sys.argv[1], sys.argv[2]
import jax, jax.numpy as jnp
from jax.experimental import topologies
if irv != "-":
  from jax._src import tpu_custom_call
  tpu_custom_call.ir_version_override = lambda: int(irv)
try:
  jax.config.update("jax_mosaic_unzip_debug_locations", False)  # a field releases before 0.0.50 reject
except AttributeError:  # jax 0.10.2 has no such option
  pass
dev = topologies.get_topology_desc("v5e:2x2", "tpu").devices[0]
sharding = jax.sharding.SingleDeviceSharding(dev)
try:
  if kind == "plain":
    s = jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16, sharding=sharding)
    jax.jit(lambda a, b: jnp.tanh(a @ b) @ b).lower(s, s).compile()
  else:
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
    mask = sm.MultiHeadMask([sm.CausalMask((512, 512)) for _ in range(2)])
    s = jax.ShapeDtypeStruct((1, 2, 512, 128), jnp.bfloat16, sharding=sharding)
    jax.jit(jax.vmap(sk.make_splash_mha(mask, head_shards=1, q_seq_shards=1))).lower(s, s, s).compile()
  print("RESULT compiles")
except Exception as e:
  print("RESULT " + (str(e).strip().splitlines() or [type(e).__name__])[0][:160])
'''

PROBES = (("plain", "-"), ("kernel", "-"), ("kernel", "15"))


def built_on(path: str) -> str:
  with open(path, "rb") as f:
    m = re.search(rb"Built on ([A-Z][a-z]{2} +\d+ \d{4})", f.read())
  return m.group(1).decode() if m else "-"


def probe(library: str, kind: str, irv: str) -> str:
  env = dict(os.environ, TPU_LIBRARY_PATH=library, JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
  done = subprocess.run([sys.executable, "-c", _PROBE, kind, irv], capture_output=True, text=True, env=env,
                        timeout=900, stdin=subprocess.DEVNULL)
  said = [ln[len("RESULT "):] for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
  return said[0] if said else f"crashed (exit {done.returncode})"


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("releases", nargs="+", help="libtpu versions, e.g. 0.0.33")
  ns = ap.parse_args(argv)
  import jax

  from jaxmem import compilers
  from jaxmem.errors import JaxmemError

  print(f"jax {jax.__version__}\n")
  print("| libtpu | built | plain | kernel | kernel@15 |\n|---|---|---|---|---|")
  for v in ns.releases:
    try:
      library = dict(compilers.environment(f"libtpu=={v}").variables)["TPU_LIBRARY_PATH"]
    except JaxmemError as e:
      print(f"| {v} | - | {e} | | |")
      continue
    cells = [probe(library, kind, irv) for kind, irv in PROBES]
    print(f"| {v} | {built_on(library)} | " + " | ".join(cells) + " |", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
