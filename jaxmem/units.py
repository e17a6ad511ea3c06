"""Byte units: binary (GiB = 2**30 bytes) as XLA and JAX's allocator count them, and ``GB``
(1e9) for the closed forms and datasheets that quote decimal figures (ZeRO, NVIDIA's "80 GB").

A leaf: every layer may use it. Choosing the unit a table is shown in is rendering's
(:mod:`jaxmem.render.units`)."""

from __future__ import annotations

GiB = 1 << 30
MiB = 1 << 20
KiB = 1 << 10
GB = 1e9
