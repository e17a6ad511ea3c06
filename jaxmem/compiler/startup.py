"""Starting JAX the way jaxmem needs it, before anything else touches a backend.

JAX reads its platform list and the number of simulated CPU devices when its first backend
starts, and never again in that process. Everything that decides them lives here, so that the
CLI, the library entry points and worker processes start JAX the same way, once.

``import jaxmem`` changes nothing: neither ``os.environ`` nor ``jax.config``. JAX is started by
:func:`start_jax`, which every entry point that needs a backend calls first (the CLI, the API
functions, and below them anything that makes devices or compiles: targets, the TPU and GPU
topologies, the capacity probe). What the user did first decides the rest (checked on jax
0.10.2 and 0.12.0.1, no accelerator attached):

- A jaxmem call before any JAX array: :func:`start_jax` restricts JAX to its CPU platform
  (``jax_platforms``) and starts it quietly, so neither the CUDA plugin (which, once it tried and
  failed to start CUDA, cannot compile for GPUs in that process) nor libtpu initialise or print
  start-up errors; the user's later arrays live on the CPU, where JAX would have put them anyway.
- A JAX array first (a model's constructor calls ``PRNGKey``): JAX's plugin discovery ran with
  every platform allowed, the CUDA plugin failed its CUDA runtime check and never registered
  (JAX prints that, as it does without jaxmem). GPU targets still work:
  :mod:`jaxmem.compiler.cuda_plugin` registers the plugin late, for its compile-only topology.
  TPU targets never depended on the order (libtpu is loaded on demand).

Worker processes (``--jobs``) are started with the parent's platform list explicitly
(:func:`chosen_platforms`, then :func:`start_jax` with ``platforms=``), not through the environment.
"""

from __future__ import annotations

import os

import jax

from jaxmem._quiet import quiet
from jaxmem.errors import JaxmemError

_started = False


def start_jax(cpu_devices: int = 1, *, platforms: str | None = None) -> None:
  """Starts JAX's backends quietly, once, configured for what jaxmem does.

  On a machine without an accelerator (and with no platform chosen by ``JAX_PLATFORMS`` or
  ``jax_platforms``) JAX is restricted to its CPU platform, which it would end up on anyway: the
  CUDA plugin can then still compile for GPUs without one (it cannot once JAX tried and failed to
  start CUDA), and neither it nor libtpu prints start-up errors. ``platforms`` (a worker given its
  parent's :func:`chosen_platforms`) is used instead of that choice. ``cpu_devices`` simulated CPU
  devices are configured if JAX has not started yet. A process that already started JAX keeps
  its configuration.
  """
  global _started
  if _started:
    return
  if not backends_started():
    check_xla_flags()
    platforms = platforms or _cpu_unless_chosen()
    if platforms:
      jax.config.update("jax_platforms", platforms)
    if cpu_devices > max(1, jax.config.jax_num_cpu_devices):
      jax.config.update("jax_num_cpu_devices", cpu_devices)
  with quiet():
    jax.devices()
  _started = True


def chosen_platforms() -> str | None:
  """The platform list JAX runs with in this process, or that :func:`start_jax` would start it
  with: the one chosen (``jax_platforms``, ``JAX_PLATFORMS``), else ``"cpu"`` when no backend has
  started and no accelerator is attached, else None (JAX's default). What a worker is given."""
  return jax.config.jax_platforms or os.environ.get("JAX_PLATFORMS") or _cpu_unless_chosen()


def _cpu_unless_chosen() -> str | None:
  # "cpu" when no platform was chosen (JAX_PLATFORMS or jax_platforms), no backend has started
  # and no accelerator is attached: the platform JAX would end up on, without trying CUDA first.
  if os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms or backends_started():
    return None
  return None if attached_accelerator_present() else "cpu"


def check_xla_flags() -> None:
  """Makes XLA read ``XLA_FLAGS`` now, outside :func:`quiet`, so that a flag it does not know
  ends the process with XLA's own one-line message on stderr instead of silently.

  XLA parses ``XLA_FLAGS`` once per process, the first time it needs its debug options, and on an
  unknown flag or a bad value logs a fatal error ("Unknown flag in XLA_FLAGS: --xla_bogus_flag")
  and exits with status 1 from C++ (absl's QFATAL: no exception, no Python ``finally`` or
  ``atexit``). It first happens while the backends start, which runs with fd 2 silenced, so the
  message went to a temporary file that nobody read. ``CompileOptions()`` builds the debug
  options, hence parses the flags, without starting any backend or plugin (checked on jax 0.10.2
  and 0.12.0.1; a few microseconds).
  """
  if not os.environ.get("XLA_FLAGS"):
    return
  from jax._src.lib import xla_client  # private; CompileOptions has been there since jax 0.4

  xla_client.CompileOptions()


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
