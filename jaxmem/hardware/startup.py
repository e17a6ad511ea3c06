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
  :mod:`jaxmem.hardware.cuda_plugin` registers the plugin late, for its compile-only topology.
  TPU targets never depended on the order (libtpu is loaded on demand).

Worker processes (``--jobs``) are started with the parent's platform list explicitly
(:func:`chosen_platforms`, then :func:`start_jax` with ``platforms=``), not through the environment.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import re
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

import jax

from jaxmem import compilers
from jaxmem._quiet import quiet
from jaxmem.errors import JaxmemError

_started = False
T = TypeVar("T")


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
    if platforms is None:  # else a worker, whose parent checked the flags
      check_xla_flags()
    platforms = platforms or _cpu_unless_chosen()
    if platforms:
      jax.config.update("jax_platforms", platforms)
    if cpu_devices > max(1, jax.config.jax_num_cpu_devices):
      jax.config.update("jax_num_cpu_devices", cpu_devices)
  with quiet():
    jax.devices()
  _started = True


def init_worker(cpu_devices: int, platforms: str | None, environment: Any = None) -> None:
  """A worker process's start: ``environment`` applied (a compiler release's,
  :class:`jaxmem.compilers.Environment`: JAX reads ``TPU_LIBRARY_PATH`` and finds its plugins
  when a backend or topology first needs them, after this), then :func:`start_jax` with the
  parent's platform list, given explicitly: a spawned worker inherits the environment but not
  ``jax.config``, where the parent's :func:`start_jax` (or the user) chose it."""
  if environment is not None:
    environment.apply()
  start_jax(cpu_devices, platforms=platforms)


def in_worker(fn: Callable[..., T], /, *args: Any, environment: Any = None, cpu_devices: int = 1, **kwargs: Any) -> T:
  """``fn(*args, **kwargs)`` in a fresh worker process (spawned: JAX's threads do not survive a
  fork) started by :func:`init_worker`; ``fn``, its arguments and its result travel by pickle."""
  ctx = multiprocessing.get_context("spawn")
  with cf.ProcessPoolExecutor(max_workers=1, mp_context=ctx, initializer=init_worker,
                              initargs=(cpu_devices, chosen_platforms(), environment)) as pool:
    try:
      return pool.submit(fn, *args, **kwargs).result()
    except BrokenProcessPool:
      if environment is None:
        raise
      raise compilers.worker_died(environment.spec.text) from None  # a release's worker died as it ran


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
  """Checks ``XLA_FLAGS`` with XLA's own parser before any backend starts: a flag XLA does not
  know, or a value it cannot read, is a one-line :class:`JaxmemError` (the CLI exits 2).

  XLA parses ``XLA_FLAGS`` once per process, the first time it needs its debug options, and on a
  bad flag logs a fatal error and exits with status 1 from C++ (absl's QFATAL: no exception, no
  Python ``finally`` or ``atexit``): "Unknown flag in XLA_FLAGS: --xla_bogus_flag", or for a bad
  value "Couldn't interpret value abc for flag xla_gpu_autotune_level." followed by the usage of
  every flag, hundreds of lines. It first happens while the backends start, which runs with fd 2
  silenced, so the process ended with nothing printed. The parse therefore runs first in a child
  interpreter (``CompileOptions()`` parses the flags without starting a backend or plugin;
  0.3 s, only when ``XLA_FLAGS`` is set), whose complaint is read. Where no child can be started,
  the parse runs here, unsilenced, so XLA's own message at least reaches the terminal.
  """
  flags = os.environ.get("XLA_FLAGS")
  if not flags:
    return
  try:
    child = subprocess.run(
        [sys.executable, "-c", _PARSE_XLA_FLAGS], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
    )
  except (OSError, subprocess.SubprocessError):  # no interpreter to run (embedded Python)
    from jax._src.lib import xla_client  # private; CompileOptions has been there since jax 0.4

    xla_client.CompileOptions()
    return
  if child.returncode != 0:
    raise JaxmemError(f"XLA_FLAGS={flags!r} is refused by XLA: {_xla_complaint(child.stderr, child.returncode)}")


# jaxlib's own module (jax is not imported): CompileOptions builds XLA's debug options, which
# parses XLA_FLAGS (checked on jax 0.10.2 and 0.12.0.1).
_PARSE_XLA_FLAGS = "from jaxlib import xla_client; xla_client.CompileOptions()"
# A log line of XLA's: "F1201 10:37:49.789605   20291 parse_flags_from_env.cc:234] message".
_XLA_LOG = re.compile(r"^[EF]\d{4} [\d:.]+\s+\d+ \S+:\d+\] (.*)$", re.M)


def _xla_complaint(stderr: str, status: int) -> str:
  """The first error or fatal line XLA logged (the glog prefix dropped), else the last line."""
  m = _XLA_LOG.search(stderr)
  if m:
    return m.group(1).strip()
  lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
  return lines[-1] if lines else f"exit status {status}"


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
    raise JaxmemError(f"`distributed`: jax.distributed.initialize() failed: {first}") from None


def attached_accelerator_present() -> bool:
  """True when this machine has a TPU, an NVIDIA GPU or an AMD GPU (``/dev/kfd``), judged from
  device files only (no JAX backend is started, so the answer can decide how JAX is started)."""
  return any(os.path.exists(p) for p in ("/dev/nvidia0", "/dev/accel0", "/dev/vfio/0", "/dev/kfd")) or bool(
      os.environ.get("TPU_ACCELERATOR_TYPE")
  )
