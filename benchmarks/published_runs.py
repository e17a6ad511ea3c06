"""Published training runs as a suite: does jaxmem agree with what happened on the hardware?

Each case is a run whose outcome someone published (it ran, it ran out of memory, the AOT compile
was refused), with its source, its configuration written as jaxmem arguments, the versions it
ran on where the source gives them, and the compiler releases it is judged on (``judged_on``):
the published ones where they install beside jaxmem's jax, else the releases a team would run
now; each is compiled in a worker process that loads it (``--compiler``), one row per release.
Running a case compiles that one configuration for its compile-only target (no accelerator
needed) and prints whether jaxmem's verdict agrees: a run that ran (or compiled) must fit under
every release it is judged on, a run that failed must be refused under at least one (an outcome
belongs to its versions, and the versions move the boundary by more than any margin). Where it
does not agree, the line says what jaxmem knows of why (the versions differ, a runtime term, a flag).
Cases whose model jaxmem cannot build yet say so ("skipped: needs ...") rather than fail.
MaxText's cases compile MaxText's own train step (``--maxtext``, the ``maxtext`` extra) with the
overrides of the script each cites; where MaxText is not installed they are skipped in one line.

  python benchmarks/published_runs.py --list           # one case a line
  python benchmarks/published_runs.py --case NAME      # run one case
  python benchmarks/published_runs.py                  # every light case (--all: the heavy ones too)

The heavy cases compile real models on large slices: minutes each and several GiB of host
memory (run them one at a time, under ``nice`` on a shared machine). ``tiny-v5e-1`` is the
suite's smoke case (not a published run), the one the test suite runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HF = Path("tests") / "data" / "hf"  # config.json files, relative to the repository (the cases run from its root)
GiB = 1 << 30

RAN, COMPILED, OOM, REFUSED = "ran", "compiled", "out of memory", "compile refused"
FITS = {RAN: True, COMPILED: True, OOM: False, REFUSED: False}
MAXTEXT_INSTALL = "MaxText, which is not installed here: pip install 'jaxmem[maxtext]' (Python 3.12 or later)"

# The options of MaxText's scripts (src/maxtext/configs/tpu/...) that set no part of the compiled
# program, left out of the cases' overrides: how long it runs, where it writes, its profiler and
# metrics, its data (train_compile feeds shapes only), checkpointing and the learning rate (a value).
# The scripts' LIBTPU_INIT_ARGS are not passed either: each case's why_it_may_differ says so.
V4_FLAGS = "the script's LIBTPU_INIT_ARGS (--xla_enable_async_all_gather=true TPU_MEGACORE=MEGACORE_DENSE) are not passed"
V5_FLAGS = "the script's LIBTPU_INIT_ARGS (async collective fusion and all-gather flags) are not passed"


def maxtext(target: str, *overrides: str, slices: int = 1) -> str:
  """jaxmem arguments compiling MaxText's own train step from base.yml with ``overrides`` for
  ``target`` (``--slices``: MaxText's compile_topology_num_slices)."""
  where = f"--target {target}" + (f" --slices {slices}" if slices > 1 else "")
  return f"{where} --maxtext base.yml " + " ".join(overrides)


def maxtext_overrides(case: Case) -> dict[str, str]:
  """The MaxText overrides a ``--maxtext`` case gives (key to value)."""
  words = shlex.split(case.args or "")
  return dict(w.split("=", 1) for w in words[words.index("--maxtext") + 2:])


# The libtpu releases installable beside jax 0.12.0.1 that the MaxText cases are judged on: 0.0.50.1
# (what jax 0.12.0.1 pins) and 0.0.52 (MaxText 0.2.5's; shared/notes/maxtext-parity.md). Older
# stacks (2024, jax 0.7) are whole jax stacks, which a worker does not run (jaxmem.compilers).
LIBTPU_NOW = ("libtpu==0.0.50.1", "libtpu==0.0.52")
INSTALLED = "the installed compiler: the published stack is a whole jax stack, which --compiler does not sweep"

# configs/tpu/v4/22b.sh and 52b.sh (MaxText 0.2.5) carry the fix, attention=flash num_vocab_tiling=8;
# the default cases are the scripts without it.
V4_22B = ("ici_fsdp_parallelism=64", "per_device_batch_size=13", "remat_policy=full", "base_emb_dim=6144",
          "base_num_kv_heads=24", "base_num_query_heads=24", "base_mlp_dim=24576", "base_num_decoder_layers=48")
V4_52B = ("ici_fsdp_parallelism=192", "ici_tensor_parallelism=1", "per_device_batch_size=7", "remat_policy=full",
          "base_num_decoder_layers=32", "base_emb_dim=12288", "base_mlp_dim=49152", "base_num_query_heads=32",
          "base_num_kv_heads=32")
V4_FIX = ("attention=flash", "num_vocab_tiling=8")
# configs/tpu/v5e/{16,32,64,128}b.sh: per-device batch, remat policy and the extra overrides of each.
V5E = {
    "16b": ("6", "full", ()),
    "32b": ("4", "full", ()),
    "64b": ("2", "full", ()),
    "128b": ("1", "qkv_proj_offloaded", ("ici_fsdp_parallelism=16", "ici_tensor_parallelism=16", "fused_qkv=True",
                                         "fused_mlp=True")),
}
# configs/tpu/v5p/{32,64}b.sh: per-device batch and the published MFU.
V5P = {"32b": ("6", "71.47% MFU"), "64b": ("3", "70.31% MFU")}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Case:
  """One published run: ``args`` its configuration as jaxmem arguments (``None`` where jaxmem
  cannot express it yet, with ``needs`` saying what it lacks), ``outcome`` as published with
  ``measured`` (what the source reports in figures), ``versions`` the stack it ran on,
  ``judged_on`` the compiler releases it is compiled and judged under (``--compiler``: the
  published ones where they install; empty: the installed compiler, ``judged_note`` saying why)."""

  name: str
  platform: str  # tpu or gpu
  source: str
  configuration: str  # as published
  outcome: str  # RAN, COMPILED, OOM or REFUSED
  measured: str = ""
  versions: str = "not published"
  judged_on: tuple[str, ...] = ()
  judged_note: str = INSTALLED
  args: str | None = None
  needs: str | None = None  # why it is skipped, where it is
  needs_file: Path | None = None  # a config.json the case needs, skipped while absent
  needs_maxtext: bool = False  # compiles MaxText's own step (--maxtext), skipped where MaxText is not installed
  heavy: bool = True
  why_it_may_differ: str = ""  # what jaxmem knows of a cause, shown where it disagrees

  def skipped(self) -> str | None:
    if self.needs:
      return self.needs
    if self.needs_file is not None and not (ROOT / self.needs_file).exists():
      return f"{self.needs_file} (DeepSeek-V2-Lite's config.json, with the architecture jaxmem is being taught)"
    if self.needs_maxtext and importlib.util.find_spec("maxtext") is None:
      return MAXTEXT_INSTALL
    return None


CASES = (
    Case(
        name="tiny-v5e-1", platform="tpu", heavy=False,
        source="jaxmem's smoke case (not a published run): the suite's machinery on the tiny preset",
        configuration="tiny, batch 8, seq 512, remat none, one v5e chip", outcome=COMPILED,
        judged_note="the installed compiler (a smoke case, not a published run)",
        args="--model tiny --target tpu:v5e-1 --batch 8 --seq 512 --remat none",
    ),
    Case(
        name="deepseek2-16b-v5p-8", platform="tpu",
        source="MaxText docs, guides/monitoring_and_debugging/understand_logs_and_metrics.md",
        configuration="MaxText deepseek2-16b, v5p-8 (FSDP 4), per-device batch 24, seq 2048, remat full, AdamW, "
        "f32 weights, bf16 compute, megablox",
        outcome=RAN, versions="jax 0.7.2 (dev)",
        measured="5.667 s/step; 44.63 GiB in use after initialisation; MaxText's printed total (argument 44.5 + "
        "output 44.5 - alias + temp 55.9) 100.4 GiB of 95.74",
        args=f"--model {HF / 'deepseek-v2-lite.json'} --target tpu:v5p-8 --mesh fsdp=4 --batch 96 --seq 2048 --remat full",
        needs_file=HF / "deepseek-v2-lite.json",
        why_it_may_differ="MaxText's naive total (argument + output - alias + temp) is over the capacity while the "
        "compiler's peak is under it: compare naive_sum_bytes with required_bytes",
    ),
    Case(
        name="maxtext-22b-v4-default", platform="tpu", source="MaxText PR #4081 (June 2026); configs/tpu/v4/22b.sh",
        configuration="2 x v4-128, ici_fsdp 64, per-device batch 13, remat full, emb 6144, 24 heads x 128, mlp 24576, "
        "48 layers, default attention, no vocab tiling",
        outcome=OOM, versions="the June 2026 MaxText stack (its AOT compile OOM); MaxText 0.2.5 with jax 0.12.0.1 "
        "and libtpu 0.0.52 compiles it (peak 28.88 GiB of 30.75)",
        measured="AOT compile out of memory; MaxText 0.2.5's train_compile: 40.13 of 30.75 GiB on libtpu 0.0.50.1 "
        "(refused), 28.88 GiB on libtpu 0.0.52", needs_maxtext=True, judged_on=LIBTPU_NOW,
        args=maxtext("tpu:v4-128", *V4_22B, slices=2),
        why_it_may_differ=f"the outcome belongs to its versions: MaxText 0.2.5 with libtpu 0.0.52 compiles it too; {V4_FLAGS}",
    ),
    Case(
        name="maxtext-22b-v4-flash", platform="tpu", source="MaxText PR #4081 (June 2026); configs/tpu/v4/22b.sh",
        configuration="as maxtext-22b-v4-default with attention=flash num_vocab_tiling=8", outcome=COMPILED,
        versions="the June 2026 MaxText stack", needs_maxtext=True, judged_on=LIBTPU_NOW,
        args=maxtext("tpu:v4-128", *V4_22B, *V4_FIX, slices=2), why_it_may_differ=V4_FLAGS,
    ),
    Case(
        name="maxtext-52b-v4-default", platform="tpu", source="MaxText PR #4117; configs/tpu/v4/52b.sh",
        configuration="2 x v4-384, ici_fsdp 192, per-device batch 7, remat full, emb 12288, 32 heads, mlp 49152, "
        "32 layers, default attention",
        outcome=OOM, measured='AOT compile: "Used 33.27G of 30.75G"', versions="the June 2026 MaxText stack",
        needs_maxtext=True, judged_on=LIBTPU_NOW, args=maxtext("tpu:v4-384", *V4_52B, slices=2),
        why_it_may_differ=f"the outcome belongs to its versions (the 22B default compiles on MaxText 0.2.5); {V4_FLAGS}",
    ),
    Case(
        name="maxtext-52b-v4-flash", platform="tpu", source="MaxText PR #4117; configs/tpu/v4/52b.sh",
        configuration="as maxtext-52b-v4-default with attention=flash num_vocab_tiling=8", outcome=COMPILED,
        versions="the June 2026 MaxText stack", needs_maxtext=True, judged_on=LIBTPU_NOW,
        args=maxtext("tpu:v4-384", *V4_52B, *V4_FIX, slices=2), why_it_may_differ=V4_FLAGS,
    ),
    Case(
        name="llama3.1-70b-v6e-256-offload", platform="tpu",
        source="tpu-recipes, training/trillium/Llama3.1-70B-MaxText/README.md",
        configuration="MaxText llama3.1-70b, v6e-256 (FSDP 256), per-device batch 5, seq 8192, remat custom: decoder "
        "layer input and q/k/v offloaded to host, the rest recomputed, splash attention",
        outcome=RAN, measured="34.56 s/step, 456 TFLOP/s/device",
        judged_note="the installed compiler: the recipe's versions are not published",
        args="--model llama3-70b --target tpu:v6e-256 --mesh fsdp=256 --batch 1280 --seq 8192 "
        "--remat custom:decoder_layer_input=offload:query_proj=offload:key_proj=offload:value_proj=offload",
        why_it_may_differ="the recipe's LIBTPU_INIT_ARGS (collective and offload flags) are not passed here",
    ),
    *(Case(
        name=f"maxtext-v5e-{size}", platform="tpu", source=f"MaxText README (performance); configs/tpu/v5e/{size}.sh",
        configuration=f"MaxText's {size.upper()} default-decoder model (global_parameter_scale {size[:-1]}) on one "
        f"v5e-256, seq 2048, per-device batch {batch}, remat {remat}, flash attention"
        + (", fsdp 16 x tensor 16, fused qkv and mlp" if extra else ""),
        outcome=RAN, measured="published MFU (2024 stack)", versions="the 2024 MaxText stack", needs_maxtext=True,
        args=maxtext("tpu:v5e-256", f"per_device_batch_size={batch}", f"remat_policy={remat}",
                     f"global_parameter_scale={size[:-1]}", "max_target_length=2048", "use_iota_embed=true",
                     "attention=flash", *extra),
        why_it_may_differ=f"the run's versions (2024) are not these; {V5_FLAGS}",
    ) for size, (batch, remat, extra) in V5E.items()),
    *(Case(
        name=f"maxtext-v5p-{size}", platform="tpu", source=f"MaxText performance results; configs/tpu/v5p/{size}.sh",
        configuration=f"MaxText's {size.upper()} model (global_parameter_scale {size[:-1]}) on v5p-128, fsdp 16 x "
        f"tensor 4, seq 2048, per-device batch {batch}, remat minimal, flash attention",
        outcome=RAN, measured=mfu, needs_maxtext=True,
        args=maxtext("tpu:v5p-128", f"per_device_batch_size={batch}", "remat_policy=minimal",
                     f"global_parameter_scale={size[:-1]}", "ici_fsdp_parallelism=-1", "ici_tensor_parallelism=4",
                     "max_target_length=2048", "use_iota_embed=true", "attention=flash"),
        why_it_may_differ=f"the run's versions are not published; {V5_FLAGS}",
    ) for size, (batch, mfu) in V5P.items()),
    *(Case(
        name=f"maxtext-llama2-70b-v5p-128-batch{batch}", platform="tpu",
        source="MaxText PR #2957 and commit 8c9fede (January 2026), benchmarks/maxtext_v5p_model_configs.py",
        configuration=f"MaxText llama2-70b on v5p-128, FSDP 64 (ici_fsdp -1), seq 4096, remat save_dot_except_mlpwi, "
        f"synthetic data, base.yml defaults, per-device batch {batch}",
        outcome=outcome, measured=measured, versions="the January 2026 MaxText stack (its versions not published "
        "in the PR)", judged_on=LIBTPU_NOW, needs_maxtext=True,
        args=maxtext("tpu:v5p-128", "model_name=llama2-70b", "ici_fsdp_parallelism=-1", "max_target_length=4096",
                     "remat_policy=save_dot_except_mlpwi", f"per_device_batch_size={batch}"),
        why_it_may_differ=why,
    ) for batch, outcome, measured, why in (
        (2, RAN, "ran on the slice", f"{V5_FLAGS}"),
        (4, OOM, "out of memory on the slice; MaxText 0.2.5's train_compile on libtpu 0.0.52: 89.07 GiB of 95.74, "
         "no OOM", "a compile-time verdict is the compiler's for one program on an empty device: the runtime's "
         f"own terms (the heap it holds beside the program, the program's contiguous block) are not in it; {V5_FLAGS}"),
    )),
    Case(
        name="llama2-7b-h100x8", platform="gpu",
        source="NVIDIA JAX-Toolbox, docs/frameworks/maxtext/README.md (Configs: LLaMA)",
        configuration="MaxText llama2-7b on one DGX H100 (8 x H100 80G SXM), BF16, seq 4096, 2 per GPU (global 16), "
        "FSDP 8, flash attention (Transformer Engine's cuDNN), remat minimal_flash, no scan",
        outcome=RAN, measured="0.721 s/step, 22.19 sequences/s",
        versions="nvcr.io/nvidia/jax:25.10-maxtext-py3 (the README's container)",
        args=f"--model {HF / 'llama2-7b.json'} --target gpu:h100x8 --mesh fsdp=8 --batch 16 --seq 4096 "
        "--attention cudnn --remat minimal_with_context",
        why_it_may_differ="jaxmem judges against the allocator's default share (XLA_PYTHON_CLIENT_MEM_FRACTION 0.75); "
        "NVIDIA's recipes raise it to 0.9 and more; jaxmem scans the layers where the run did not",
    ),
    Case(
        name="llama2-70b-h100x64", platform="gpu",
        source="NVIDIA dgxc-benchmarking, maxtext/README_70b.md (Expected Slurm Performance) and maxtext/configure.sh",
        configuration="MaxText llama2-70b on 8 DGX H100 (64 x H100 80G), BF16, seq 4096, 2 per GPU (global 128), "
        "FSDP 64 (8 in a node x 8 nodes), remat save_qkv_proj, cuDNN flash attention (Transformer Engine), "
        "XLA_PYTHON_CLIENT_MEM_FRACTION 0.94",
        outcome=RAN, measured="6.999 s/step, 52.59% MFU", versions="ghcr.io/nvidia/jax:maxtext-2024-12-09",
        args=f"--model {HF / 'llama2-70b.json'} --target gpu:h100x64 --mesh fsdp=64 --batch 128 --seq 4096 "
        "--attention cudnn --remat save_qkv_proj --mem-fraction 0.94",
        why_it_may_differ="the remat policy and memory fraction are those of the recipe's configure.sh as stored "
        "(a later revision than the README's table); its XLA flags (PGLE, collective combining) are not passed",
    ),
    Case(
        name="llama3-8b-v5p-8-maxtext-compile", platform="tpu",
        source="jaxmem's MaxText parity check (docs; MaxText train_compile measured 2026-11-30)",
        configuration="MaxText llama3-8b, compile_topology v5p-8 (FSDP 4), per-device batch 4, seq 2048, remat "
        "full, dot_product attention, AdamW, f32 weights",
        outcome=COMPILED, measured="peak 38.60 GiB of 95.74 (argument 22.44, temp 16.75)",
        versions="MaxText 0.2.5, jax 0.12.0.1, libtpu 0.0.52", judged_on=("libtpu==0.0.52",),
        needs_maxtext=True,
        args=maxtext("tpu:v5p-8", "model_name=llama3-8b", "per_device_batch_size=4", "max_target_length=2048",
                     "remat_policy=full", "attention=dot_product"),
        why_it_may_differ="temp_size_in_bytes depends on the libtpu release (0.0.42.1 reports 5-12 GiB more)",
    ),
)
BY_NAME = {c.name: c for c in CASES}


def llama2_70b_v5p_cases() -> tuple[Case, ...]:
  """MaxText PR #2957 (commit 8c9fede, benchmarks/maxtext_v5p_model_configs.py): Llama 2 70B on
  v5p-128, FSDP 64 (ici_fsdp=-1), seq 4096, remat save_dot_except_mlpwi, synthetic data, base.yml
  defaults; per-device batch 2 ran, 4 ran out of memory on the slice (January 2026). Written with
  jaxmem's own model of it (Llama 2 70B's config.json); the runtime account
  (jaxmem.hardware.runtime, benchmarks/runtime_account.py) gives the device as the runtime holds it."""
  source = "MaxText PR #2957 (January 2026; commit 8c9fede, benchmarks/maxtext_v5p_model_configs.py)"
  shared = ("MaxText llama2-70b, v5p-128 (FSDP 64), seq 4096, remat save_dot_except_mlpwi, synthetic data, "
            "base.yml defaults (f32 weights, bf16 compute, AdamW)")
  args = (f"--model {HF / 'llama2-70b.json'} --target tpu:v5p-128 --mesh fsdp=64 --batch {{batch}} --seq 4096 "
          "--remat save_dot_except_mlpwi")
  why = ("the run's versions (January 2026) and its XLA flags are not these; the releases of January 2026 (libtpu "
         "0.0.32 to 0.0.35) cannot compile its splash kernel under jax 0.12.0.1 or 0.10.2, and the nearest that can "
         "(0.0.39, April 2026, under jax 0.10.2) fits per-device batch 4 too, 89.81 of 95.00 GiB, as does 0.0.33 "
         "with XLA-only (chunked) attention, 89.92 of 95.00 GiB (docs/versions.md); "
         "the runtime account (runtime_terms) leaves 6.08 GiB once every cited term is placed at per-device batch 4, "
         "so none of its terms explains it")
  return (
      Case(name="llama2-70b-v5p-128-b2", platform="tpu", source=source, configuration=f"{shared}, per-device batch 2",
           outcome=RAN, versions="January 2026 MaxText stack (not published)", args=args.format(batch=128),
           why_it_may_differ=why),
      Case(name="llama2-70b-v5p-128-b4", platform="tpu", source=source, configuration=f"{shared}, per-device batch 4",
           outcome=OOM, measured="out of memory on the slice (the log is not public)",
           versions="January 2026 MaxText stack (not published)", args=args.format(batch=256), why_it_may_differ=why),
  )


def recipe_cases() -> tuple[Case, ...]:
  """tpu-recipes' runs with a measured step (:mod:`recipe_runs`: the Ironwood table and DeepSeek-V3
  on v5p-1024), each MaxText's own step with its recipe's overrides, on the slice as the recipe
  names it (``tpu7x-4x4x4``); the keys MaxText 0.2.5 renamed or dropped are said."""
  here = str(Path(__file__).resolve().parent)  # benchmarks/ is not a package
  if here not in sys.path:
    sys.path.insert(0, here)
  import recipe_runs

  cases = []
  for r in recipe_runs.RECIPES:
    overrides, changed = recipe_runs.for_maxtext(r.overrides)
    why = [f"the run's stack ({r.versions}) is not this one", "the recipe's XLA flags (LIBTPU_INIT_ARGS) are not passed",
           *changed]
    cases.append(Case(
        name=r.name, platform="tpu", source=f"{recipe_runs.TR}, {r.script} (at {r.commit})",
        configuration=r.configuration, outcome=RAN, measured=r.measured, versions=r.versions, needs=r.needs,
        needs_maxtext=True, args=maxtext(r.slice, *overrides), why_it_may_differ="; ".join(why)))
  return tuple(cases)


CASES = CASES + llama2_70b_v5p_cases() + recipe_cases()
BY_NAME = {c.name: c for c in CASES}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Result:
  case: Case
  status: str  # "agrees", "disagrees", "skipped", "error"
  line: str


def compile_policy(argv: list[str]):
  """The plan of ``compare ARGV`` and the row of its last remat policy (a case's one policy;
  MaxText's: the one its overrides set), compiled alone, not beside compare's ``none`` baseline.
  benchmarks/hub_models.py compiles its models with it too."""
  from jaxmem.cli import _common, build_parser
  from jaxmem.planning import sweep
  from jaxmem.resolve import for_task, plan

  ns = build_parser().parse_args(["compare", *argv])
  _common.start(ns.target)
  p = plan(_common.workload(ns))
  (task,) = [t for t in p.tasks() if t.remat == p.remats[-1].name]  # as rows name it
  return p, sweep.run_config(*for_task(p, task))


def compile_releases(argv: list[str], releases: tuple[str, ...]):
  """The plan of ``compare ARGV --compiler RELEASES`` and the rows of its last remat policy, one
  per release, each compiled in a worker process that loads it (jaxmem.compilers)."""
  from jaxmem.cli import _common, build_parser
  from jaxmem.planning import sweep
  from jaxmem.resolve import plan

  ns = build_parser().parse_args(["compare", *argv, "--compiler", ",".join(releases)])
  _common.start(ns.target)
  p = plan(_common.workload(ns))
  tasks = [t for t in p.tasks() if t.remat == p.remats[-1].name]
  return p, sweep.run_rows(p, tasks)


def run_case(case: Case) -> Result:
  """Compiles the case's configuration (its named remat policy only), under each release it is
  judged on, and judges agreement."""
  why = case.skipped()
  if why is not None:
    return Result(case=case, status="skipped", line=f"skipped: needs {why}")
  import jaxmem

  os.chdir(ROOT)  # the cases' config.json paths are the repository's
  start = time.perf_counter()
  try:
    if case.judged_on:
      _, rows = compile_releases(shlex.split(case.args), case.judged_on)
    else:
      rows = [compile_policy(shlex.split(case.args))[1]]
  except jaxmem.JaxmemError as e:
    return Result(case=case, status="error", line=f"error: {e}")
  seconds = time.perf_counter() - start
  return judge(case, rows, seconds)


def judge(case: Case, rows: list, seconds: float) -> Result:
  """Whether the rows' verdicts are the published outcome (a run that ran fits under every
  release, one that failed is refused under at least one), and the figures behind each."""
  import jaxmem

  heads = []
  for row in rows:
    said = {True: "fits", False: "does not fit", None: "no verdict"}[row.fits]
    if getattr(row, "verdict", None) == "at risk":
      said = "at risk"
    versions = ", ".join(f"{k} {v}" for k, v in (row.versions or jaxmem.compiler_versions()).items())
    heads.append(f"{said}; required {_gib(row.required_bytes)} of {_gib(row.capacity_bytes)} GiB "
                 f"({row.judged_figure or '-'}), naive sum {_gib(row.naive_sum_bytes)} GiB, "
                 f"compiler check {row.compiler_check or '-'}, runtime account {row.runtime_verdict or '-'}"
                 + (f" ({row.runtime_term})" if row.runtime_term else "")
                 + f", {_gib(row.runtime_available_bytes)} GiB left, on {versions}")
  head = f"jaxmem ({seconds:.0f} s): " + " | ".join(heads)
  if any(r.fits is None for r in rows):
    errors = "; ".join(r.error or "no capacity" for r in rows if r.fits is None)
    return Result(case=case, status="disagrees", line=f"{head}; no verdict: {errors}")
  if FITS[case.outcome]:
    agrees = all(r.fits and getattr(r, "verdict", None) != "at risk" for r in rows)
  else:
    agrees = any(not r.fits or getattr(r, "verdict", None) == "at risk" for r in rows)
  if agrees:
    return Result(case=case, status="agrees", line=f"agrees ({case.outcome}); {head}")
  causes = [case.why_it_may_differ] if case.why_it_may_differ else []
  causes.append(f"the case ran on {case.versions}; these figures come from the releases named")
  if case.outcome in (RAN, COMPILED) and all(r.naive_sum_bytes and r.capacity_bytes and r.error is None for r in rows):
    causes.append("a runtime term jaxmem holds against the capacity (docs/backends.md) or a flag the run set")
  return Result(case=case, status="disagrees", line=f"DISAGREES (published: {case.outcome}); {head}; suspected: "
                + "; ".join(causes))


def _gib(v: int | None) -> str:
  return "-" if v is None else f"{v / GiB:.2f}"


def judged_on(case: Case) -> str:
  """The compiler releases a case is judged on, in words."""
  return ", ".join(case.judged_on) if case.judged_on else case.judged_note


def list_line(case: Case) -> str:
  weight = "heavy" if case.heavy else "light"
  run = case.args if case.args is not None else "-"
  skip = case.skipped()
  return (f"{case.name} [{case.platform}, {weight}]: {case.outcome}" + (f" ({case.measured})" if case.measured else "")
          + f"; source: {case.source}; versions: {case.versions}; judged on: {judged_on(case)}; jaxmem arguments: {run}"
          + (f"; skipped: needs {skip}" if skip else ""))


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--list", action="store_true", help="print one case a line and exit")
  ap.add_argument("--case", action="append", default=None, metavar="NAME", help="run this case (repeatable)")
  ap.add_argument("--all", action="store_true", help="run every case, the heavy ones too")
  args = ap.parse_args(argv)
  if args.list:
    for c in CASES:
      print(list_line(c))
    return 0
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  unknown = [n for n in args.case or () if n not in BY_NAME]
  if unknown:
    print(f"published_runs: unknown case {unknown[0]!r}; --list names them", file=sys.stderr)
    return 2
  cases = [BY_NAME[n] for n in args.case] if args.case else [c for c in CASES if args.all or not c.heavy or c.skipped()]
  results = []
  for case in cases:
    r = run_case(case)
    results.append(r)
    print(f"{case.name}: {r.line}", flush=True)
  counts = {s: sum(r.status == s for r in results) for s in ("agrees", "disagrees", "skipped", "error")}
  print("; ".join(f"{n} {s}" for s, n in counts.items()))
  return 1 if counts["disagrees"] or counts["error"] else 0


if __name__ == "__main__":
  sys.exit(main())
