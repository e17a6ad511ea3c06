"""Temporaries of one MoE layer's train step, per routed-expert implementation and target.

Run: python benchmarks/moe_layer.py [--model qwen3-30b-a3b] [--tokens 4096] [--target tpu:v5p-8]
[--target gpu:h100]. For each target (one device of it) it compiles, without the hardware,
the gradient of one MoE layer of ``--model`` (router, routed and shared experts; no attention)
for ``--tokens`` tokens in one sequence, with the dropless implementation and with the capacity
implementation at several capacity factors, and prints a table; the last line is JSON.

What it shows (jax 0.10.2 and 0.12.0.1): the capacity path's temporaries grow with the capacity
factor on both compilers. The dropless path's ``jax.lax.ragged_dot`` is a native grouped matmul
on TPU (temporaries of the order of the routed copies [tokens x k, D]) but XLA's GPU compiler
expands it into a dense masked matmul over all E experts, materialising [tokens x k, E, D]:
E times more, which is what a GPU figure for ``--moe-impl dropless`` then reports.

Measured with jax 0.12.0.1 (libtpu 0.0.50.1), qwen3-30b-a3b, 4096 tokens, GiB of temporaries:

  target      dropless   capacity 1.0   1.25   2.0
  tpu:v5p-8       2.14           0.55   1.03   1.06
  gpu:h100       48.85           0.90   1.12   1.66

On TPU about 1 GiB of the dropless figure goes with the float32 parameters' cast: with
``param_dtype=bfloat16`` it is 1.18 GiB (the layer's routed weights are 1.13 GiB in bf16).
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from jaxmem.models import StepChoices, get_config  # noqa: E402
from jaxmem.models.layers import DEFAULT_INIT, no_constraint  # noqa: E402
from jaxmem.models.moe import MoE  # noqa: E402
from jaxmem.hardware.targets import get_target  # noqa: E402

GIB = 2**30


def layer_temp(model: str, target: str, tokens: int, impl: str, factor: float) -> int:
  cfg, choices = get_config(model), StepChoices(moe_impl=impl, capacity_factor=factor)
  device = jax.sharding.SingleDeviceSharding(get_target(target).devices()[0])
  graphdef, params = nnx.split(
      nnx.eval_shape(lambda: MoE(cfg, choices=choices, out_init=DEFAULT_INIT, rngs=nnx.Rngs(0))), nnx.Param
  )
  params = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device), params)
  x = jax.ShapeDtypeStruct((1, tokens, cfg.d_model), cfg.compute_jnp_dtype, sharding=device)

  def loss(p, x_btd):
    return jnp.mean(jnp.square(nnx.merge(graphdef, p)(x_btd, constrain=no_constraint).astype(jnp.float32)))

  compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(params, x).compile()
  return compiled.memory_analysis().temp_size_in_bytes


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--model", default="qwen3-30b-a3b")
  ap.add_argument("--tokens", type=int, default=4096)
  ap.add_argument("--target", action="append", default=None)
  args = ap.parse_args()
  targets = args.target or ["tpu:v5p-8", "gpu:h100"]
  cases = [("dropless", 1.0), ("capacity", 1.0), ("capacity", 1.25), ("capacity", 2.0)]
  rows = []
  for target in targets:
    for impl, factor in cases:
      temp = layer_temp(args.model, target, args.tokens, impl, factor)
      factor_or_none = factor if impl == "capacity" else None
      rows.append(dict(target=target, impl=impl, capacity_factor=factor_or_none, temp_gib=round(temp / GIB, 3)))
      print(f"{target:12s} {impl:9s} {'' if impl == 'dropless' else factor:>5} temp {temp / GIB:8.3f} GiB", flush=True)
  print(json.dumps(dict(model=args.model, tokens=args.tokens, rows=rows)))


if __name__ == "__main__":
  main()
