"""Starting JAX the way jaxmem needs it, before anything else touches a backend.

JAX reads its platform list and the number of simulated CPU devices when its first backend
starts, and never again in that process. Everything that decides them lives here, so that the
CLI, the library entry points and worker processes start JAX the same way, once.

Whatever the user did first (checked on jax 0.10.2 and 0.12.0.1, no accelerator attached):

- ``import jaxmem`` before any JAX array exists: :func:`prefer_cpu` restricts JAX to its CPU
  platform at import (only the platform list is set; no backend starts), so the user's own first
  JAX call starts quietly on the CPU, as it would have ended up anyway.
- A JAX array first (a model's constructor calls ``PRNGKey``): JAX's plugin discovery ran with
  every platform allowed, the CUDA plugin failed its CUDA runtime check and never registered.
  GPU targets still work: :mod:`jaxmem.compiler.accelerators` registers the plugin late, for its
  compile-only topology. TPU targets never depended on the order (libtpu is loaded on demand).
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
  prefer_cpu()
  if cpu_devices > max(1, jax.config.jax_num_cpu_devices):
    try:
      jax.config.update("jax_num_cpu_devices", cpu_devices)
    except RuntimeError:  # JAX already started: cpu_devices() explains how to get more
      pass
  with quiet():
    jax.devices()
  _started = True


def prefer_cpu() -> None:
  """Restricts JAX to its CPU platform when no accelerator is attached, no platform was chosen
  (``JAX_PLATFORMS`` or ``jax_platforms``) and no backend has started; otherwise does nothing.
  Starts nothing: it runs at ``import jaxmem``."""
  if backends_started() or os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms:
    return
  if attached_accelerator_present():
    return
  os.environ["JAX_PLATFORMS"] = "cpu"  # for worker processes too
  jax.config.update("jax_platforms", "cpu")


def backends_started() -> bool:
  """Whether any JAX backend has started in this process (by jaxmem or by the user)."""
  from jax._src import xla_bridge  # private, but the only place that knows; checked on 0.10.2 and 0.12.0.1

  return xla_bridge.backends_are_initialized()


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
  """True when this machine has a TPU, an NVIDIA GPU or an AMD GPU (``/dev/kfd``), judged from
  device files only (no JAX backend is started, so the answer can decide how JAX is started)."""
  return any(os.path.exists(p) for p in ("/dev/nvidia0", "/dev/accel0", "/dev/vfio/0", "/dev/kfd")) or bool(
      os.environ.get("TPU_ACCELERATOR_TYPE")
  )
