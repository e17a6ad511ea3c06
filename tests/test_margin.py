"""Whether a program fits, judged on the device's memory alone and against what the runtime holds
beside it (jaxmem.hardware.margin): host-offloaded bytes stay out of ``required_bytes``, and a
row whose margin is under the runtime's terms is "at risk"."""

import dataclasses
from pathlib import Path

import pytest

from jaxmem.hardware import margin
from jaxmem.compiler.report import device_required
from jaxmem.hardware.targets import target


def test_verdict_is_no_past_capacity_at_risk_inside_the_runtime_terms_else_yes():
  assert margin.judge(100, 100, 0) == margin.Verdict(fits=True, verdict="yes", margin_bytes=0, risk_bytes=0)
  assert margin.judge(90, 100, 10).verdict == "yes"  # a margin of exactly the risk is enough
  at_risk = margin.judge(91, 100, 10)
  assert (at_risk.fits, at_risk.verdict, at_risk.margin_bytes) == (True, "at risk", 9)
  assert margin.judge(101, 100, 10) == margin.Verdict(fits=False, verdict="NO", margin_bytes=-1, risk_bytes=10)
  assert margin.judge(90, 100, None).verdict == "yes"  # no known risk term
  assert margin.judge(None, 100, 10).verdict is None and margin.judge(90, None, 10).fits is None


def test_risk_terms_are_the_loaded_executable_on_tpu_and_the_compilers_slop_on_gpu():
  assert margin.risk_bytes("tpu", capacity=1000, generated_code=7) == 7
  # XLA:GPU leaves 5% of what the arguments and outputs leave free (gpu_hlo_schedule.cc).
  gpu = margin.risk_bytes("gpu", capacity=1000, argument=300, output=300, alias=200)
  assert gpu == (1000 - 400) * 5 // 100
  assert margin.risk_bytes("gpu", capacity=1000, argument=None, output=1, alias=0) is None
  assert margin.risk_bytes("cpu", capacity=None) == 0


def test_every_runtime_term_names_its_source_and_how_it_is_accounted():
  for t in margin.RUNTIME_TERMS:
    assert t.source and t.what and t.platforms
    assert t.accounted in ("capacity", "risk", "account", "not modelled"), t.name
  # Each accounted for as "risk" is what risk_bytes sizes: one per platform.
  assert {p for t in margin.RUNTIME_TERMS if t.accounted == "risk" for p in t.platforms} == {"tpu", "gpu"}


def test_backends_doc_lists_every_runtime_term_with_its_source():
  doc = (Path(__file__).parent.parent / "docs" / "backends.md").read_text()
  for t in margin.RUNTIME_TERMS:
    assert t.name in doc and t.source.split(";")[0].split(" (")[0] in doc, t.name


def test_required_is_the_peak_at_most_the_device_total():
  assert device_required(90, 100) == 90  # TPU: the peak, below argument + temp
  assert device_required(300, 65) == 65  # a peak counting VMEM or host memory
  assert device_required(None, 65) == 65 and device_required(None, None) is None


# tiny at 8 x 512 offloads 7 MiB of residuals to host memory on v5e (the TPU gives offload a
# host memory space; compiles in about 2 s).
OFFLOAD = dict(model="tiny", batch=8, seq=512, remat="minimal_offloaded")


@pytest.fixture(scope="module")
def offload_row(compile_one):
  return compile_one(**OFFLOAD, target="tpu:v5e-1")


# Slow: a TPU compile at 8 x 512 that offloads to the host. The fast suite compiles an offloading
# policy on the TPU through test_compare's registry case, and holds the verdicts' arithmetic on
# constructed rows above.
@pytest.mark.slow
@pytest.mark.needs_tpu_compiler
def test_host_memory_is_its_own_column_and_not_required_of_the_device(offload_row):
  r = offload_row
  assert r.host_temp_size_in_bytes > 0 and r.host_total_bytes >= r.host_temp_size_in_bytes
  assert None not in (r.host_argument_size_in_bytes, r.host_output_size_in_bytes, r.host_alias_size_in_bytes,
                      r.host_generated_code_size_in_bytes)
  assert r.required_bytes <= r.total_bytes  # the device's own memory space
  # tiny's peak counts VMEM and host memory above every device buffer at once: said on the row.
  assert r.peak_memory_in_bytes > r.total_bytes and any("other memory spaces" in n for n in r.notes)


@pytest.mark.slow  # a second offloading compile; the host's own column and share are held above and below
@pytest.mark.needs_tpu_compiler
def test_a_row_whose_device_bytes_fit_and_device_plus_host_would_not(offload_row, compile_one):
  # A v5e shrunk so that the device's bytes fit with half the host's bytes to spare, and half
  # the runtime's risk terms: it fits, at risk, and would not if host memory counted.
  r = offload_row
  # Its host shrunk too, to one byte under the host bytes: the device verdict stands, the host's
  # is NO, judged on the host's share alone.
  spare = min(r.host_total_bytes, r.risk_bytes) // 2
  small = dataclasses.replace(target("tpu:v5e-1"), capacity_bytes=r.required_bytes + spare,
                              host_capacity_bytes=r.host_total_bytes - 1)
  edge = compile_one(**OFFLOAD, target=small)
  assert edge.required_bytes == r.required_bytes
  assert edge.required_bytes + edge.host_total_bytes > edge.capacity_bytes
  assert (edge.fits, edge.verdict, edge.margin_bytes) == (True, "at risk", spare)
  assert edge.risk_bytes == edge.generated_code_size_in_bytes > spare
  assert (edge.host_capacity_bytes, edge.host_fits, edge.host_verdict) == (r.host_total_bytes - 1, False, "NO")


@pytest.mark.slow  # shares the offloading compile above
@pytest.mark.needs_tpu_compiler
def test_offloaded_host_bytes_are_held_against_the_hosts_share_per_device(offload_row):
  # v5e's 4-chip VM: 192 GB over 4 chips, far above tiny's few MiB of residuals.
  r, t = offload_row, target("tpu:v5e-1")
  assert r.host_capacity_bytes == t.host_capacity_bytes == 192 * 10**9 // 4
  assert (r.host_fits, r.host_verdict) == (True, "yes")
  assert t.host_capacity_note in r.notes and "cloud.google.com/tpu/docs/v5e" in t.host_capacity_note
