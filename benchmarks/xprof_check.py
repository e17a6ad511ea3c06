"""Does XProf's Memory Viewer show the compiler's peak for a train step that never ran?

Run: python benchmarks/xprof_check.py [--target gpu:h100 --target tpu:v5p-8 ...] [--model
gpt2-small] [--layers 2] [--remat none] [--batch 8] [--seq 1024] [--logdir DIR] (about a minute per
target on 2 cores). Needs ``pip install 'jaxmem[xprof]'`` and the compilers of the targets named
(``[tpu,cuda]``).

For each target the preset train step is explained once (``jaxmem.explain``, which compiles it
with XLA's text dump and its HloProto dump together) and written with ``Explanation.to_xprof`` to
``LOGDIR/plugins/profile/<target>/jaxmem.xplane.pb``; the real ``xprof`` server is started on a
free loopback port and asked for the Memory Viewer's data, as its page asks. Printed per target
and memory space: XProf's peak heap next to the compiler's figures (``memory_analysis()``) and
the live set at the peak that ``explain`` computes from the text dump. The last line is a JSON
list, one object per target with every figure in bytes.

What it showed (jax 0.10.2 and 0.12.0.1, xprof 2.24.2; memory space 0 is the device's main
memory): XProf's peak equals ``peak_memory_in_bytes`` to the byte on gpu:h100 and tpu:v5p-8 for
the default 2-layer GPT-2 small step, and for the 12-layer one. Both are the peak of the bytes
live at once in the buffer assignment's heap simulation, arguments and outputs included, while
``temp_size_in_bytes`` is the size of the temporaries' allocations as laid out, fragmentation
included, so argument + temp is the larger (GPU: by 12.5 MB of 6.4 GB). Exceptions: on TPU,
when a step is small enough for libtpu to keep its temporaries in on-chip memory (``--model
tiny``), ``peak_memory_in_bytes`` counts bytes there that the HBM heap does not (see explain's
note); on CPU, where the compiler reports no peak, XProf's peak is within a few KB of argument +
output - alias + temp.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")

# The server that checks use lives with the tests (tests/xprof_server.py), not in the library.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests"))

import jaxmem  # noqa: E402
from jaxmem.buffers.xprof import xprof_available  # noqa: E402
from xprof_server import XprofServer  # noqa: E402
from jaxmem.models import get_config  # noqa: E402

MIB = 1 << 20


def compile_target(target: str, args: argparse.Namespace, logdir: str) -> dict:
  model = get_config(args.model, **({"num_layers": args.layers} if args.layers else {}))
  r = jaxmem.explain(model=model, remat=args.remat, batch=args.batch, seq=args.seq, target=target, top=1)
  run = target.replace(":", "_")
  r.to_xprof(logdir, run=run)
  report = r.report
  return dict(
      target=target, run=run, module=r.optimized_hlo.xprof_module, file=r.optimized_hlo.file,
      argument=report.argument_size_in_bytes, output=report.output_size_in_bytes,
      alias=report.alias_size_in_bytes, temp=report.temp_size_in_bytes, total=report.total_bytes,
      # jaxmem's reading: None on CPU, whose backend echoes the argument size here.
      peak_memory_in_bytes=report.peak_memory_in_bytes,
      explain_live_at_peak=r.live_bytes_at_peak,
  )


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--target", action="append", help="repeatable; default gpu:h100 and tpu:v5p-8")
  ap.add_argument("--model", default="gpt2-small")
  ap.add_argument("--layers", type=int, default=2, help="override the model's layer count (0: keep)")
  ap.add_argument("--remat", default="none")
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--seq", type=int, default=1024)
  ap.add_argument("--logdir", help="keep the logdir here (default: a temporary directory)")
  args = ap.parse_args(argv)
  ok, why = xprof_available()
  if not ok:
    print(f"xprof_check: {why}", file=sys.stderr)
    return 2
  logdir = args.logdir or tempfile.mkdtemp(prefix="jaxmem-xprof-logdir-")
  rows = [compile_target(t, args, logdir) for t in args.target or ["gpu:h100", "tpu:v5p-8"]]
  with XprofServer(logdir) as server:
    for r in rows:
      for space in (0, 1):
        data = server.memory_viewer(r["run"], "jaxmem", r["module"], memory_space=space)
        # The page's figures are MiB as doubles; every byte count below 2**53 round-trips.
        r[f"xprof_peak_space{space}"] = round(data["peakHeapMib"] * MIB) if "peakHeapMib" in data else None
  print(f"logdir: {logdir}  (xprof --logdir {logdir})")
  head = ("target", "xprof peak[0]", "xprof peak[1]", "compiler peak", "arg+out-alias+temp", "explain live@peak", "xprof - compiler")
  print("  ".join(f"{h:>18}" for h in head))
  for r in rows:
    # Where the backend reports no peak (CPU), the compiler's figure is the total.
    r["compiler"] = r["peak_memory_in_bytes"] if r["peak_memory_in_bytes"] is not None else r["total"]
    cells = (r["xprof_peak_space0"], r["xprof_peak_space1"], r["peak_memory_in_bytes"], r["total"], r["explain_live_at_peak"])
    diff = r["xprof_peak_space0"] - r["compiler"]
    print(f"{r['target']:>18}  " + "  ".join(f"{'-' if c is None else f'{c / MIB:.3f} MiB':>18}" for c in cells) + f"  {diff:>+16,} B")
  print(json.dumps(rows))
  return 0


if __name__ == "__main__":
  sys.exit(main())
