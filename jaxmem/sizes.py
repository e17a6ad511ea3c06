"""Sizes in bytes as people write them: ``14.5GiB``, ``512MiB``, ``2GB``, plain bytes.

A leaf module (it imports only :mod:`jaxmem.errors`), so a workload field and a target alike
can take a size written by hand.
"""

from __future__ import annotations

import re

from jaxmem.errors import JaxmemError

_BYTE_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
               "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def byte_count(v: int | str | None, what: str) -> int:
  """A size in bytes: an int, or a string of a number and a unit (``14.5GiB``, ``512MiB``,
  ``2GB``; binary KiB/MiB/GiB/TiB, decimal KB/MB/GB/TB, plain bytes); ``None`` is 0."""
  if v is None:
    return 0
  if isinstance(v, bool) or not isinstance(v, (int, str)):
    raise JaxmemError(f"`{what}` takes a size in bytes such as 14.5GiB, 512MiB or 1000000, got {v!r}")
  if isinstance(v, int):
    n = v
  else:
    m = re.fullmatch(r"\s*([\d.]+)\s*([A-Za-z]*)\s*", v)
    unit = m.group(2).lower() if m else ""
    try:
      if m is None or unit not in _BYTE_UNITS:
        raise ValueError
      n = int(float(m.group(1)) * _BYTE_UNITS[unit])
    except ValueError:
      raise JaxmemError(f"`{what}` takes a size in bytes such as 14.5GiB, 512MiB or 1000000, got {v!r}") from None
  if n < 0:
    raise JaxmemError(f"`{what}` must be at least 0 bytes, got {v!r}")
  return n
