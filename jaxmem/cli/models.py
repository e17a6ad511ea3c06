"""``jaxmem models``: the model presets with their parameter counts and widths."""

from __future__ import annotations

import argparse

from jaxmem.models import PRESETS, count_params
from jaxmem.render import tables


def register(subparsers: argparse._SubParsersAction) -> None:
  p = subparsers.add_parser("models", help="list model presets")
  p.add_argument("--format", default="table", help="table, markdown, json or csv")
  p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  tables.check_format(args.format)
  records = []
  for name, make in PRESETS.items():
    cfg = make()
    records.append(
        dict(
            model=name,
            style=cfg.style,
            params=count_params(cfg),
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
  print(tables.render_records(records, args.format))
  return 0
