"""Programs sharing a device (``resident``): the capacity a step is judged against drops by the
bytes another program holds, a TPU compile is capped to match and the row says the flag to run
with; and what a verdict judges (``judged_figure``, ``naive_sum_bytes``, ``compiler_check``)."""

import dataclasses

import pytest

import jaxmem
from jaxmem import JaxmemError
from jaxmem.compiler.report import MemoryReport
from jaxmem.hardware.margin import ACCEPTED, AT_RISK, JUDGED_CHECK, JUDGED_PEAK, JUDGED_TOTAL, NO, judged_note
from jaxmem.hardware.targets import TPU_HBM_CAP_OPTION, get_target, with_resident
from jaxmem.sizes import byte_count

MiB, GiB = 1 << 20, 1 << 30


def test_sizes_read_as_people_write_them():
  assert byte_count("14.5GiB", "resident") == int(14.5 * GiB)
  assert byte_count("512MiB", "resident") == 512 * MiB
  assert byte_count("2GB", "resident") == 2 * 10**9
  assert byte_count("1000", "resident") == byte_count(1000, "resident") == 1000
  assert byte_count(None, "resident") == 0
  for bad in ("12 parsecs", "GiB", "-3", True, 1.5):
    with pytest.raises(JaxmemError, match="`resident` takes a size"):
      byte_count(bad, "resident")


def test_resident_bytes_come_out_of_a_gpus_allocator_share_and_say_the_fraction_to_run_with():
  alone = get_target("gpu:h100")
  shared = with_resident(alone, 8 * GiB)
  assert shared.capacity_bytes == alone.capacity_bytes - 8 * GiB
  assert shared.compiler_options == {}  # the GPU compiler checks no capacity: nothing to cap
  assert "XLA_PYTHON_CLIENT_MEM_FRACTION=" in shared.capacity_note
  assert jaxmem.Workload(resident="8GiB").resident == 8 * GiB


def test_resident_needs_a_capacity_and_must_leave_some():
  with pytest.raises(JaxmemError, match="needs a target with a device memory capacity"):
    with_resident(get_target("cpu"), MiB)
  gpu = get_target("gpu:h100")
  with pytest.raises(JaxmemError, match="leaves nothing"):
    with_resident(gpu, gpu.capacity_bytes)


def test_cpu_rows_judge_the_total_and_make_no_capacity_check(compile_one):
  r = compile_one(model="tiny", batch=2, seq=64, remat="full", target="cpu")
  assert r.peak_memory_in_bytes is None and r.judged_figure == JUDGED_TOTAL
  assert r.naive_sum_bytes == r.total_bytes and r.compiler_check is None


def _report(platform, *, total, peak, host=0):
  return MemoryReport(platform=platform, num_devices=1, argument_size_in_bytes=total // 4, output_size_in_bytes=0,
                      alias_size_in_bytes=0, temp_size_in_bytes=total - total // 4, total_bytes=total,
                      peak_memory_in_bytes=peak, host_temp_size_in_bytes=host, host_total_bytes=host)


def test_a_tpu_program_the_compiler_accepted_is_judged_by_its_check_where_no_figure_bounds_its_hbm():
  """MaxText's 128B on v5e-256 (qkv offloaded to host): total 15.81 GiB of 15.75, peak 17.46 with 12
  GiB of host temporaries in it. Neither is the HBM the program needs; libtpu's check accepted it."""
  capacity = 16 * GiB
  offload = _report("tpu", total=capacity + GiB // 8, peak=capacity + 2 * GiB, host=12 * GiB)
  v = offload.judge(capacity, checked=True)
  assert (v.fits, v.verdict, v.judged_figure, v.margin_bytes) == (True, AT_RISK, JUDGED_CHECK, None)
  assert "accepted the program" in judged_note(v, capacity, offload.required_bytes)
  # A capacity the compiler did not check (set by hand) is judged on the total, as before.
  assert offload.judge(capacity).verdict == NO
  # A peak under the total is the figure: over the capacity it is over (the compiler would have
  # refused such a program; a row built from it says NO), and the CPU and GPU compilers check nothing.
  assert _report("tpu", total=capacity + GiB, peak=capacity + GiB // 2).judge(capacity, checked=True).verdict == NO
  for platform in ("gpu", "cpu"):
    over = _report(platform, total=capacity + GiB, peak=capacity + 2 * GiB).judge(capacity, checked=True)
    assert over.judged_figure == JUDGED_TOTAL and over.verdict == NO


def test_only_a_tpus_own_capacity_is_the_one_its_compiler_checks():
  v5e = jaxmem.target("tpu:v5e-1")
  assert v5e.capacity_checked and jaxmem.target("tpu:v5e-1", resident="1GiB").capacity_checked
  assert not dataclasses.replace(v5e, capacity_bytes=3 << 19).capacity_checked  # set by hand
  assert not jaxmem.target("gpu:h100").capacity_checked and not jaxmem.target("cpu").capacity_checked


# tiny at 8 x 512 keeps its temporaries in HBM on v5e (smaller programs keep them in VMEM).
TINY = dict(model="tiny", batch=8, seq=512, remat="none")


@pytest.fixture(scope="module")
def alone(compile_one):
  return compile_one(**TINY, target="tpu:v5e-1")


# Slow: a TPU compile at 8 x 512. test_published_runs' light case compiles the same step in the
# fast suite and checks the same two fields as its command prints them.
@pytest.mark.slow
@pytest.mark.needs_tpu_compiler
def test_a_tpu_row_says_the_compiler_accepted_it_and_which_figure_was_judged(alone):
  assert alone.fits and alone.compiler_check == ACCEPTED
  assert alone.naive_sum_bytes == alone.total_bytes
  assert alone.judged_figure == (JUDGED_PEAK if alone.peak_memory_in_bytes <= alone.total_bytes else JUDGED_TOTAL)


@pytest.mark.needs_tpu_compiler
def test_resident_lowers_a_tpu_capacity_and_caps_the_compile_with_the_matching_flag():
  alone = jaxmem.target("tpu:v5e-1")
  shared = jaxmem.target("tpu:v5e-1", resident="1GiB")
  assert shared.capacity_bytes == alone.capacity_bytes - GiB
  assert shared.compiler_options == {TPU_HBM_CAP_OPTION: shared.capacity_bytes // MiB}
  assert f"--{TPU_HBM_CAP_OPTION}={shared.capacity_bytes // MiB}" in shared.capacity_note


@pytest.mark.slow  # two more TPU compiles; the capacity and the compiler's cap are held above without one
@pytest.mark.needs_tpu_compiler
def test_a_step_that_fitted_alone_is_refused_once_the_resident_bytes_exceed_its_margin(alone, compile_one):
  # Within its margin it still fits, against the lowered capacity, with the flag on the row.
  within = compile_one(**TINY, target="tpu:v5e-1", resident=alone.margin_bytes // 2)
  assert within.fits and within.capacity_bytes == alone.capacity_bytes - alone.margin_bytes // 2
  assert any(f"--{TPU_HBM_CAP_OPTION}=" in n for n in within.notes)
  # Past it (by a MiB): refused, whether by jaxmem's verdict or by the capped compiler itself.
  past = compile_one(**TINY, target="tpu:v5e-1", resident=alone.margin_bytes + MiB)
  assert past.fits is False and past.verdict == "NO"
  assert past.capacity_bytes == alone.capacity_bytes - alone.margin_bytes - MiB
