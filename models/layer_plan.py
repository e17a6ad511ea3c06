"""Which layers are alike: the layer pattern local windows and interleaved experts make, as the
stacks of identical blocks the transformer scans (:mod:`.transformer`).

An unpatterned model (every layer's window the same, the experts on every layer after a dense
prefix) is one stack of its dense layers (``blocks``) and one of its MoE layers
(``moe_blocks``). A patterned one (Gemma 2/3's local and global layers, GPT-OSS's, Llama 4's
interleaved experts) is segments of whole repetitions of its pattern, one stack per position of
each (``blocks_{segment}_{position}``); its family may split its layers into ranges that hand
keys and values on (:meth:`.family.Family.layer_ranges`: Gemma 4's KV sharing).
"""

from __future__ import annotations

import dataclasses
import math

from .config import ModelConfig
from .families import family_of


@dataclasses.dataclass(frozen=True)
class Segment:
  """Layers first .. first + groups * len(kinds) - 1 of a model whose layers differ in a
  repeating pattern: ``groups`` repetitions of ``kinds``, each (MoE, window) for one position of
  the pattern. Each position is one stack of ``groups`` blocks; one scan over the groups runs
  the positions in turn, so every layer's window and MLP are fixed when it is compiled.

  ``kv`` (Gemma 4's KV sharing, transformers' Gemma4TextConfig.kv_sharing_modes): "own", layers
  with their own keys and values; "store", the one period before the shared layers, whose last
  layer of each attention type hands its keys and values on; "reuse", the shared layers."""

  first: int
  groups: int
  kinds: tuple[tuple[bool, int | None], ...]
  kv: str = "own"

  def stores(self, p: int) -> bool:
    """Whether position ``p`` is the last of its attention type in a "store" segment."""
    return self.kv == "store" and all(w != self.kinds[p][1] for _, w in self.kinds[p + 1 :])


def layer_segments(cfg: ModelConfig) -> tuple[Segment, ...]:
  """The segments of a patterned model (``cfg.is_patterned``): the family's layer ranges (the
  dense prefix and the rest), each as whole periods of the pattern plus the remainder (Gemma 3
  27B's 62 layers: 10 groups of five local and one global layer, then two local layers)."""
  every = cfg.global_every if cfg.sliding_window is not None else 0
  period = math.lcm(every or 1, cfg.moe_every if cfg.is_moe else 1)
  kind = lambda i: (cfg.layer_is_moe(i), cfg.layer_window(i))  # noqa: E731
  out = []
  for a, b, kv in family_of(cfg).layer_ranges(cfg, period):
    n = b - a
    if n <= 0:
      continue
    groups, rest = divmod(n, period)
    if groups:
      out.append(Segment(a, groups, tuple(kind(i) for i in range(a, a + period)), kv))
    if rest:
      out.append(Segment(a + groups * period, 1, tuple(kind(i) for i in range(b - rest, b)), kv))
  return tuple(out)


def stack_plan(cfg: ModelConfig) -> tuple[tuple[str, Segment], ...]:
  """Every stack of identical blocks as (the model's attribute for its segment's stacks, the
  segment), in layer order: an unpatterned model's ``blocks`` and ``moe_blocks`` (each a segment
  of one position, where it has such layers), a patterned model's ``blocks_{s}`` (its
  positions' stacks ``blocks_{s}_{p}``)."""
  if cfg.is_patterned:
    return tuple((f"blocks_{s}", seg) for s, seg in enumerate(layer_segments(cfg)))
  window, dense = cfg.layer_window(0), cfg.num_dense_layers  # every layer's window, unpatterned
  parts = (("blocks", Segment(0, dense, ((False, window),))),
           ("moe_blocks", Segment(dense, cfg.num_moe_layers, ((True, window),))))
  return tuple((name, seg) for name, seg in parts if seg.groups)


def stack_names(name: str, seg: Segment, patterned: bool) -> list[str]:
  """The attribute of each of a segment's stacks (one per position of its pattern)."""
  return [f"{name}_{p}" for p in range(len(seg.kinds))] if patterned else [name]
