"""``jaxmem plan``'s output: the recommendation, the compiled candidates ranked by estimated
step time, what the search cost and what it left out; and its Pareto plot."""

from __future__ import annotations

import json
from typing import Any

from jaxmem.hardware.margin import AT_RISK
from jaxmem.render import columns as cols
from jaxmem.render.figures import save_figure
from jaxmem.inputs import PLAN
from jaxmem.render.tables import check_format, envelope, grid, made_by, render_csv
from jaxmem.render.units import percent, seconds, unit_for


def render_plan(result: Any, fmt: str, launch: Any = None, *, columns: frozenset[str] = cols.DEFAULT_CHOICE) -> str:
  """``result`` (a :class:`jaxmem.planning.search.PlanResult`) in ``fmt``; with ``launch`` (a
  :class:`jaxmem.maxtext.emit.MaxTextLaunch`, or the line that says why there is none), the
  recommendation's launch overrides after the table (``maxtext`` in JSON). ``columns``: the
  table's (:func:`jaxmem.render.columns.choose`)."""
  check_format(fmt)
  rows = list(result.rows)
  if fmt == "json":
    d = result.as_dict()
    if launch is not None:
      d["maxtext"] = launch.as_dict() if hasattr(launch, "as_dict") else {"error": str(launch)}
    return json.dumps(envelope(rows, made_by=made_by("plan", PLAN), **{k: v for k, v in d.items() if k != "rows"}), indent=2)
  if fmt == "csv":
    return render_csv(rows, cols.PLAN)
  headers, body = cols.lay_out(cols.PLAN, cols.Table(rows, cols.unit_of(rows, cols.PLAN_UNIT_FIELDS), chosen=columns))
  table = grid(body, headers, fmt)
  bullet = "- " if fmt == "markdown" else ""
  tail = [f"{bullet}{line}" for line in cost_lines(result) + list(result.notes)]
  head = [recommendation(result)] + ([f"why: {result.why}"] if getattr(result, "why", None) else [])
  return "\n".join([*head, "", table, "", *tail, *launch_lines(launch)])


def launch_lines(launch: Any) -> list[str]:
  """The MaxText overrides as a paragraph: a heading, the ``key=value`` line alone (to paste
  after MaxText's config file) and a line per choice MaxText cannot spell."""
  if launch is None:
    return []
  if not hasattr(launch, "line"):
    return ["", f"maxtext: {launch}"]
  return ["", f"MaxText overrides for {launch.configuration} (after configs/base.yml):", launch.line(),
          *[f"maxtext note: {n}" for n in launch.notes]]


def recommendation(result: Any) -> str:
  best = result.recommended
  if best is None:
    return (f"recommendation: none of the {result.compiles} candidates compiled fits {result.model} at batch "
            f"{result.batch}, seq {result.seq} on {result.target}; raise --budget, or use more devices")
  u = unit_for(best.required_bytes)
  risk = ""
  if best.verdict == AT_RISK:
    risk = f", at risk: {u(best.margin_bytes)} {u.name} left"
  return (f"recommendation: mesh {best.mesh}, remat {best.remat}, {_micro(best)}, attention "
          f"{best.attention}: estimated {seconds(best.step_time_s)} per step ({best.bound}-bound, MFU "
          f"{percent(best.mfu)}), {u(best.required_bytes)} {u.name} of {cols.with_unit(best.capacity_bytes)} per device{risk}")


def cost_lines(result: Any) -> list[str]:
  lines = [f"compiles: {result.compiles} of a budget of {result.budget} ({result.cache_hits} from the cache); "
           f"{result.candidates} candidates, {result.not_compiled} valid ones left uncompiled"]
  lines += [f"pruned: {n} candidates: {why}" for why, n in result.pruned]
  return lines


def plot_plan(result: Any, path: str) -> None:
  """Required memory against estimated step time per compiled candidate, fitting and not, the
  capacity as a line and the recommendation marked (matplotlib's Figure API: no pyplot state)."""
  from matplotlib.figure import Figure

  fig = Figure(figsize=(8, 5))
  ax = fig.add_subplot()
  rows = [r for r in result.rows if r.step_time_s is not None and r.required_bytes is not None]
  gib = 2**30
  for fits, style, label in ((True, "o", "fits"), (False, "x", "does not fit")):
    pts = [r for r in rows if bool(r.fits) == fits]
    ax.scatter([r.step_time_s for r in pts], [r.required_bytes / gib for r in pts], marker=style, label=label)
  best = result.recommended
  if best is not None:
    ax.scatter([best.step_time_s], [best.required_bytes / gib], s=160, facecolors="none", edgecolors="green",
               label=f"recommended: {best.mesh} {best.remat} mb{best.microbatches}")
  for cap in {r.capacity_bytes for r in rows if r.capacity_bytes}:
    ax.axhline(cap / gib, color="red", linewidth=1, label="capacity")
  ax.set_xlabel("estimated step time (s)")
  ax.set_ylabel("required GiB per device")
  ax.set_title(f"{result.model} on {result.target}, batch {result.batch}, seq {result.seq}")
  ax.legend(fontsize=7)
  fig.tight_layout()
  save_figure(fig, path)


def _micro(r: Any) -> str:
  n = r.microbatches
  pipe = r.pipeline_microbatches if (r.stages or 1) > 1 else None
  return f"{n} microbatch" + ("es" if n != 1 else "") + ("" if pipe is None else f", {pipe} pipeline microbatches each")
