"""MaxText's own train step compiled by its ``train_compile``, read the way jaxmem reads its own.

Runs in a venv with MaxText (``pip install "maxtext[tpu]"``, Python >= 3.12) and jaxmem
(``pip install --no-deps -e .``), so both compile on the same libtpu. ``train_compile`` prints
``CompiledMemoryStats`` and no peak; this wraps its ``jit_and_compile`` to compile the same
lowered step with XLA's dump on, reads ``memory_analysis()`` and, from the dump,
jaxmem's buffers live at the peak (:func:`jaxmem.buffers.analyse.analyse`), then lets
``train_compile.main`` finish unchanged.

  python benchmarks/maxtext_compile.py [--top N] [--json out.json] -- model_name=llama3-8b \\
      compile_topology=v5p-8 compile_topology_num_slices=1 per_device_batch_size=1 \\
      max_target_length=8192 remat_policy=minimal attention=dot_product

The arguments after ``--`` are MaxText's overrides of its ``configs/base.yml``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile


def _args() -> tuple[argparse.Namespace, list[str]]:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--top", type=int, default=15, help="buffers live at the peak to list")
  p.add_argument("--json", help="write the figures and the top buffers here")
  p.add_argument("--dump-to", help="keep XLA's dump (HLO text, buffer assignment) in this folder")
  p.add_argument(
      "--no-segment-ids", action="store_true",
      help="build attention's mask without the batch's segment ids (the causal triangle only, as jaxmem's dot "
      "does): AttentionOp.generate_attention_mask called with decoder_segment_ids None",
  )
  p.add_argument("overrides", nargs="*", help="MaxText overrides, key=value")
  return p.parse_args()


def main() -> int:
  args = _args()
  import maxtext
  from maxtext.trainers.pre_train import train_compile

  from jaxmem.buffers.analyse import analyse
  from jaxmem.compiler.report import read_compiled
  from jaxmem.hlo.dump import read_dump

  base = os.path.join(os.path.dirname(maxtext.__file__), "configs", "base.yml")
  seen: dict = {}
  original = train_compile.jit_and_compile

  def jit_and_compile(func, func_input_args, func_input_kwargs, mesh, in_shardings, out_shardings,
                      static_argnums, donate_argnums, config, logical_axis_rules):
    # train_compile.jit_and_compile's own steps (MaxText 0.2.5), with jaxmem's dump on.
    import contextlib

    import jax

    from maxtext.utils import max_utils

    mesh_ctx = mesh if config.enable_diloco else contextlib.nullcontext()
    with jax.set_mesh(mesh), mesh_ctx, logical_axis_rules:
      jitted = jax.jit(func, in_shardings=in_shardings, out_shardings=out_shardings,
                       static_argnums=static_argnums, donate_argnums=donate_argnums)
      lowered = jitted.lower(*func_input_args, **func_input_kwargs)
    if max_utils.parse_libtpu_flags_to_dict(config.compile_xla_flags):
      return original(func, func_input_args, func_input_kwargs, mesh, in_shardings, out_shardings,
                      static_argnums, donate_argnums, config, logical_axis_rules)
    # XLA's text dump (what read_dump parses), into --dump-to or a folder removed after reading.
    folder = args.dump_to or tempfile.mkdtemp(prefix="maxtext-compile-")
    compiled = lowered.compile({"xla_dump_to": folder, "xla_dump_hlo_as_text": True})
    dump = read_dump(folder)
    if not args.dump_to:
      shutil.rmtree(folder, ignore_errors=True)
    seen["report"] = read_compiled(compiled)
    seen["explanation"] = analyse(dump, seen["report"], top=args.top, function="train_step")
    return compiled

  train_compile.jit_and_compile = jit_and_compile
  if args.no_segment_ids:
    _without_segment_ids()
  train_compile.main(["train_compile", base, *args.overrides])
  if "report" not in seen:
    print("maxtext_compile: compile_xla_flags set; no dump taken", file=sys.stderr)
    return 1
  _print(seen["report"], seen["explanation"], args)
  return 0


def _without_segment_ids() -> None:
  """MaxText's attention mask from the causal triangle alone: its packing mask (segment ids
  compared, MaxText 0.2.5 ``layers/attention_op.py`` ``generate_attention_mask``) left out, to
  tell what it costs at the peak."""
  from maxtext.layers.attention_op import AttentionOp

  original = AttentionOp.generate_attention_mask
  calls = [0]

  def generate_attention_mask(self, query, key, decoder_segment_ids=None, *rest, **kwargs):
    kwargs.pop("decoder_segment_ids_kv", None)
    calls[0] += 1  # traced once per attention layer call: it took effect
    print(f"maxtext_compile: attention mask {calls[0]} without segment ids "
          f"(were {None if decoder_segment_ids is None else decoder_segment_ids.shape})", file=sys.stderr)
    return original(self, query, key, None, *rest, **kwargs)

  AttentionOp.generate_attention_mask = generate_attention_mask


def _print(report, ex, args) -> None:
  import maxtext
  import jax
  import importlib.metadata as md

  gib = 1024**3
  figures = dict(
      maxtext=getattr(maxtext, "__version__", md.version("maxtext")), jax=jax.__version__,
      libtpu=md.version("libtpu"), overrides=args.overrides,
      argument=report.argument_size_in_bytes, output=report.output_size_in_bytes,
      alias=report.alias_size_in_bytes, temp=report.temp_size_in_bytes, peak=report.peak_memory_in_bytes,
      live_at_peak=ex.live_bytes_at_peak,
      top=[dict(bytes=b.size_bytes, shape=b.shape, dtype=b.dtype, kind=b.kind, module=b.module,
                op=b.op_name, source=b.source, phase=b.phase, hlo=b.hlo) for b in ex.peak_buffers],
  )
  print(f"MAXTEXT {figures['maxtext']} jax {figures['jax']} libtpu {figures['libtpu']}")
  for k in ("argument", "output", "alias", "temp", "peak"):
    v = figures[k]
    print(f"  {k:9s} {'-' if v is None else f'{v / gib:8.3f} GiB  {v:,}'}")
  for b in figures["top"]:
    print(f"  {b['bytes'] / gib:7.3f} GiB {b['dtype']}{b['shape']:<28s} {b['kind']:<16s} {b['phase']:<9s} {b['op'][:110]}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(figures, f, indent=2)


if __name__ == "__main__":
  sys.exit(main())
