"""Registering the CUDA plugin for compile-only GPU targets when JAX's start-up left it out.

Without ``JAX_PLATFORMS=cpu``, on a machine with no CUDA runtime, the plugin fails its CUDA
version check while JAX discovers plugins and never registers, and every cuda topology in that
process fails "topology not implemented for cuda" (libtpu is not affected), unless the plugin is
registered again later with the check skipped, which :func:`register_late` does (checked on jax
0.10.2 and 0.12.0.1). That happens when the user's own first JAX call started JAX before jaxmem.
"""

from __future__ import annotations

import importlib
import importlib.util
import os

from jaxmem._quiet import quiet

_CUDA_PLUGINS = ("jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13")


def plugin_modules() -> list[str]:
  """The CUDA plugin modules installed here (cuda12, cuda13)."""
  out = []
  for name in _CUDA_PLUGINS:
    try:
      if importlib.util.find_spec(name) is not None:
        out.append(name)
    except ImportError:
      pass
  return out


def register_late() -> bool:
  """Registers an installed CUDA plugin that JAX's start-up left out; True if one registered.

  Checked on jax 0.10.2 and 0.12.0.1: with JAX_PLATFORMS unset (or naming cuda) on a machine
  without the CUDA runtime, the plugin's ``initialize()`` fails its CUDA version check ("Unable to
  load CUDA. Is it installed?") when JAX's first backend starts, and never registers, so JAX has
  no cuda topology for the rest of the process. Calling ``initialize()`` again with that check
  skipped (JAX_SKIP_CUDA_CONSTRAINTS_CHECK, the plugin's own switch) registers its topology
  factory and its custom calls; JAX's backends, already started, are left as they are, so the
  user's arrays stay where they are and only compile-only GPU devices are added.
  """
  registered = False
  saved = os.environ.get("JAX_SKIP_CUDA_CONSTRAINTS_CHECK")
  os.environ["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] = "1"
  try:
    for name in plugin_modules():
      try:
        with quiet():
          importlib.import_module(name).initialize()
        registered = True
      except (ImportError, OSError, RuntimeError):  # a broken install: the caller says what to do
        continue
  finally:
    if saved is None:
      del os.environ["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"]
    else:
      os.environ["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] = saved
  return registered


def no_topology_message() -> str:
  """Why no cuda topology could be made, and what to do."""
  if not plugin_modules():
    return "the GPU compiler (CUDA plugin) is not installed: pip install 'jaxmem[cuda]'"
  # Only after register_late() failed too (see there).
  return ("the CUDA plugin is installed but did not load (no CUDA runtime here), and registering it "
          "after JAX started failed: let jaxmem start JAX (call it before anything else uses JAX), or set "
          "JAX_PLATFORMS=cpu before JAX starts")
