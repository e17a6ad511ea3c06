"""Starting JAX the way jaxmem needs it, before anything else touches a backend.

JAX reads its platform list and the number of simulated CPU devices when its first backend
starts, and never again in that process. Everything that decides them lives here, so that the
CLI, the library entry points and worker processes start JAX the same way, once.
"""

from __future__ import annotations

import os

import jax

from jaxmem._quiet import quiet
from jaxmem.errors import JaxmemError

_started = False


def start_jax(cpu_devices: int = 1) -> None:
  """Starts JAX's backends quietly, once, configured for what jaxmem does.

  On a machine without an accelerator (and with ``JAX_PLATFORMS`` unset) JAX is restricted to
  its CPU platform, which it would end up on anyway: the CUDA plugin can then still compile for
  GPUs without one (it cannot once JAX tried and failed to start CUDA), and neither it nor
  libtpu prints start-up errors. ``cpu_devices`` simulated CPU devices are configured if JAX
  has not started yet. A process that already started JAX keeps its configuration.
  """
  global _started
  if _started:
    return
  if not os.environ.get("JAX_PLATFORMS") and not jax.config.jax_platforms and not attached_accelerator_present():
    os.environ["JAX_PLATFORMS"] = "cpu"
    jax.config.update("jax_platforms", "cpu")
  if cpu_devices > max(1, jax.config.jax_num_cpu_devices):
    try:
      jax.config.update("jax_num_cpu_devices", cpu_devices)
    except RuntimeError:  # JAX already started: cpu_devices() explains how to get more
      pass
  with quiet():
    jax.devices()
  _started = True


def started() -> bool:
  """Whether :func:`start_jax` has run in this process."""
  return _started


def start_distributed() -> None:
  """``jax.distributed.initialize()`` for multi-host TPU/GPU VMs (the coordinator comes from the
  Cloud TPU / SLURM / Kubernetes environment); a failure is one line. Call before
  :func:`start_jax`: it must run before the first backend starts."""
  try:
    jax.distributed.initialize()
  except (ValueError, RuntimeError) as e:
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    raise JaxmemError(f"--distributed: jax.distributed.initialize() failed: {first}") from None


def attached_accelerator_present() -> bool:
  """True when this machine has a TPU or an NVIDIA GPU, judged from device files only (no
  JAX backend is started, so the answer can decide how JAX is started)."""
  return any(os.path.exists(p) for p in ("/dev/nvidia0", "/dev/accel0", "/dev/vfio/0")) or bool(
      os.environ.get("TPU_ACCELERATOR_TYPE")
  )
