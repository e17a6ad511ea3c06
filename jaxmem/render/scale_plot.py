"""``scale --plot``: each memory component against the varying workload (log-log), with the
device's capacity."""

from __future__ import annotations

from collections.abc import Sequence

from jaxmem.planning.sweep import Row
from jaxmem.render.figures import save_figure
from jaxmem.units import GiB


def plot(rows: Sequence[Row], over: dict[str, list[int]] | Sequence[str], path: str) -> None:
  """Each component against the varying workload (log-log), the capacity as a line; ``over``
  names the variables varied (a grid, or :attr:`Scaling.over`)."""
  # matplotlib is slow to import and needs its file-only backend chosen before pyplot.
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  var = "seq" if "seq" in over else "batch"
  other = "batch" if var == "seq" else "seq"
  fig, ax = plt.subplots(figsize=(8, 5))
  for (mesh, opt, remat, fixed, moe), rs in _series(rows, var, other).items():
    rs = [r for r in rs if r.error is None]
    xs = [getattr(r, var) for r in rs]
    label = f"{remat}" + (f" {opt}" if len({r.optimizer for r in rows}) > 1 else "") + (f" {mesh}" if len({r.mesh for r in rows}) > 1 else "")
    label += f" ({other} {fixed})" if len({getattr(r, other) for r in rows}) > 1 else ""
    label += f" {moe[0]} {moe[1] or ''}".rstrip() if len({(r.moe_impl, r.capacity_factor) for r in rows}) > 1 else ""
    for comp, style in (("temp_size_in_bytes", "-"), ("argument_size_in_bytes", ":"), ("peak_memory_in_bytes", "--")):
      ys = [getattr(r, comp) for r in rs]
      if all(y for y in ys):
        ax.plot(xs, [y / GiB for y in ys], style, marker="o", label=f"{comp.split('_')[0]} · {label}")
  caps = {r.capacity_bytes for r in rows if r.capacity_bytes}
  for cap in caps:
    ax.axhline(cap / GiB, color="red", linewidth=1)
    ax.annotate("capacity", (ax.get_xlim()[0], cap / GiB), color="red", va="bottom")
  ax.set_xscale("log", base=2)
  ax.set_yscale("log", base=2)
  ax.set_xlabel(var)
  ax.set_ylabel("GiB per device")
  r0 = rows[0]
  ax.set_title(f"{r0.model} on {r0.target}: memory against {var}")
  ax.legend(fontsize=7)
  fig.tight_layout()
  try:
    save_figure(fig, path)
  finally:
    plt.close(fig)


def _series(rows, var, other):
  out: dict[tuple, list[Row]] = {}
  for r in sorted(rows, key=lambda r: getattr(r, var)):
    key = (r.mesh, r.optimizer, f"{r.remat} {r.attention}", getattr(r, other), (r.moe_impl, r.capacity_factor))
    out.setdefault(key, []).append(r)
  return out
