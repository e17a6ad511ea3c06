"""Temporaries of attention's forward + backward, per implementation, compiled without the device.

Run: python benchmarks/attention.py [--targets tpu:v5p-8,gpu:h100] [--batch 4 --seq 4096
--heads 16 --kv-heads 16 --head-dim 128] [--mesh 1]. For each target, every implementation the
target supports is compiled side by side in this one run: ``jax.grad`` of
``attend(q, k, v).astype(float32).sum()`` with respect to q, k and v, bfloat16 inputs, on one
device of the target (``--mesh N`` compiles over N devices instead: batch over data, as the
train step shards it). It prints one line per (target, implementation) with argument, temp and
peak MiB and temp as a fraction of dot's, then a JSON object with every figure. The figures
depend on the compiler release (jax, libtpu, CUDA plugin versions are printed with them).
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

from jaxmem.hardware.targets import get_target  # noqa: E402
from jaxmem.program.sharding import mesh_axes  # noqa: E402

from jaxmem.models.attention_registry import IMPLEMENTATIONS, AttentionShapes, choose_attention  # noqa: E402

MIB = 2**20


def measure(target_name: str, shapes: AttentionShapes, devices: int) -> list[dict]:
  target = get_target(target_name)
  mesh = Mesh(np.array(target.devices()[:devices]), ("data",))
  axes = mesh_axes(mesh)
  batch_sh = NamedSharding(mesh, PartitionSpec("data"))
  q = jax.ShapeDtypeStruct((shapes.batch, shapes.seq, shapes.num_heads, shapes.head_dim), jnp.bfloat16, sharding=batch_sh)
  kv = jax.ShapeDtypeStruct(
    (shapes.batch, shapes.kv_seq, shapes.num_kv_heads, shapes.head_dim), jnp.bfloat16, sharding=batch_sh
  )
  rows = []
  # dot twice: MaxText's default bf16 scores, and float32 scores (float32_qk_product=True).
  runs = [("dot", None), ("dot", "float32"), *((n, None) for n in IMPLEMENTATIONS if n != "dot")]
  for name, qk_dtype in runs:
    if IMPLEMENTATIONS[name].supports(target.platform, shapes, axes=axes) is not None:
      continue
    choice = choose_attention(name, platform=target.platform, shapes=shapes, mesh=mesh, axes=axes, qk_dtype=qk_dtype)

    def loss(q_btnh, k_bskh, v_bskv, attend=choice.attend):
      return attend(q_btnh, k_bskh, v_bskv, causal=True).astype(jnp.float32).sum()

    start = time.perf_counter()
    with choice.lowering():
      lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, kv, kv)
    compiled = lowered.compile()
    seconds = time.perf_counter() - start
    mem = compiled.memory_analysis()
    rows.append({
      "target": target_name, "attention": name if qk_dtype is None else f"{name}:qk-{qk_dtype}",
      "argument_mib": mem.argument_size_in_bytes / MIB, "temp_mib": mem.temp_size_in_bytes / MIB,
      "peak_mib": getattr(mem, "peak_memory_in_bytes", 0) / MIB or None, "compile_s": seconds,
      "notes": list(choice.notes),
    })
  dot_temp = next(r["temp_mib"] for r in rows if r["attention"] == "dot")
  for r in rows:
    r["temp_over_dot"] = r["temp_mib"] / dot_temp
  return rows


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--targets", default="tpu:v5p-8,gpu:h100")
  p.add_argument("--batch", type=int, default=4)
  p.add_argument("--seq", type=int, default=4096)
  p.add_argument("--heads", type=int, default=16)
  p.add_argument("--kv-heads", type=int, default=None, help="default: --heads (multi-head attention)")
  p.add_argument("--head-dim", type=int, default=128)
  p.add_argument("--mesh", type=int, default=1, help="devices to compile over (batch split over them)")
  a = p.parse_args()
  shapes = AttentionShapes(
    batch=a.batch, seq=a.seq, kv_seq=a.seq, num_heads=a.heads, num_kv_heads=a.kv_heads or a.heads,
    head_dim=a.head_dim, v_head_dim=a.head_dim, dtype="bfloat16",
  )
  import jaxlib

  print(f"jax {jax.__version__}, jaxlib {jaxlib.__version__}; {shapes}")
  rows = []
  for name in a.targets.split(","):
    for r in measure(name.strip(), shapes, a.mesh):
      rows.append(r)
      peak = f"{r['peak_mib']:9.0f}" if r["peak_mib"] else "        -"
      print(
        f"{r['target']:10s} {r['attention']:15s} arg {r['argument_mib']:7.0f}  temp {r['temp_mib']:8.0f}  "
        f"peak {peak} MiB  temp/dot {r['temp_over_dot']:.3f}  compile {r['compile_s']:.1f}s"
      )
  print(json.dumps({"jax": jax.__version__, "shapes": vars(shapes), "rows": rows}))


if __name__ == "__main__":
  main()
