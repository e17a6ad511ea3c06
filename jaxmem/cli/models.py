"""``jaxmem models``: the model presets with their parameter counts (total, and active per token
for mixtures of experts), widths, experts and attention kind."""

from __future__ import annotations

import argparse

import jaxmem
from jaxmem.cli import _common as c
from jaxmem.render import columns as cols
from jaxmem.render import tables


def register(subparsers: argparse._SubParsersAction) -> None:
  p = subparsers.add_parser("models", help="list model presets")
  p.add_argument("--format", default="table", type=jaxmem.inputs.Choice(tables.FORMATS), help="table, markdown, json or csv")
  c.add_columns(p, cols.MODELS)
  p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  tables.check_format(args.format)
  columns = c.columns(args, cols.MODELS)
  records = []
  for name, make in jaxmem.PRESETS.items():
    cfg = make()
    records.append(
        dict(
            model=name,
            style=cfg.style,
            params=jaxmem.count_params(cfg),
            active_params=jaxmem.count_active_params(cfg),
            attention=attention_kind(cfg),
            experts=cfg.num_experts or None,
            top_k=cfg.experts_per_token or None,
            shared_experts=cfg.num_shared_experts if cfg.is_moe else None,
            expert_d_ff=cfg.expert_d_ff if cfg.is_moe else None,
            layers=cfg.num_layers,
            d_model=cfg.d_model,
            heads=cfg.num_heads,
            kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            d_ff=cfg.d_ff,
            vocab=cfg.vocab_size,
            tied=cfg.tie_embeddings,
        )
    )
  print(tables.render_listing(records, args.format, cols.MODELS, columns,
                              made_by=tables.made_by("models", jaxmem.inputs.MODELS)))
  return 0


def attention_kind(cfg: jaxmem.ModelConfig) -> str:
  """MLA (latent KV cache), MHA (a key/value head per query head) or GQA (fewer kv heads)."""
  if cfg.is_mla:
    return "MLA"
  return "MHA" if cfg.num_kv_heads == cfg.num_heads else "GQA"
