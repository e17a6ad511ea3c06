"""Byte units: binary (GiB = 2**30 bytes) as XLA and JAX's allocator count them, and ``GB``
(1e9) for the closed forms and datasheets that quote decimal figures (ZeRO, NVIDIA's "80 GB");
and a time written in a readable unit, for notes as for tables.

A leaf: every layer may use it. Choosing the unit a table is shown in is rendering's
(:mod:`jaxmem.render.units`)."""

from __future__ import annotations

GiB = 1 << 30
MiB = 1 << 20
KiB = 1 << 10
GB = 1e9


def seconds(v: float | None) -> str:
  """A time in the unit that keeps it readable: ``29.8 µs``, ``12.3 ms``, ``4.56 s`` (``-``: unknown)."""
  if v is None:
    return "-"
  for scale, name in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
    if v >= scale:
      return f"{v / scale:.3g} {name}"
  return f"{v * 1e9:.3g} ns"
