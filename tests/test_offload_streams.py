"""The schedule walk's other engines (jaxmem.steptime.walk): a collective XLA:TPU offloads to the
SparseCores (an asynchronous call of a computation on the ``sparsecore`` execution thread) timed on
the links its group drives in a queue of its own, and host offload's transfers (arrays moved to
and from memory space S(5)) timed on the host link, each overlapping the work scheduled between
its start and its done."""

import dataclasses

import pytest

from jaxmem.hardware.machine import Machine, host_link, ici
from jaxmem.hardware.targets import get_target, target_machine
from jaxmem.hlo.ops import hlo_costs
from jaxmem.steptime.walk import host_transfer, simulate

N = 1024
_DOT = f"  %dot = bf16[{N},{N}]{{1,0}} dot(%p0, %p0), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}\n"
_GROUPS = "channel_id=1, replica_groups=[1,4]<=[4], dimensions={0}, use_global_device_ids=true"

# A weight's shard all-gathered over 4 devices on the SparseCore, as libtpu writes it: a call-start
# that takes no operand, a call-update that hands over the shard, the matmul, the call-done.
_SC_HEAD = f"""HloModule m, num_partitions=4

%sc_gather (s: bf16[{N // 4},{N}]) -> bf16[{N},{N}] {{
  %s = bf16[{N // 4},{N}]{{1,0}} parameter(0)
  ROOT %ag = bf16[{N},{N}]{{1,0}} all-gather(%s), {_GROUPS}
}}, execution_thread="sparsecore"

ENTRY %main (p0: bf16[{N},{N}], p1: bf16[{N // 4},{N}]) -> (bf16[{N},{N}], bf16[{N},{N}]) {{
  %p0 = bf16[{N},{N}]{{1,0}} parameter(0)
  %p1 = bf16[{N // 4},{N}]{{1,0}} parameter(1)
  %cs = ((), (), (s32[1]{{0}})) call-start(), async_execution_thread="sparsecore", to_apply=%sc_gather
  %cu = ((bf16[{N // 4},{N}]{{1,0}}), bf16[{N},{N}]{{1,0}}) call-update(%cs, %p1)
"""
_SC_TAIL = f"""  ROOT %t = (bf16[{N},{N}]{{1,0}}, bf16[{N},{N}]{{1,0}}) tuple(%dot, %cd)
}}
"""
_CD = f"  %cd = bf16[{N},{N}]{{1,0}} call-done(%cu)\n"
SPARSECORE = _SC_HEAD + _DOT + _CD + _SC_TAIL  # the matmul between update and done
SPARSECORE_NOTHING_BETWEEN = _SC_HEAD + _CD + _DOT + _SC_TAIL


def _ici(rate: float):
  """ICI at ``rate`` without latency: a transfer takes its bytes over the rate alone."""
  return dataclasses.replace(ici(rate), step_latency_s=0.0, base_latency_s=0.0)


def _machine(**kw):
  """The matmul (2 N^3 FLOPs) takes 2.1 ms; the all-gather sends 1.5 MiB, the offloaded copy 0.5."""
  base = dict(part="test", peak_flops=1e12, hbm_bandwidth=1e12, fast=_ici(1e9), host=host_link(1e9))
  return Machine(**{**base, **kw})


def test_a_sparsecore_collective_is_timed_on_the_links_and_overlaps_the_work_between():
  costs = hlo_costs(SPARSECORE)
  sent = sum(o.comm_bytes for o in costs.ops)
  assert sent == pytest.approx(3 / 4 * N * N * 2)  # the all-gather inside the call counts, once
  for link_rate in (1e9, 1e8):  # the transfer shorter, then longer, than the matmul
    t = simulate(costs, _machine(fast=_ici(link_rate)))
    assert t.comm_time_s == pytest.approx(sent / link_rate)
    assert t.link_comm_time_s["ici_comm_time_s"] == pytest.approx(t.comm_time_s)
    dot = next(o for o in t.ops if o.name == "dot")
    # The call's ops take no time on the stream: the step is the matmul and what it does not hide.
    assert t.exposed_comm_time_s == pytest.approx(max(0.0, t.comm_time_s - dot.time_s), rel=1e-3, abs=1e-9)
    assert t.step_time_s == pytest.approx(dot.time_s + t.exposed_comm_time_s, rel=1e-6)
  assert any("sparsecore" in n for n in t.notes)


def test_a_sparsecore_collective_waited_for_at_once_is_exposed_whole():
  m = _machine()
  between, at_once = simulate(hlo_costs(SPARSECORE), m), simulate(hlo_costs(SPARSECORE_NOTHING_BETWEEN), m)
  assert at_once.comm_time_s == pytest.approx(between.comm_time_s) and at_once.comm_time_s > 0
  assert at_once.exposed_comm_time_s == pytest.approx(at_once.comm_time_s, rel=1e-6)
  assert between.exposed_comm_time_s < at_once.exposed_comm_time_s
  assert between.step_time_s < at_once.step_time_s


# Remat offload as libtpu writes it: a layer's activation copied to host memory (S(5)) while the
# matmul runs, and read back by a dynamic slice out of a host buffer.
_H = "{1,0:T(8,128)(2,1)S(5)}"
_HOST_HEAD = f"""HloModule m

ENTRY %main (p0: bf16[{N},{N}], a: bf16[{N // 4},{N}], h: bf16[2,{N // 4},{N}]) -> (bf16[{N},{N}]) {{
  %p0 = bf16[{N},{N}]{{1,0}} parameter(0)
  %a = bf16[{N // 4},{N}]{{1,0}} parameter(1)
  %h = bf16[2,{N // 4},{N}]{{2,1,0:T(8,128)(2,1)S(5)}} parameter(2)
  %i = s32[] constant(0)
"""
OFFLOAD = _HOST_HEAD + (
    f"  %cs = (bf16[{N // 4},{N}]{_H}, bf16[{N // 4},{N}]{{1,0}}, u32[]) copy-start(%a)\n" + _DOT
    + f"  %cd = bf16[{N // 4},{N}]{_H} copy-done(%cs)\n"
    f"  ROOT %t = (bf16[{N},{N}]{{1,0}}, bf16[{N // 4},{N}]{_H}) tuple(%dot, %cd)\n}}\n"
)
OFFLOAD_SYNC = _HOST_HEAD + (
    f"  %c = bf16[{N // 4},{N}]{_H} copy(%a)\n" + _DOT
    + f"  ROOT %t = (bf16[{N},{N}]{{1,0}}, bf16[{N // 4},{N}]{_H}) tuple(%dot, %c)\n}}\n"
)
BOTH_WAYS = _HOST_HEAD + (
    f"  %cs = (bf16[{N // 4},{N}]{_H}, bf16[{N // 4},{N}]{{1,0}}, u32[]) copy-start(%a)\n"
    f"  %ds = ((bf16[2,{N // 4},{N}]{{2,1,0:T(8,128)(2,1)S(5)}}, s32[], s32[], s32[]), bf16[1,{N // 4},{N}]{{2,1,0}}, "
    f"u32[]) dynamic-slice-start(%h, %i, %i, %i), dynamic_slice_sizes={{1,{N // 4},{N}}}\n"
    f"  %cd = bf16[{N // 4},{N}]{_H} copy-done(%cs)\n"
    f"  %dd = bf16[1,{N // 4},{N}]{{2,1,0}} dynamic-slice-done(%ds)\n"
    f"  ROOT %t = (bf16[{N // 4},{N}]{_H}, bf16[1,{N // 4},{N}]{{2,1,0}}) tuple(%cd, %dd)\n}}\n"
)
_MOVED = N // 4 * N * 2  # bytes of the activation


def test_a_copy_to_host_memory_is_timed_on_the_host_link_and_overlaps_the_work_between():
  costs = hlo_costs(OFFLOAD)
  for host_rate in (1e9, 1e8):  # the copy shorter, then longer, than the matmul
    t = simulate(costs, _machine(host=host_link(host_rate)))
    assert t.link_comm_time_s["host_comm_time_s"] == pytest.approx(_MOVED / host_rate)
    dot = next(o for o in t.ops if o.name == "dot")
    assert t.exposed_comm_time_s == pytest.approx(max(0.0, _MOVED / host_rate - dot.time_s), abs=1e-9)
    assert t.exposed_host_time_s == pytest.approx(t.exposed_comm_time_s)
    assert t.step_time_s == pytest.approx(dot.time_s + t.exposed_comm_time_s)


def test_a_synchronous_copy_to_host_blocks_the_stream():
  m = _machine(host=host_link(1e8))
  a, s = simulate(hlo_costs(OFFLOAD), m), simulate(hlo_costs(OFFLOAD_SYNC), m)
  assert s.link_comm_time_s["host_comm_time_s"] == pytest.approx(a.link_comm_time_s["host_comm_time_s"])
  assert s.step_time_s > a.step_time_s
  dot = next(o for o in s.ops if o.name == "dot")
  assert s.step_time_s == pytest.approx(dot.time_s + _MOVED / 1e8, rel=1e-6)


def test_transfers_each_way_share_no_queue_and_are_read_by_direction():
  from jaxmem.hlo.text import parse_module

  module = parse_module(BOTH_WAYS)
  entry = module.computations[module.entry]
  assert host_transfer(module, entry.name, entry.instructions["cs"]) == ("to", _MOVED)
  assert host_transfer(module, entry.name, entry.instructions["ds"]) == ("from", _MOVED)
  t = simulate(hlo_costs(BOTH_WAYS), _machine(host=host_link(1e9)))
  assert t.link_comm_time_s["host_comm_time_s"] == pytest.approx(2 * _MOVED / 1e9)
  assert t.step_time_s == pytest.approx(_MOVED / 1e9)  # PCIe carries each direction at its rate at once


def test_a_host_link_without_a_published_rate_leaves_the_transfers_untimed_and_says_so():
  t = simulate(hlo_costs(OFFLOAD), _machine(host=host_link(None), host_note="not published for the test part"))
  assert t.link_comm_time_s["host_comm_time_s"] is None and t.exposed_comm_time_s == 0
  assert any("host link" in n and "not published for the test part" in n for n in t.notes)


def test_the_tpu_catalogue_gives_each_device_its_share_of_the_published_host_link():
  v6e, _ = target_machine(get_target("tpu:v6e-4"))
  assert v6e.host.bandwidth == 32e9  # "Trillium (TPU v6e) has 32GB/s" of PCIe, one device a chip
  v4, _ = target_machine(get_target("tpu:v4-8"))
  assert v4.host.bandwidth == 16e9
  v7x, _ = target_machine(get_target("tpu:v7x-8"))
  assert v7x.host.bandwidth is None and "not published" in v7x.host_note
