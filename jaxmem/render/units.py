"""The display unit for a table of byte counts: the one place that chooses GiB, MiB or KiB.

A table is shown in one unit, the largest in which its biggest figure is at least a tenth of a
unit (so 0.46 GiB of parameters reads as 0.46 GiB, not 471 MiB, while a tiny model's tables
read in MiB or KiB rather than as a column of 0.00). Units are binary (GiB = 2**30 bytes) as XLA
and JAX's allocator count them; ``GB`` (1e9) is there for the closed forms that quote decimal
figures (ZeRO, NVIDIA's "80 GB"). The sizes themselves are the leaf :mod:`jaxmem.units`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from jaxmem.units import GB, GiB, KiB, MiB, seconds  # noqa: F401  (seconds: re-exported for the renderers)

BINARY = (("GiB", GiB), ("MiB", MiB), ("KiB", KiB), ("B", 1))
UNITS: dict[str, float] = {**dict(BINARY), "GB": GB}


@dataclasses.dataclass(frozen=True)
class Unit:
  """A display unit: its name and its size in bytes."""

  name: str
  size: float

  def __call__(self, v: float | None, digits: int = 2) -> str:
    """``v`` bytes in this unit (thousands separated), ``-`` for a figure that is missing."""
    return "-" if v is None else f"{v / self.size:,.{digits}f}"


def unit_for(values: Iterable[float | None] | float | None, *, smallest: str = "MiB") -> Unit:
  """The unit for a table whose figures are ``values`` (missing ones ignored): the largest unit
  the biggest figure reaches a tenth of, going no smaller than ``smallest``."""
  if values is None or isinstance(values, (int, float)):
    values = [values]
  biggest = max((abs(v) for v in values if v is not None), default=0)
  names = [n for n, _ in BINARY]
  for name, size in BINARY[: names.index(smallest) + 1]:
    if biggest >= size / 10 or name == smallest:
      return Unit(name, size)
  raise AssertionError("unreachable: the loop returns at `smallest`")


def unit(name: str) -> Unit:
  """A unit by name (``GiB``, ``MiB``, ``KiB``, ``B`` or ``GB``)."""
  return Unit(name, UNITS[name])


def percent(v: float | None) -> str:
  """A fraction as a percentage cell: ``71.5%``."""
  return "-" if v is None else f"{100 * v:.1f}%"
