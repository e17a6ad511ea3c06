"""``infer --plot``: memory against context, per weight format, with the device's capacity."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jaxmem.inference.run import InferRow
from jaxmem.render.figures import save_figure
from jaxmem.render.units import GiB


def plot(rows: Sequence[InferRow], path: str, *, kv_rows: Sequence[dict[str, Any]] = ()) -> str:
  """Writes a figure: per-device required bytes against context, one line per weight format
  (decode rows), with the device's capacity; and the formula's KV cache against context per
  batch when ``kv_rows`` are given. Returns ``path``."""
  # matplotlib is slow to import and needs its file-only backend chosen before pyplot.
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  gib = GiB
  panels = 2 if kv_rows else 1
  fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4), squeeze=False)
  ax = axes[0][0]
  decode = [r for r in rows if r.phase == "decode" and r.required_bytes is not None]
  for fmt in dict.fromkeys(r.weights for r in decode):
    pts = sorted((r.context, r.required_bytes / gib) for r in decode if r.weights == fmt)
    ax.plot([c for c, _ in pts], [v for _, v in pts], marker="o", label=f"decode, {fmt} weights")
  caps = {r.capacity_bytes for r in rows if r.capacity_bytes}
  for cap in caps:
    ax.axhline(cap / gib, color="red", linestyle="--", label="capacity")
  if decode:
    r0 = decode[0]
    ax.set_title(f"{r0.model} on {r0.target} ({r0.mesh}), batch {r0.batch}")
  ax.set_xlabel("context (KV cache positions)")
  ax.set_ylabel("GiB per device (compiler)")
  ax.legend(fontsize=8)
  if kv_rows:
    ax2 = axes[0][1]
    for b in dict.fromkeys(r["batch"] for r in kv_rows):
      pts = sorted((r["context"], r["kv_cache_bytes"] / gib) for r in kv_rows if r["batch"] == b)
      ax2.plot([c for c, _ in pts], [v for _, v in pts], marker=".", label=f"batch {b}")
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log", base=2)
    ax2.set_xlabel("context")
    ax2.set_ylabel("KV cache, whole model, GiB")
    ax2.set_title(f"{kv_rows[0]['model']}: 2·L·K·H·S·B·2 bytes")
    ax2.legend(fontsize=8)
  fig.tight_layout()
  try:
    save_figure(fig, path)
  finally:
    plt.close(fig)
  return path


