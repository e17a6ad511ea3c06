"""The runtime account (jaxmem.hardware.runtime): held to the printed figures of published TPU
out-of-memory reports (tests/data/oom_reports, read with jaxmem's own parser), and its relations
on rows jaxmem compiles. No figure here is fitted: each expected number is a report's own."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from jaxmem.hardware import margin, runtime
from jaxmem.hardware.oom import parse_hbm_account, parse_oom
from jaxmem.records import CompilerFigures

REPORTS = Path(__file__).parent / "data" / "oom_reports"
# A report prints its figures to two decimals of their unit ("1.25G", "530.00M"): a sum of n
# rounded figures is within n half-units of the printed total.
G, M = 1 << 30, 1 << 20


def report(name: str):
  text = (REPORTS / name).read_text()
  return parse_hbm_account(text), text


def url(name: str) -> str:
  return re.search(r"^# url: (\S+)", (REPORTS / name).read_text(), re.M).group(1)


def test_every_stored_report_names_its_url_and_parses():
  names = sorted(p.name for p in REPORTS.glob("*.txt"))
  assert len(names) >= 3
  for name in names:
    assert url(name).startswith("https://"), name
    account, text = report(name)
    assert account is not None, name
    assert parse_oom(text) is not None or account.total_bytes is not None, name


def test_the_runtime_account_is_the_printed_one_to_the_byte():
  """pytorch/xla #1735 prints the runtime's own account in bytes: the capacity is the top-of-memory
  reserve + what is allocated + the program + what is left. jaxmem's account of the same terms
  against the capacity net of the reserve gives the printed remainder exactly."""
  printed, _ = report("pytorch-xla-1735.txt")
  terms = {
      "top-of-memory reserved": runtime.term(runtime.TOP, printed.top_reserved_bytes, url("pytorch-xla-1735.txt")),
      "currently allocated": runtime.term(runtime.HEAP, printed.heap_bytes, url("pytorch-xla-1735.txt")),
      "program requirement": runtime.term(runtime.PROGRAM, printed.program_bytes, url("pytorch-xla-1735.txt")),
  }
  account = runtime.tpu_account(terms, printed.capacity_bytes - printed.top_reserved_bytes)
  assert account.runtime_available_bytes == printed.available_after_bytes == -2_735_391_744
  assert account.runtime_verdict == margin.AT_RISK and account.runtime_term == runtime.PROGRAM_BLOCK
  # The load it reports: the block asked for is the program requirement, and no contiguous block
  # that large was free.
  assert abs(printed.load.request_bytes - printed.program_bytes) <= 0.005 * G
  assert printed.load.reservable_bytes < printed.load.request_bytes
  # The program's block is its printed parts (reserved, global, scoped, HLO temp).
  assert abs(sum(printed.program_parts.values()) - printed.program_bytes) <= 4 * 0.005 * G


@pytest.mark.parametrize("name", ["easydel-166.txt", "lwm-60.txt", "easydel-142.txt"])
def test_a_compile_refusal_is_the_account_over_the_capacity_net_of_the_reserve(name):
  """The compiler's check on newer releases: Used = program + arguments against the capacity net
  of the top-of-memory reserve, and the total adds the reserve back. jaxmem's account of the
  report's program and arguments gives the printed excess."""
  printed, text = report(name)
  assert abs(printed.used_bytes - (printed.program_bytes + printed.arguments_bytes)) <= 2 * 0.005 * G
  assert abs(printed.total_bytes - (printed.used_bytes + printed.top_reserved_bytes)) <= 2 * 0.005 * G
  terms = {
      "arguments": runtime.term(runtime.HEAP, printed.arguments_bytes, url(name)),
      "program": runtime.term(runtime.PROGRAM, printed.program_bytes, url(name)),
  }
  account = runtime.tpu_account(terms, printed.capacity_bytes)
  exceeded = re.search(r"Exceeded hbm capacity by ([\d.]+)G", text)
  assert exceeded and abs(-account.runtime_available_bytes - float(exceeded.group(1)) * G) <= 3 * 0.005 * G
  assert account.runtime_verdict == margin.AT_RISK


@pytest.mark.parametrize("name", ["tensor2tensor-1382.txt", "flowpm-27.txt"])
def test_the_older_form_counts_the_reserve_in_used_against_the_whole_hbm(name):
  printed, _ = report(name)
  arguments = printed.arguments_bytes or 0  # flowpm's "unknown size"
  assert abs(printed.used_bytes - (printed.top_reserved_bytes + printed.program_bytes + arguments)) <= 3 * 0.005 * G
  assert printed.capacity_bytes in (8 * G, 16 * G)  # the whole HBM of a v2 / v3 core


def test_a_program_load_fails_for_fragmentation_where_the_free_total_would_hold_it():
  """pytorch/xla #3470: 6.78G free, 3.33G of it reservable (contiguous at the bottom), for a 6.48G
  program; the others had too little free at all."""
  frag, _ = report("pytorch-xla-3470.txt")
  assert frag.load.free_bytes >= frag.load.request_bytes > frag.load.reservable_bytes
  for name in ("pytorch-xla-4847.txt", "transformers-22328.txt", "xla-error-0101.txt", "pytorch-xla-1735.txt"):
    load = report(name)[0].load
    assert load.request_bytes > load.free_bytes == load.reservable_bytes, name
    assert load.reserved_bytes == 0, name  # no other program held a reservation when it failed


def test_the_top_of_memory_reserve_per_generation_is_the_one_its_report_prints():
  for generation, printed in runtime.TOP_OF_MEMORY.items():
    cited = printed.source.split()[0]
    (name,) = [p.name for p in REPORTS.glob("*.txt") if url(p.name) == cited]
    assert report(name)[0].top_reserved_bytes == printed.bytes, generation
  # Where a report prints the device's available HBM, the reserve and it make the whole HBM (v4's
  # 32 GiB, v3's 16 GiB): the compiler's available is net of the reserve.
  v4, _ = report("easydel-166.txt")
  assert v4.capacity_bytes + v4.top_reserved_bytes == 32 * G
  v3, _ = report("lwm-60.txt")
  assert abs(v3.capacity_bytes + v3.top_reserved_bytes - 16 * G) <= 0.005 * G + 0.005 * M


def figures(**kw) -> CompilerFigures:
  base = dict(argument_size_in_bytes=1000, output_size_in_bytes=1000, alias_size_in_bytes=1000,
              temp_size_in_bytes=5000, generated_code_size_in_bytes=100)
  return CompilerFigures(**{**base, **kw})


def tpu(required, capacity=10_000, **kw):
  f = figures(**kw)
  terms = runtime.tpu_terms(
      generation="v4", argument=f.argument_size_in_bytes, output=f.output_size_in_bytes, alias=f.alias_size_in_bytes,
      temp=f.temp_size_in_bytes, code=f.generated_code_size_in_bytes, required=required)
  return runtime.tpu_account(terms, capacity)


def test_the_tpu_account_adds_up_and_leaves_the_temp_allocation_unsummed():
  a = tpu(required=4000)
  held = {n: t["bytes"] for n, t in a.runtime_terms.items()}
  assert a.runtime_heap_bytes == held["arguments"] + held["outputs not donated"]
  assert a.runtime_program_bytes == held["program (as the compiler checked it)"] + held["code"]
  assert a.runtime_available_bytes == 10_000 - a.runtime_heap_bytes - a.runtime_program_bytes
  # The block is what the compiler counts beside the heap: required less the heap, so heap + block
  # is the required bytes and the code beside them.
  assert a.runtime_heap_bytes + a.runtime_program_bytes == 4000 + 100
  # The temp allocation grows without moving the account (the runtime does not reserve it whole).
  assert tpu(required=4000, temp_size_in_bytes=50_000).runtime_available_bytes == a.runtime_available_bytes
  assert a.runtime_top_reserved_bytes == runtime.TOP_OF_MEMORY["v4"].bytes
  assert all(t["source"] for t in a.runtime_terms.values())


def test_at_risk_where_what_is_left_is_under_the_per_step_buffers_and_never_no():
  roomy = tpu(required=4000, output_size_in_bytes=1500)  # 500 bytes of outputs reuse no argument
  assert roomy.runtime_verdict == margin.YES
  # Left: capacity - (required + code); at risk once that is under the 500 per-step bytes.
  tight = tpu(required=10_000 - 100 - 499, output_size_in_bytes=1500)
  assert tight.runtime_available_bytes == 499 and tight.runtime_verdict == margin.AT_RISK
  assert tight.runtime_term == runtime.FRAGMENTATION
  assert "donate" in tight.runtime_remedy and "xla_tpu_max_hbm_size_mib" in tight.runtime_remedy
  over = tpu(required=10_000)
  assert over.runtime_available_bytes < 0 and over.runtime_term == runtime.PROGRAM_BLOCK
  assert over.runtime_verdict == margin.AT_RISK
  assert tpu(required=None).runtime_verdict is None  # a figure it needs unknown: no verdict


def test_the_verdict_follows_the_account_only_from_yes_to_at_risk():
  fits = margin.judge(100, 1000, 0)
  assert margin.with_runtime(fits, margin.AT_RISK).verdict == margin.AT_RISK
  assert margin.with_runtime(fits, margin.YES) == fits
  refused = margin.judge(2000, 1000, 0)
  assert margin.with_runtime(refused, margin.AT_RISK).verdict == margin.NO


def test_a_job_moves_its_per_step_batch_out_of_the_arguments():
  base = tpu(required=4000)
  job = {"batch": runtime.term(runtime.STEP_HEAP, 300, "a loop"),
         "other programs": runtime.term(runtime.PROGRAMS, None, "a loop")}
  moved = runtime.with_job(base, job, from_arguments=300)
  assert moved.runtime_heap_bytes == base.runtime_heap_bytes  # the same bytes, now per step
  assert moved.runtime_available_bytes == base.runtime_available_bytes
  assert moved.runtime_terms["arguments"]["bytes"] == base.runtime_terms["arguments"]["bytes"] - 300
  tight = runtime.with_job(tpu(required=10_000 - 100 - 200), job, from_arguments=300)
  assert tight.runtime_verdict == margin.AT_RISK and tight.runtime_term == runtime.FRAGMENTATION


def test_the_gpu_account_sets_what_lives_outside_the_pool_against_what_the_pool_leaves():
  terms = runtime.gpu_terms(compute_capability=9, communicators=2, cudnn=True, env={})
  assert terms["cuBLAS workspace"]["bytes"] == 32 * M  # Hopper; 4 MiB before it
  assert runtime.gpu_terms(compute_capability=8, communicators=0, cudnn=False, env={})["cuBLAS workspace"]["bytes"] == 4 * M
  # NCCL: NCCL_BUFFSIZE x channels x 2 ring peers per communicator, its documented default 4 MiB.
  assert terms["NCCL buffers"]["bytes"] == 2 * 4 * M * 32 * 2
  assert runtime.nccl_bytes(1, {"NCCL_BUFFSIZE": str(M), "NCCL_MAX_NCHANNELS": "8"}) == M * 8 * 2
  assert terms["CUDA context"]["bytes"] is None and terms["cuDNN workspace"]["bytes"] is None
  memory = 80 * G
  roomy = runtime.gpu_account(terms, memory=memory, pool=int(0.75 * memory))
  assert roomy.runtime_verdict == margin.YES
  assert roomy.runtime_available_bytes == memory - int(0.75 * memory) - 32 * M - 2 * 4 * M * 32 * 2
  tight = runtime.gpu_account(terms, memory=memory, pool=memory - 100 * M)
  assert tight.runtime_verdict == margin.AT_RISK and tight.runtime_term == "NCCL buffers"
  assert "XLA_PYTHON_CLIENT_MEM_FRACTION" in tight.runtime_remedy


def test_a_tpu_row_carries_the_account_in_its_json(tiny_tpu_row):
  d = tiny_tpu_row.as_dict()
  terms = d["runtime_terms"]
  assert {"arguments", "program (as the compiler checked it)", "code", "top-of-memory reserved"} <= set(terms)
  for name, t in terms.items():
    assert set(t) == {"bytes", "part", "source"} and t["source"], name
  assert d["runtime_verdict"] == margin.YES and d["verdict"] == margin.YES
  assert d["runtime_heap_bytes"] == d["argument_size_in_bytes"] + d["output_size_in_bytes"] - d["alias_size_in_bytes"]
  assert (d["runtime_heap_bytes"] + d["runtime_program_bytes"]
          == d["required_bytes"] + d["generated_code_size_in_bytes"])


@pytest.fixture(scope="module")
def tiny_tpu_row():
  pytest.importorskip("libtpu")
  from jaxmem.planning.sweep import compare

  (row,) = [r for r in compare(model="tiny", target="tpu:v5e-4", batch=8, seq=64, remat="full", cache=None)
            if r.remat == "full"]
  return row


def test_the_runtime_columns_show_only_where_the_account_puts_a_row_at_risk(tiny_tpu_row):
  from jaxmem.render.tables import render_compare

  from jaxmem.render import columns as cols

  memory = frozenset({cols.MEMORY})
  assert "program block" not in render_compare([tiny_tpu_row], "table", columns=memory)
  risky = dataclasses.replace(tiny_tpu_row, runtime_verdict=margin.AT_RISK, runtime_term=runtime.FRAGMENTATION,
                              verdict=margin.AT_RISK)
  # The verdict with its deciding term decides a launch: on the first screen; the account's
  # byte terms are in the memory set.
  first = render_compare([tiny_tpu_row, risky], "table")
  assert f"{margin.AT_RISK} ({runtime.FRAGMENTATION})" in first and "program block" not in first
  text = render_compare([tiny_tpu_row, risky], "table", columns=memory)
  assert "program block" in text and f"{margin.AT_RISK} ({runtime.FRAGMENTATION})" in text
