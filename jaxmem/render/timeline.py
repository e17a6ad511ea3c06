"""The memory timeline of an :class:`~jaxmem.buffers.analyse.Explanation`: a plot file and a text sparkline.

Both show live bytes in device memory against the position in XLA's schedule, stacked by kind,
with the forward / backward / optimizer regions and the peak marked.
"""

from __future__ import annotations

import os

from jaxmem.axes import labels
from jaxmem.errors import JaxmemError
from jaxmem.buffers.analyse import KINDS, Explanation
from jaxmem.render.units import unit_for

_COLORS = {
    "parameter": "#4c72b0",
    "output": "#8172b2",
    "saved residual": "#dd8452",
    "gradient": "#55a868",
    "temporary": "#c0c0c0",
}
_BLOCKS = " ▁▂▃▄▅▆▇█"


# The files the timeline is written as, by extension.
FORMATS = ("png", "svg")


def plot_timeline(result: Explanation, path: str, *, labels: int = 3) -> str:
  """Writes the timeline to ``path`` (``.png`` or ``.svg``) and returns the path."""
  ext = os.path.splitext(path)[1].lower().lstrip(".")
  if ext not in FORMATS:
    raise JaxmemError(f"`plot` writes {' or '.join('.' + f for f in FORMATS)} files (got {path!r})")
  tl = result.timeline
  if tl is None or tl.length == 0:
    raise JaxmemError("this explanation has no timeline to plot")
  # matplotlib is slow to import and needs its file-only backend chosen before it draws.
  import matplotlib

  matplotlib.use("Agg")  # no display: write files only
  from matplotlib.figure import Figure

  total = tl.total()
  u = unit_for(max(total), smallest="B")
  scale, uname = u.size, u.name
  xs = list(range(tl.length))
  fig = Figure(figsize=(11, 4.8), layout="constrained")
  ax = fig.add_subplot()
  ax.stackplot(
      xs,
      *[[b / scale for b in tl.bytes_by_kind[k]] for k in KINDS],
      labels=list(KINDS),
      colors=[_COLORS[k] for k in KINDS],
      linewidth=0,
      step="mid",  # each position one bar wide: a peak that lasts one position still shows
  )
  top = max(total) / scale
  for i, (name, first, last) in enumerate(tl.regions):
    ax.axvspan(first - 0.5, last + 0.5, color="#000000", alpha=0.04 if i % 2 else 0.0, lw=0)
    ax.text((first + last) / 2, top * 1.47, name, ha="center", va="top", fontsize=9, color="#444444")
  p = tl.peak_position
  ax.axvline(p, color="#c44e52", lw=1, ls="--")
  ax.plot([p], [total[p] / scale], marker="v", color="#c44e52", markersize=6)  # the peak itself
  lines = [f"peak {total[p] / scale:,.2f} {uname} at position {p}"]
  for b in result.peak_buffers[:labels]:
    where = b.source or b.op_name or b.hlo
    lines.append(f"{b.size_bytes / scale:,.2f} {uname} {b.kind} {b.dtype}{b.shape} {where}")
  ax.annotate(
      "\n".join(lines), xy=(p, total[p] / scale), xytext=(0.01, 0.90), textcoords="axes fraction",
      va="top", fontsize=8, family="monospace",
      bbox=dict(boxstyle="round", fc="white", ec="#c44e52", alpha=0.9),
      arrowprops=dict(arrowstyle="->", color="#c44e52", lw=0.8),
  )
  ax.set_xlim(0, max(1, tl.length - 1))
  ax.set_ylim(0, top * 1.5)  # room above the curve for the region names and the peak's box
  ax.set_xlabel("position in XLA's schedule")
  ax.set_ylabel(f"live bytes per device ({uname})")
  ax.set_title(title(result), fontsize=10)
  ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), fontsize=8, ncols=len(KINDS), frameon=False)
  try:
    fig.savefig(path, format=ext, dpi=110)
  except OSError as e:
    raise JaxmemError(f"cannot write `plot` {path}: {e.strerror}") from None
  return path


def title(result: Explanation) -> str:
  """What was explained, in one line: the preset's configuration, or the function and target."""
  r = result
  if r.model:
    step = f"attention {r.attention} · " if r.attention else ""
    step += "".join(f"{w} · " for w in labels(r))  # each other axis where it says something
    if (getattr(r, "stages", 1) or 1) > 1:  # pipelined over a stage axis
      step += f"{r.stages} stages x {r.pipeline_microbatches} pipeline microbatches"
      step += f" x {r.pipeline_repeats} repeats · " if (r.pipeline_repeats or 1) > 1 else " · "
    return (f"model {r.model} · target {r.target} · mesh {r.mesh} · remat {r.remat} · {r.optimizer} · {step}"
            f"batch {r.batch} · seq {r.seq}")
  return f"function {r.function} · target {r.target}" + (f" · mesh {r.mesh}" if r.mesh else "")


def timeline_text(result: Explanation, width: int = 72, height: int = 6) -> str:
  """The timeline as a few lines of text: a block-character curve of live bytes, the phase
  regions under it and the peak marked, for terminals."""
  tl = result.timeline
  if tl is None or tl.length == 0:
    return "(no timeline)"
  width = max(8, width)
  total = tl.total()
  n = tl.length
  # Each column shows the highest point of its slice of the schedule, so the peak survives.
  cols = []
  for c in range(width):
    a, b = c * n // width, max(c * n // width + 1, (c + 1) * n // width)
    cols.append(max(total[a:b]))
  peak = max(total) or 1
  u = unit_for(peak, smallest="B")
  scale, uname = u.size, u.name
  levels = height * (len(_BLOCKS) - 1)
  heights = [round(v / peak * levels) for v in cols]
  rows = []
  for r in range(height - 1, -1, -1):
    line = "".join(_BLOCKS[max(0, min(len(_BLOCKS) - 1, h - r * (len(_BLOCKS) - 1)))] for h in heights)
    label = f"{peak / scale:>8.2f} {uname}" if r == height - 1 else (f"{0:>8} {uname}" if r == 0 else "")
    rows.append(f"{label:>12} |{line}|")
  col_of = lambda pos: min(width - 1, pos * width // n)  # noqa: E731
  marks = [" "] * width
  marks[col_of(tl.peak_position)] = "^"
  rows.append(f"{'peak':>12} |{''.join(marks)}|")
  band = [" "] * width
  for name, first, last in tl.regions:
    a, b = col_of(first), col_of(last)
    span = b - a + 1
    text = name if span >= len(name) + 2 else name[0].upper()
    seg = ["-"] * span
    seg[0], seg[-1] = "|", "|"
    start = max(0, (span - len(text)) // 2)
    for i, ch in enumerate(text[: span]):
      seg[min(span - 1, start + i)] = ch
    band[a : b + 1] = seg
  rows.append(f"{'':>12} |{''.join(band)}|")
  return "\n".join(rows)
