"""The time per op (:class:`jaxmem.OpTimes`) as text: the slowest ops, each op's terms and
bound, and the step's sum over ops beside its max of sums (``explain --top-ops``)."""

from __future__ import annotations

import json
from typing import Any

from jaxmem.hardware.machine import LINKS
from jaxmem.steptime import TERMS, OpTimes
from jaxmem.render.tables import check_format, render_csv, render_records
from jaxmem.render.units import seconds, unit_for

# The columns of the ops table, in order ("(est)": estimates at the target's peak rates).
OP_HEADERS = ("op", "jax op", "kind", "runs", "GFLOP", "accessed", "sent", "compute", "memory", "comm", "time (est)", "bound")


def short_op_name(op_name: str, parts: int = 2) -> str:
  """The last ``parts`` components of jax's op name (``.../btd,df->btf/dot_general`` ->
  ``btd,df->btf/dot_general``): the equation the op came from, without the call path."""
  return "/".join(op_name.split("/")[-parts:]) if op_name else "-"


def op_times_json(times: OpTimes) -> dict[str, Any]:
  """The ops and the totals as explain's JSON holds them (key ``op_times``)."""
  return times.as_dict()


def summary_lines(times: OpTimes) -> list[str]:
  """What the step's two rooflines are, and where the sum over ops goes."""
  if times.op_time_s is None:
    return [f"op times: {n}" for n in times.notes if n.startswith("op times")]
  split = ", ".join(f"{t}-bound ops {seconds(times.time_by_bound.get(t))}" for t in TERMS if times.time_by_bound.get(t))
  simulated = [] if times.step_time_s is None else [
      f"step (est): the compiled schedule simulated {seconds(times.step_time_s)}, "
      f"{seconds(times.exposed_comm_time_s)} of it communication nothing overlapped"]
  return simulated + [
      f"sum over ops {seconds(times.op_time_s)} ({split}); max of the step's sums (the ops' roofline) "
      f"{seconds(times.ops_roofline_step_time_s)} (compute {seconds(times.compute_time_s)}, memory "
      f"{seconds(times.memory_time_s)}, comm {seconds(times.comm_time_s)}{_by_link(times)})",
      "each op is timed at the target's peak rates, its compute term from its matrix FLOPs (dot, convolution; "
      "rounded up to the matrix unit's tile where it has one; elementwise work and custom-call kernels count none), "
      "a collective by its transfer on its link; time is what the op adds to the simulated step (for an asynchronous "
      "collective, the wait its done causes); the sum over ops runs them one after another without overlap",
  ]


def _by_link(times: OpTimes) -> str:
  """Where the target has a slow link too, the comm sum on each link, named by it."""
  links = [(link.name, getattr(times, link.field)) for link in LINKS if getattr(times, link.field) is not None]
  return "" if len(links) < 2 else ": " + ", ".join(f"{name} {seconds(t)}" for name, t in links)


def render_op_times(times: OpTimes, fmt: str) -> str:
  """The ops table (slowest first) with the totals beneath, in any format."""
  check_format(fmt)
  if fmt == "json":
    return json.dumps(op_times_json(times), indent=2)
  if fmt == "csv":
    return render_csv([o.as_dict() for o in times.ops])
  size = unit_for([o.cost.bytes_accessed for o in times.ops] + [o.cost.comm_bytes for o in times.ops], smallest="KiB")
  rows = [
      dict(zip(OP_HEADERS, (
          o.cost.name, short_op_name(o.cost.op_name), o.cost.kind or o.cost.opcode, o.cost.count,
          f"{o.cost.flops / 1e9:,.3f}", f"{size(o.cost.bytes_accessed)} {size.name}", f"{size(o.cost.comm_bytes)} {size.name}",
          seconds(o.compute_time_s), seconds(o.memory_time_s), seconds(o.comm_time_s), seconds(o.time_s), o.bound,
      )))
      for o in times.ops
  ]
  lines = summary_lines(times) + [f"note: {n}" for n in times.notes if not n.startswith("op times")]
  return "\n".join([render_records(rows, fmt, OP_HEADERS), "", *lines])
