"""The host's memory: the RAM of the machine that carries a target's accelerators, and the verdict
on the bytes a step keeps there (remat offload's pinned host memory).

A remat policy that offloads moves residuals from the device's memory to the host's; the
compiler reports them in the ``host_*`` fields (``host_total_bytes``), never part of what must
fit on the device. They must fit on the host instead. Each target spec (a TPU generation in
:mod:`jaxmem.hardware.tpu`, a GPU part in :mod:`jaxmem.hardware.gpu`) carries a
:class:`HostSpec`: the machine type that carries it, how many accelerators one such host has,
its RAM, and the page that publishes the figure (``None`` with the reason where none is
published).

Per device, a host's share is its RAM over the accelerator devices it carries
(:func:`host_share`): every device of a host offloads to the same RAM, and under SPMD each
offloads the same bytes. The share ignores what the host's own processes (the Python process,
the input pipeline, the runtime) hold, so a row near it is closer than it looks.
"""

from __future__ import annotations

import dataclasses

from jaxmem.records import Record

GB = 10**9  # the machine pages quote RAM in GB (10^9 bytes), TPU spec tables in GiB
GiB = 1 << 30


@dataclasses.dataclass(frozen=True, kw_only=True)
class HostSpec:
  """The machine that carries a target's accelerators: ``machine`` its type (a Cloud VM type or a
  reference server), ``accelerators`` the chips or GPUs one such host has, ``ram_bytes`` its
  RAM (``None`` where no figure is published; ``why`` then says so), ``source`` where the
  figures are published."""

  machine: str | None
  accelerators: int
  ram_bytes: int | None
  source: str | None
  why: str | None = None

  def __post_init__(self):
    if (self.ram_bytes is None) == (self.why is None):
      raise ValueError(f"{self.machine}: a host spec has either a RAM figure or the reason it has none")


def host_share(host: HostSpec, devices_per_accelerator: int = 1) -> tuple[int | None, str]:
  """(bytes of host RAM per device, the note saying where it comes from or why it is None)."""
  if host.ram_bytes is None:
    return None, f"host_capacity_bytes: unknown: {host.why}"
  devices = host.accelerators * devices_per_accelerator
  per = "" if devices == 1 else f" over the {devices} devices it carries"
  return host.ram_bytes // devices, (
      f"host_capacity_bytes: the {host.machine}'s {_gb(host.ram_bytes)} RAM per host{per} "
      f"({host.source}); what the host's own processes hold is not subtracted"
  )


@dataclasses.dataclass(frozen=True, kw_only=True)
class HostVerdict(Record):
  """Whether a step's host bytes fit the host's share per device: ``host_fits`` (host total <=
  host capacity), ``host_verdict`` ``yes`` or ``NO``; all ``None`` for a row that keeps nothing
  on the host, or where the host's capacity is unknown (the row's notes say why)."""

  host_capacity_bytes: int | None = None
  host_fits: bool | None = None
  host_verdict: str | None = None


def judge_host(host_bytes: int | None, capacity: int | None) -> HostVerdict:
  """The host verdict of ``host_bytes`` per device against ``capacity`` per device. A row with
  no host bytes gets none (nothing is held on the host)."""
  if not host_bytes:
    return HostVerdict()
  if capacity is None:
    return HostVerdict()
  fits = host_bytes <= capacity
  return HostVerdict(host_capacity_bytes=capacity, host_fits=fits, host_verdict="yes" if fits else "NO")


def _gb(n: int) -> str:
  return f"{n / GiB:g} GiB" if n % GiB == 0 else f"{n / GB:g} GB"
