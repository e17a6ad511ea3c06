"""``jaxmem validate``: real steps on the attached accelerator, the measured peak against the
prediction; and the hidden ``_measure`` that runs one configuration in a fresh process for it."""

from __future__ import annotations

import argparse
import json

import jaxmem
from jaxmem.cli import _common as c
from jaxmem.render import tables

_COLUMNS = ["mesh", "optimizer", "attention", "microbatches", "remat", "predicted_bytes", "measured_bytes", "ratio", "loss", "error"]


def register(subparsers: argparse._SubParsersAction) -> None:
  p = subparsers.add_parser("validate", help="run real steps on the attached accelerator: measured peak vs predicted")
  c.add_workload(p)
  c.add_train_step(p)
  c.add_sweep_axes(p)
  p.add_argument("--steps", type=c.COUNT, default=3, help="train steps to run per configuration; default 3")
  p.set_defaults(func=run)
  m = subparsers.add_parser("_measure")  # one configuration in a fresh process, for validate
  c.add_workload(m, output=False)  # its measurement is one JSON line on stdout
  c.add_train_step(m)
  m.add_argument("--remat", required=True)
  m.add_argument("--optimizer", required=True)
  m.add_argument("--steps", type=c.COUNT, default=3)
  m.set_defaults(func=measure)


def _workload(args: argparse.Namespace):
  # validate runs on the attached devices; a --target it cannot honour is refused by the library.
  return c.workload(args, target=args.target or "attached")


def run(args: argparse.Namespace) -> int:
  tables.check_format(args.format)
  c.check_outputs(args)
  c.starting(args, "validate", f": {args.steps} steps of each configuration", target=args.target or "the attached devices")
  headers = None if args.format in ("json", "csv") else _COLUMNS
  made = tables.made_by("validate", jaxmem.inputs.MEASUREMENTS)
  sweep = c.Sweep(args, None, lambda done: tables.render_records(done, args.format, headers=headers, made_by=made), cached=False,
                  progress=False)
  records = sweep.run(lambda run: jaxmem.validate(_workload(args), steps=args.steps, distributed=args.distributed, run=run))
  c.emit(tables.render_records(records, args.format, headers=headers, made_by=made), args.output)
  return 0


def measure(args: argparse.Namespace) -> int:
  m = jaxmem.measure_one(_workload(args), steps=args.steps, distributed=args.distributed)
  print(json.dumps(m.as_dict()))
  return 0
