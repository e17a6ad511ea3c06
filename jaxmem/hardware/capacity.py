"""The memory per device that the compiler lets a program use, for a TPU generation or a GPU.

``Device.memory_stats()`` raises on compile-only devices ("only supported for addressable PjRt
devices") and the topology object exposes only platform, version and fingerprint. The TPU
compiler does say what it considers available when a program does not fit, so
:func:`usable_hbm_bytes` compiles a deliberately oversized program for one device and reads
"exceeds available HBM (X)" from the error (units are GiB, two decimals, so +-5 MiB). Found:
v4 30.75 of 32 GiB, v5e 15.75 of 16, v5p 95.74 (more than the 95 GiB Google publishes, so
the chip must carry more), v6e 31.25 of 32, v7x 94.75 per device (two devices per 192 GiB chip).
The probe takes 0.04-0.7 s per TPU generation (2.3 s on v7x). The GPU compiler never fails for
size, so on GPU only the specification figure is available.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp

from jaxmem.hardware import tpu
from jaxmem.hardware.availability import compile_probe, quietly
from jaxmem.hardware.gpu import GPU_SPECS
from jaxmem.hardware.oom import parse_oom
from jaxmem.errors import JaxmemError


@functools.cache
def _tpu_available_hbm(name: str) -> int | None:
  gen = tpu.TPU_GENERATIONS[name]
  devices = tpu.tpu_devices(name, gen.sizes[0])[:1]
  # A 256 GiB float32 outer product that a cumsum must hold whole: larger than any TPU's HBM; the
  # compiler rejects it after buffer assignment, in 0.04-2 s.
  _, error = quietly(lambda: compile_probe(devices, (1 << 18,), _oversized))
  oom = parse_oom(str(error)) if error is not None else None
  return oom.available_bytes if oom else None


def _oversized(v):
  return jnp.cumsum(jnp.outer(v, v), axis=0)[-1]


def usable_hbm_bytes(name: str) -> int:
  """HBM per device that the compiler lets a program use, for a TPU generation or a GPU name.

  TPU: read from the compiler's out-of-memory message (v5e: 15.75 GiB of 16), to +-5 MiB; the
  specification figure per device if that fails. GPU: the specification figure
  (``device_memory_size``), because the GPU compiler enforces no limit.
  """
  key = name.strip().lower()
  if key in GPU_SPECS:
    return GPU_SPECS[key].hbm_bytes
  gen = tpu.tpu_generation(name)
  try:
    available = _tpu_available_hbm(gen.name)
  except JaxmemError:
    available = None
  return available or gen.hbm_bytes_per_device
