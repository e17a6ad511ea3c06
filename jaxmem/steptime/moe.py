"""What a mixture-of-experts step spends its time on, each a named term of the schedule walk
(:class:`MoeTerms`, :func:`moe_terms`), so that a row can say which MoE term decides its step.

The terms are read from the same walk that sets the step (:mod:`jaxmem.steptime.walk`), each op
put under one term by what it does in the compiled program, the experts (``G``) and the routed
rows (``m`` = tokens x top-k) taken from the grouped matmul kernels themselves
(:mod:`jaxmem.steptime.kernels`); a program without such a kernel has no MoE terms.

- ``grouped_matmul``: the experts' kernels, timed as their tiles do the work, and never faster
  than the kernel's measured rate at their shape (:mod:`jaxmem.hardware.gmm_rates`); two parts of
  it are reported apart: ``kernel_rate`` (what the measured rate adds beyond the tiles at the
  peak and the blocks at HBM bandwidth) and ``tile_fill`` (of the rest, the part the padding
  takes: row tiles part filled at group boundaries, blocks of ``k`` and ``n`` past the dimension;
  that time times the padding's share of the tiles' work, ``1 - 2mkn / (the tiles' FLOPs)``).
- ``permutation``: the token permutation, MaxText's and jaxmem's sparse path (MaxText layers/moe.py
  ``permute`` / ``unpermute``: an argsort of the expert ids, a gather of the rows into expert
  order, the inverse gather and the weighted sum over k, the group sizes by counting): every sort,
  gather, scatter (or the fusion or offloaded SparseCore call holding one) over the routed rows.
  XLA:TPU offloads the large gathers and the group-size scatter-adds to the SparseCores
  (``call-start`` ... ``async_execution_thread="sparsecore"``); their throughput is not published,
  so they are timed at HBM bandwidth on the stream (their bytes cross the same HBM), a lower bound.
- ``expert_activation``: the rest of the work on the routed rows between the kernels (the
  activation, the weighting by the router's probabilities, the gradients' sums).
- ``router``: the gate (a matmul to ``G`` logits a token, their softmax or sigmoid, the top-k over
  the experts): ops whose result's last dimension is the experts.
- ``expert_weights``: the collectives that move the experts' weights or their gradients (an
  array of the experts, ``[G, a, b]``): FSDP all-gathers before the kernel, reduce-scatters of the
  gradients after, on the links they cross; ``token_exchange``: the all-to-alls of routed rows
  under expert parallelism. For each, the transfer time on the links and the part of it the
  schedule left exposed (what no work between its start and done hid).

``decides``: the term that adds most to the step (a collective's exposed time, every other
term's time on the stream).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

from jaxmem.hardware.machine import host_link
from jaxmem.hlo.text import Instruction, Module
from jaxmem.records import Record

_ARRAYS = re.compile(r"\b[a-z][a-z0-9]*\[([\d,]*)\]")
_PERMUTE = frozenset({"sort", "gather", "scatter"})
# Ops that only move, mask or recast elements: with the above, what a permutation is made of.
_MOVE = _PERMUTE | frozenset({
    "copy", "reshape", "transpose", "bitcast", "broadcast", "select", "compare", "concatenate", "slice",
    "dynamic-slice", "dynamic-update-slice", "pad", "iota", "constant", "parameter", "get-tuple-element", "tuple",
    "convert", "copy-start", "copy-done", "call-start", "call-update", "call-done",
})
TERMS = ("grouped_matmul", "permutation", "expert_activation", "router", "expert_weights", "token_exchange")


_HOST = host_link(None).name


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoeTerms(Record):
  """A MoE step's time by term, per device per step (see the module docstring): ``experts`` and
  ``rows`` as the kernels read them; each term's time on the stream (``*_time_s``); the
  collectives' transfer time on their links (``*_comm_time_s``) and the part of it left exposed
  (``*_exposed_time_s``, also in the term's time); ``tile_fill_time_s`` and
  ``kernel_rate_time_s`` (both within ``grouped_matmul_time_s``); ``decides``: the largest
  term."""

  experts: int
  rows: int
  grouped_matmul_time_s: float = 0.0
  tile_fill_time_s: float = 0.0
  kernel_rate_time_s: float = 0.0
  permutation_time_s: float = 0.0
  expert_activation_time_s: float = 0.0
  router_time_s: float = 0.0
  expert_weights_time_s: float = 0.0
  expert_weights_comm_time_s: float = 0.0
  expert_weights_exposed_time_s: float = 0.0
  token_exchange_time_s: float = 0.0
  token_exchange_comm_time_s: float = 0.0
  token_exchange_exposed_time_s: float = 0.0
  decides: str = ""

  def summary(self) -> str:
    """One line naming each term, the one that decides first."""
    times = {t: getattr(self, f"{t}_time_s") for t in TERMS}
    parts = [f"{t.replace('_', ' ')} {times[t]:.3g} s" for t in sorted(times, key=lambda t: -times[t]) if times[t]]
    within = [f"{what} {t:.3g} s" for what, t in (("the kernel's measured rate", self.kernel_rate_time_s),
                                                  ("tile fill", self.tile_fill_time_s)) if t]
    fill = f" ({', '.join(within)} of the grouped matmul)" if within else ""
    comm = "".join(f"; {t.replace('_', ' ')} on the links {getattr(self, f'{t}_comm_time_s'):.3g} s, "
                   f"{getattr(self, f'{t}_exposed_time_s'):.3g} s of it exposed"
                   for t in ("expert_weights", "token_exchange") if getattr(self, f"{t}_comm_time_s"))
    return (f"moe ({self.experts} experts, {self.rows} routed rows a device): {self.decides.replace('_', ' ')} decides; "
            + ", ".join(parts) + fill + comm)


def _shapes(text: str) -> list[tuple[int, ...]]:
  return [tuple(int(d) for d in m.split(",") if d) for m in _ARRAYS.findall(text or "")]


def _inside(module: Module, ins: Instruction, depth: int = 0) -> list[Instruction]:
  """``ins`` and what it runs: the instructions of the computations it calls (fusions, calls, an
  asynchronous call's: a ``call-update`` or ``call-done`` looked through to its ``call-start``)."""
  if ins.opcode in ("call-update", "call-done") and ins.operands:
    start = module.get(ins.operands[0].partition("#")[0], ins.computation)
    return [ins] + (_inside(module, start, depth + 1) if start is not None and depth < 4 else [])
  out = [ins]
  for callee in ins.calls if depth < 4 else ():
    comp = module.computations.get(callee)
    for inner in comp.instructions.values() if comp is not None else ():
      out += _inside(module, inner, depth + 1)
  return out


def classify(module: Module, ins: Instruction, *, experts: int, rows: int, collective: bool) -> str | None:
  """The MoE term ``ins`` belongs to (not the kernels, which the caller knows), or ``None``.
  ``collective``: whether the walk timed it on a link."""
  shapes = _shapes(ins.shape)
  if collective:  # its own shapes and those of the collectives a fusion around it holds
    moved = [s for i in _inside(module, ins) for s in _shapes(i.shape)]
    if any(len(s) >= 3 and s[-3] == experts for s in moved):
      return "expert_weights"
    return "token_exchange" if any(rows in s for s in moved) else None
  if ins.opcode == "sort":
    sorted_dim = re.search(r"dimensions=\{(\d+)\}", ins.attrs)
    first = shapes[0] if shapes else ()
    if sorted_dim and int(sorted_dim.group(1)) < len(first) and first[int(sorted_dim.group(1))] == experts:
      return "router"
  operands = [module.get(o.partition("#")[0], ins.computation) for o in ins.operands]
  every = shapes + [s for o in operands if o is not None for s in _shapes(o.shape)]
  if any(rows in s for s in every):
    inside = {i.opcode for i in _inside(module, ins)}
    if inside & {"dot", "convolution"}:
      return None  # a matmul over the routed rows: the shared work XLA fused, not the routing's
    return "permutation" if inside & _PERMUTE or inside <= _MOVE else "expert_activation"
  return "router" if any(_per_token(s, experts, rows) for s in shapes) else None


def _per_token(dims: tuple[int, ...], experts: int, rows: int) -> bool:
  """Whether ``dims`` is one value an expert for each token (the router's logits, probabilities
  or top-k): the experts last, and the tokens before them, ``rows / k`` with ``k <= experts``."""
  tokens = 1
  for d in dims[:-1]:
    tokens *= d
  return len(dims) >= 2 and dims[-1] == experts and rows % tokens == 0 and rows // tokens <= experts


def moe_terms(module: Module, ops: Iterable, kernels: dict, *, peak_flops: float | None = None) -> MoeTerms | None:
  """The MoE terms of a walk's ``ops`` (:class:`jaxmem.steptime.walk.OpRun`) over ``module``;
  ``kernels``: the grouped matmul calls, ``(computation, name) ->``
  :class:`jaxmem.steptime.kernels.GroupedMatmul`; ``peak_flops``: the matrix peak the tiles were
  timed at (``None``: no part of the kernels' time is put down to their measured rate). ``None``
  without a grouped matmul."""
  if not kernels:
    return None
  first = next(iter(kernels.values()))
  experts, rows = first.groups, first.rows
  acc = dict.fromkeys([f"{t}_time_s" for t in TERMS] + ["tile_fill_time_s", "kernel_rate_time_s",
                                                        "expert_weights_comm_time_s",
                                                        "expert_weights_exposed_time_s", "token_exchange_comm_time_s",
                                                        "token_exchange_exposed_time_s"], 0.0)
  for o in ops:
    ins = module.get(o.name, o.computation)
    if ins is None:
      continue
    if (o.computation, o.name) in kernels:
      acc["grouped_matmul_time_s"] += o.time_s
      # Beyond its tiles at the peak and its blocks at HBM bandwidth: the kernel's measured rate.
      measured = kernels[(o.computation, o.name)].measured_s is not None and peak_flops
      rate = max(0.0, o.time_s - max(o.padded_flops / peak_flops, o.memory_time_s)) if measured else 0.0
      acc["kernel_rate_time_s"] += rate
      # Of the rest, the padding's share of the kernel's steps (its matmuls and the blocks they fetch alike).
      share = max(0.0, 1.0 - o.flops / o.padded_flops) if o.padded_flops else 0.0
      acc["tile_fill_time_s"] += (o.time_s - rate) * share
      continue
    # An op on a link is a collective, but for the host link: host offload's copies move no tokens.
    term = classify(module, ins, experts=experts, rows=rows, collective=o.link not in (None, _HOST))
    if term is None:
      continue
    acc[f"{term}_time_s"] += o.time_s
    if term in ("expert_weights", "token_exchange"):
      acc[f"{term}_comm_time_s"] += o.comm_time_s
      acc[f"{term}_exposed_time_s"] += o.exposed_comm_time_s
  decides = max(TERMS, key=lambda t: acc[f"{t}_time_s"])
  return MoeTerms(experts=experts, rows=rows, **acc, decides=decides)
