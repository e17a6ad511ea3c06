"""The model families the transformer knows (:mod:`.family`), in the order they are asked: the
first whose ``applies`` says yes is a config's (the base family, RoPE with the base block, takes
the rest). A new family is its module and one entry here."""

from __future__ import annotations

from .config import ModelConfig
from .family import Family
from .gemma4 import Gemma4
from .gpt2 import GPT2
from .mla import MLA

FAMILIES: tuple[Family, ...] = (GPT2(), MLA(), Gemma4(), Family())


def family_of(cfg: ModelConfig) -> Family:
  """The family that builds ``cfg``'s decoder."""
  return next(f for f in FAMILIES if f.applies(cfg))
