"""Compilation targets: which devices a program is compiled for.

A target names hardware: ``cpu`` (this machine's CPU, one device) and ``cpu:N`` (N simulated CPU
devices, for trying meshes on a laptop). Accelerator targets are added by
:mod:`jaxmem.accelerators`.

``cpu:N`` needs JAX to have been started with at least N CPU devices
(``jax.config.update("jax_num_cpu_devices", N)`` before JAX's first use); the CLI does this for
you from the targets it is given.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import numpy as np

from jaxmem._quiet import quiet
from jaxmem.errors import JaxmemError
from jaxmem.sharding import format_mesh


@dataclasses.dataclass(frozen=True, kw_only=True)
class Target:
  """A named set of devices to compile for."""

  name: str
  platform: str  # "cpu", "tpu" or "gpu": the compiler used
  num_devices: int
  device_kind: str
  capacity_bytes: int | None  # usable memory per device; None where there is no such limit
  capacity_note: str | None = None  # why capacity_bytes is None, or where the figure comes from
  has_host_memory: bool = False  # a separate host memory space for remat offload

  def devices(self) -> list:
    """The devices, real or compile-only, in a stable order."""
    if self.platform == "cpu":
      return cpu_devices(self.num_devices)
    raise JaxmemError(f"target {self.name}: no devices for platform {self.platform}")

  def make_mesh(self, axis_sizes: tuple[tuple[str, int], ...]) -> jax.sharding.Mesh:
    """A mesh over this target's devices with the given ``(axis, size)`` pairs."""
    names = tuple(a for a, _ in axis_sizes)
    shape = tuple(s for _, s in axis_sizes)
    devices = self.devices()
    if int(np.prod(shape)) != len(devices):
      raise JaxmemError(
          f"mesh {format_mesh(axis_sizes)} has {int(np.prod(shape))} devices but target "
          f"{self.name} has {len(devices)}; make the axis sizes multiply to {len(devices)}"
      )
    return jax.sharding.Mesh(np.array(devices, dtype=object).reshape(shape), names)


def cpu_devices(n: int) -> list:
  with quiet():  # the first backend initialisation loads the plugins, which are noisy
    devices = jax.devices("cpu")
  if len(devices) < n:
    raise JaxmemError(
        f"target cpu:{n} needs {n} CPU devices but JAX was started with {len(devices)}; call "
        f'jax.config.update("jax_num_cpu_devices", {n}) before JAX\'s first use (the CLI does this)'
    )
  return devices[:n]


_CPU_RE = re.compile(r"^cpu(?::(\d+))?$")


def get_target(name: str) -> Target:
  """Looks a target up by name; an unknown name is a :class:`JaxmemError` listing valid ones."""
  m = _CPU_RE.match(name.strip().lower())
  if m:
    n = int(m.group(1) or 1)
    if n < 1:
      raise JaxmemError(f"target {name!r}: the device count must be at least 1")
    return Target(
        name="cpu" if n == 1 else f"cpu:{n}",
        platform="cpu",
        num_devices=n,
        device_kind="cpu",
        capacity_bytes=None,
        capacity_note="the CPU backend has no device memory limit; its temporaries overstate an accelerator's",
    )
  raise JaxmemError(f"unknown target {name!r}; valid targets: {', '.join(target_names())}")


def target_names() -> list[str]:
  return ["cpu", "cpu:N"]


def cpu_devices_needed(names: list[str]) -> int:
  """The number of simulated CPU devices the given target names need (for the CLI's start-up)."""
  need = 1
  for name in names:
    m = _CPU_RE.match(name.strip().lower())
    if m and m.group(1):
      need = max(need, int(m.group(1)))
  return need
