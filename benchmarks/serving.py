"""Published serving runs against jaxmem's engine rules (``--engine``): the table in docs/serving.md.

Each case is a serving run someone published (an engine's log line, a recipe's settings, a
benchmark's batch), with its source, its settings as jaxmem arguments, the published figure and
how jaxmem's figure is read from the engine's answer (:func:`jaxmem.engine_capacity`). Nothing is
fitted: a case whose figure jaxmem misses says by how much, and its ``why`` says what jaxmem
knows of the reason (a rule that changed since the run, a setting the source does not give).

  python benchmarks/serving.py --list              # one case a line
  python benchmarks/serving.py --case NAME         # run one case, print its line
  python benchmarks/serving.py --table             # every case, the docs' markdown table

The heavy cases compile real models (Llama 2/3 70B on eight devices) for compile-only TPU and
GPU targets: minutes each and several GiB of host memory (run them under ``nice`` on a shared
machine). ``tiny-v5e-1`` is a smoke case (not a published run), the one the test suite runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HF = ROOT / "tests" / "data" / "hf"
GiB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Case:
  """One published run: ``source``, ``settings`` in words, ``published`` (its figure, in words)
  and ``expected`` (the number jaxmem's is compared with); ``run`` jaxmem's answer, as
  ``engine_capacity``'s keywords; ``read(results) -> (jaxmem's figure in words, the number)``;
  ``why`` what jaxmem knows of a difference (``None``: a case the engines do not model, with the
  reason in ``skip``)."""

  name: str
  source: str
  settings: str
  published: str
  expected: float | None
  run: dict[str, Any] | None
  read: Callable[[list[Any]], tuple[str, float | None]] | None
  why: str = ""
  heavy: bool = True
  skip: str | None = None


def _tokens(results: list[Any]) -> tuple[str, float]:
  (r,) = results
  w = r.term("weights").bytes / GiB
  return f"{r.kv_tokens:,} tokens ({r.num_blocks:,} blocks of {r.block_size}); weights {w:.2f} GiB a device", r.kv_tokens


def _halving(results: list[Any]) -> tuple[str, float]:
  (r,) = results
  return (f"pages {r.page_bytes:,} -> {r.kernel_page_bytes:,} B; blocks {r.engine_blocks:,} -> {r.num_blocks:,} "
          f"({r.num_blocks / r.engine_blocks:.3f}x) on tpu:v6e-8", r.num_blocks / r.engine_blocks)


def _gpu_tokens(results: list[Any]) -> tuple[str, float]:
  words = [f"{r.target}: {r.kv_tokens:,} tokens ({r.kv_bytes / GiB:.2f} GiB)" for r in results]
  return "; ".join(words), max(r.kv_tokens for r in results)


def _per_device(results: list[Any]) -> tuple[str, float | None]:
  (r,) = results
  b = r.settings["per_device_batch_size"]
  if b is None:
    return "no slot fits", None
  return f"at most {b:g} a device ({r.max_seqs:,} slots of {r.context} positions)", b


def _seqs(results: list[Any]) -> tuple[str, float | None]:
  (r,) = results
  util = r.settings["gpu_memory_utilization"]
  loads = {True: f"its programs load at {util}", False: f"its programs do not load at {util} (at most {r.max_utilization})",
           None: "headroom unknown"}[r.loads]
  return f"at most {r.max_seqs} sequences of {r.context} ({r.kv_tokens:,} tokens); {loads}", r.max_seqs


CASES: tuple[Case, ...] = (
    Case(
        name="tiny-v5e-1", source="(smoke case, not a published run)", settings="tiny, tpu:v5e-1, vLLM defaults",
        published="-", expected=None, heavy=False,
        run=dict(engine="vllm", model="tiny", target="tpu:v5e-1", context=256, max_num_batched_tokens=64),
        read=_tokens,
    ),
    Case(
        name="llama3-8b-v6e-4-vllm",
        source="vllm-project/tpu-inference PR #145 (its log)",
        settings="Llama 3 8B, tpu:v6e-4, TP 4, bf16, vLLM defaults (utilization 0.9; block 256 from max_model_len 4096)",
        published="811,008 tokens (3,168 blocks of 256); weights 3.74 GiB a device", expected=811_008,
        run=dict(engine="vllm", model="llama3-8b", target="tpu:v6e-4", mesh="tensor=4", context=4096),
        read=_tokens,
        why="the budget rule changed after the run: at PR #145's commit it was utilization x (limit - used), "
        "4 x 0.9 x (31.25 - 3.74) GiB = 3,169 blocks, the logged 3,168 but for rounding; tpu-inference PR #734 made it "
        "utilization x limit - used, the rule jaxmem follows, which gives 1.5% less. The limit jaxmem reads from the "
        "TPU compiler (31.24 GiB) is the runtime's to +-5 MiB",
    ),
    Case(
        name="llama3.1-70b-w8a8-tp8-fp8kv",
        source="vllm-project/tpu-inference PR #757 (its log)",
        settings="Llama 3.1 70B w8a8, TP 8, fp8 KV cache; block 128 (the logged page sizes' 262,144 = 2 x 128 x 8 x 128 "
        "x 1 B); the PR names no TPU, jaxmem's is tpu:v6e-8",
        published="vLLM's page 262,144 B, the kernel's 524,288 B: 8,676 -> 4,338 blocks (0.5x)", expected=0.5,
        run=dict(engine="vllm", model="llama3-70b", target="tpu:v6e-8", mesh="tensor=8", weights="int8",
                 kv_cache_dtype="fp8", context=2048, block_size=128),
        read=_halving,
        why="the pages and the halving are the kernel's geometry (one kv head a device, two fp8 values in a word of "
        "four); the block counts themselves rest on a TPU and weights the PR does not give (jaxmem's int8 format also "
        "quantizes the embeddings the w8a8 checkpoint keeps in bf16)",
    ),
    Case(
        name="qwen3-1.7b-24gb-gpu",
        source="vllm-project/vllm #33263 (as issue 42 quotes it)",
        settings="Qwen3-1.7B on a 24 GB GPU, max_num_seqs 1, max_model_len 1024; jaxmem on gpu:l4 and gpu:a10g at "
        "vLLM's default utilization 0.9",
        published="18.78 GiB of KV cache, 175,856 tokens", expected=175_856,
        run=dict(engine="vllm", model=str(HF / "qwen3-1.7b.json"), target=["gpu:l4", "gpu:a10g"], batch=1,
                 context=1024),
        read=_gpu_tokens,
        why="the run's GPU and utilization are not given: 18.78 GiB of KV beside 3.2 GiB of bf16 weights needs more "
        "than 0.9 of a 22.5 GiB L4 or A10G leaves (0.95 of a 24 GiB card would leave about that); jaxmem also "
        "leaves out vLLM's non-torch memory, which makes its budget an upper bound",
    ),
    Case(
        name="mlperf-llama2-70b-v6e-8-jetstream",
        source="AI-Hypercomputer/maxtext src/maxtext/inference/mlperf/trillium/benchmarks_llama2-70b-trillium_2x4.sh",
        settings="Llama 2 70B, tpu:v6e-8, int8 weights, int4 KV cache, prefill 1024, target 2048 "
        "(offline_mode.py: 2 x the prefill length); jaxmem's mesh tensor=8",
        published="per_device_batch_size 64 (512 slots)", expected=64,
        run=dict(engine="jetstream", model=str(HF / "llama2-70b.json"), target="tpu:v6e-8", mesh="tensor=8",
                 weights="int8", kv_cache_dtype="int4", context=2048, max_prefill_length=1024),
        read=_per_device,
        why="the published batch is the run's operating point, not its limit: the ratio (the most that fit over the "
        "run's) is the room the run left; int4 KV scales (MaxText's, one a token and head) are not stored here",
    ),
    Case(
        name="mlperf-llama2-70b-h100x8-jetstream",
        source="AI-Hypercomputer/maxtext src/maxtext/inference/mlperf/gpu/benchmarks_llama2-70b-h100_8.sh",
        settings="Llama 2 70B, gpu:h100x8, fp8 weights (aqt_fp8), fp8 KV cache, XLA_PYTHON_CLIENT_MEM_FRACTION 0.94, "
        "prefill 1024, target 2048; ici_tensor_parallelism -1 (tensor=8)",
        published="per_device_batch_size 190 (1,520 slots)", expected=190,
        run=dict(engine="jetstream", model=str(HF / "llama2-70b.json"), target="gpu:h100x8", mesh="tensor=8",
                 mem_fraction=0.94, weights="fp8", kv_cache_dtype="fp8", context=2048, max_prefill_length=1024),
        read=_per_device,
        why="as above, an operating point; the script also disables XLA's rematerialization pass, which jaxmem's "
        "compile keeps",
    ),
    Case(
        name="qwen3-32b-tpu7x-vllm",
        source="AI-Hypercomputer/tpu-recipes inference/ironwood/vLLM/Qwen3-32B/README.md",
        settings="Qwen3-32B on one tpu7x chip (tpu:v7x-2, TP 2), fp8 weights and KV, max-model-len 9216, "
        "max-num-batched-tokens 4096, utilization 0.98, block 256",
        published="max-num-seqs 135 (the recipe runs)", expected=135,
        run=dict(engine="vllm", model=str(HF / "qwen3-32b.json"), target="tpu:v7x-2", mesh="tensor=2", weights="fp8",
                 kv_cache_dtype="fp8", context=9216, gpu_memory_utilization=0.98, block_size=256,
                 max_num_batched_tokens=4096),
        read=_seqs,
        why="the recipe's 135 is a setting that runs, not a measured limit: jaxmem gives the most that fit",
    ),
    Case(
        name="gpt-oss-tpu7x-headroom",
        source="AI-Hypercomputer/tpu-recipes #151",
        settings="GPT-OSS on tpu7x (the Ironwood vLLM recipe), gpu-memory-utilization 0.93 and 0.83",
        published="fails to load a program at 0.93 (\"reserve 6.14G at the bottom of memory\"), starts at 0.83",
        expected=None, run=None, read=None,
        skip="not modelled: GPT-OSS alternates sliding-window and full attention layers, whose pages vLLM groups "
        "and pads apart (tpu-inference PR #1285); jaxmem's vLLM rule refuses local-attention models in one line. "
        "The headroom rule it shows is in every TPU answer (max_utilization)",
    ),
)
BY_NAME = {c.name: c for c in CASES}


@dataclasses.dataclass(frozen=True)
class Outcome:
  case: Case
  figure: str
  value: float | None
  seconds: float

  @property
  def ratio(self) -> float | None:
    if self.value is None or not self.case.expected:
      return None
    return self.value / self.case.expected


def run_case(case: Case) -> Outcome:
  """jaxmem's answer for ``case`` (a case the engines do not model answers its reason)."""
  import jaxmem

  if case.run is None:
    return Outcome(case, case.skip or "-", None, 0.0)
  start = time.monotonic()
  kw = dict(case.run)
  targets = kw.pop("target")
  results = []
  for t in targets if isinstance(targets, list) else [targets]:
    results += jaxmem.engine_capacity(target=t, **kw)
  figure, value = case.read(results)
  return Outcome(case, figure, value, time.monotonic() - start)


def markdown(outcomes: list[Outcome]) -> str:
  """The docs' table: each case its source, settings, published figure, jaxmem's and the ratio."""
  lines = ["| case | source | settings | published | jaxmem | ratio | why they differ |", "|---|---|---|---|---|---|---|"]
  for o in outcomes:
    ratio = "-" if o.ratio is None else f"{o.ratio:.3f}"
    why = o.case.why if o.case.run is not None else ""
    lines.append(f"| {o.case.name} | {o.case.source} | {o.case.settings} | {o.case.published} | {o.figure} | {ratio} | {why} |")
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--list", action="store_true", help="list the cases")
  ap.add_argument("--case", action="append", default=[], help="run this case (repeatable)")
  ap.add_argument("--table", action="store_true", help="run every case and print the markdown table")
  args = ap.parse_args(argv)
  if args.list:
    for c in CASES:
      print(f"{c.name}: {c.source}{' (heavy)' if c.heavy else ''}")
    return 0
  names = args.case or ([c.name for c in CASES if c.heavy] if args.table else ["tiny-v5e-1"])
  unknown = [n for n in names if n not in BY_NAME]
  if unknown:
    print(f"unknown case {unknown[0]!r}; see --list", file=sys.stderr)
    return 2
  outcomes = []
  for n in names:
    o = run_case(BY_NAME[n])
    outcomes.append(o)
    print(f"{n}: {o.figure} (published: {o.case.published}; ratio {o.ratio}; {o.seconds:.0f} s)", file=sys.stderr)
  if args.table:
    print(markdown(outcomes))
  return 0


if __name__ == "__main__":
  sys.exit(main())
