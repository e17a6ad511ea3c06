"""The compiled schedule walked (jaxmem.steptime.walk): overlap of asynchronous collectives, links,
tiles, loops; and the simulated step time every compiled row carries beside the roofline bound."""

import dataclasses

import pytest

from jaxmem.hardware.machine import Machine, MatrixTile, Torus, dcn, ici, network, nvlink
from jaxmem.hlo.ops import hlo_costs
from jaxmem.steptime.walk import simulate, transfer_time

N = 1024

# One device's share of a weight is all-gathered (4 devices) while a matmul of N x N runs: as an
# asynchronous pair with the matmul scheduled between start and done, and as one synchronous op.
_HEAD = f"""HloModule m, num_partitions=4

ENTRY %main (p0: bf16[{N},{N}], p1: bf16[{N // 4},{N}]) -> (bf16[{N},{N}], bf16[{N},{N}]) {{
  %p0 = bf16[{N},{N}]{{1,0}} parameter(0)
  %p1 = bf16[{N // 4},{N}]{{1,0}} parameter(1)
"""
_GROUPS = "channel_id=1, replica_groups=[1,4]<=[4], dimensions={0}, use_global_device_ids=true"
_DOT = f"  %dot = bf16[{N},{N}]{{1,0}} dot(%p0, %p0), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}\n"
ASYNC = _HEAD + (
    f"  %ags = (bf16[{N // 4},{N}]{{1,0}}, bf16[{N},{N}]{{1,0}}) all-gather-start(%p1), {_GROUPS}\n" + _DOT
    + f"  %agd = bf16[{N},{N}]{{1,0}} all-gather-done(%ags)\n"
    f"  ROOT %t = (bf16[{N},{N}]{{1,0}}, bf16[{N},{N}]{{1,0}}) tuple(%dot, %agd)\n}}\n"
)
SYNC = _HEAD + (
    f"  %ag = bf16[{N},{N}]{{1,0}} all-gather(%p1), {_GROUPS}\n" + _DOT
    + f"  ROOT %t = (bf16[{N},{N}]{{1,0}}, bf16[{N},{N}]{{1,0}}) tuple(%dot, %ag)\n}}\n"
)


def _bare(link):
  """``link`` without latency: its transfers take their bytes over its bandwidth alone."""
  return dataclasses.replace(link, base_latency_s=0.0, step_latency_s=0.0)


def _machine(**kw):
  """Rates under which the matmul (2 N^3 FLOPs) takes longer than the all-gather's transfer."""
  base = dict(part="test", peak_flops=1e12, hbm_bandwidth=1e12, fast=ici(1e9))
  return Machine(**{**base, **kw})


def test_a_start_done_pair_with_compute_between_exposes_less_than_the_same_collective_synchronous():
  m = _machine()
  a, s = simulate(hlo_costs(ASYNC), m), simulate(hlo_costs(SYNC), m)
  assert a.comm_time_s == pytest.approx(s.comm_time_s) and a.comm_time_s > 0
  assert a.exposed_comm_time_s < s.exposed_comm_time_s
  # Synchronous, it blocks the stream for its transfer (its own HBM traffic runs meanwhile).
  ag = next(o for o in s.ops if o.name == "ag")
  assert s.exposed_comm_time_s == pytest.approx(s.comm_time_s - ag.memory_time_s) and ag.bound == "comm"
  assert a.step_time_s < s.step_time_s
  for t in (a, s):  # the bound shares add up to the step
    assert sum(t.share(k) for k in ("compute", "memory", "comm")) == pytest.approx(1.0)


def test_a_pair_exposes_what_the_compute_between_does_not_cover():
  slow = _machine(fast=_bare(ici(1e7)))  # the transfer now outlasts the matmul
  t = simulate(hlo_costs(ASYNC), slow)
  dot = next(o for o in t.ops if o.name == "dot")
  assert t.exposed_comm_time_s == pytest.approx(t.comm_time_s - dot.time_s, rel=1e-6)


def test_the_walk_is_never_below_the_roofline_bound():
  for text in (ASYNC, SYNC):
    costs, m = hlo_costs(text), _machine()
    t = simulate(costs, m)
    roofline = max(costs.flops / m.peak_flops, costs.bytes_accessed / m.hbm_bandwidth, costs.comm_bytes / m.fast.bandwidth)
    assert t.step_time_s >= roofline


def test_matmuls_are_rounded_up_to_the_matrix_units_tile():
  small = f"""HloModule m

ENTRY %main (a: bf16[100,64], b: bf16[64,200]) -> bf16[100,200] {{
  %a = bf16[100,64]{{1,0}} parameter(0)
  %b = bf16[64,200]{{1,0}} parameter(1)
  ROOT %d = bf16[100,200]{{1,0}} dot(%a, %b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
}}
"""
  t = simulate(hlo_costs(small), _machine(tile=MatrixTile(rows=8, contracted=128, columns=128)))
  (d,) = [o for o in t.ops if o.name == "d"]
  assert d.flops == 2 * 100 * 64 * 200
  assert d.padded_flops == 2 * 104 * 128 * 256
  assert simulate(hlo_costs(small), _machine()).ops[0].padded_flops == d.flops  # no tile: no rounding


def test_a_convolution_is_rounded_up_as_the_matmul_it_makes():
  # The attention's output projection as XLA:TPU writes it (Llama 3.1 70B's MaxText step on tpu7x):
  # a window over the 64 heads sums each head's 128 features into one output, so the matrix unit
  # contracts 64 x 128 = 8192 at once, which a 256-deep tile does not pad (XLA's own cycle
  # estimate for it was in proportion to its FLOPs, as for the unpadded matmuls beside it).
  # A batched matmul written as a dilated convolution (each output its own kernel position)
  # contracts its 16 features only, padded to 256.
  text = """HloModule m

ENTRY %main (a: bf16[2,512,64,128], w: bf16[256,64,128,1], c: bf16[8,128,16], d: bf16[8,128,16]) -> bf16[2,512,256,1] {
  %a = bf16[2,512,64,128]{3,2,1,0} parameter(0)
  %w = bf16[256,64,128,1]{3,2,1,0} parameter(1)
  %c = bf16[8,128,16]{2,1,0} parameter(2)
  %d = bf16[8,128,16]{2,1,0} parameter(3)
  %batched = bf16[8,128,128]{2,1,0} convolution(%c, %d), window={size=8 stride=7 lhs_dilate=8}, dim_labels=0bf_0oi->0bf
  ROOT %proj = bf16[2,512,256,1]{3,2,1,0} convolution(%a, %w), window={size=1x64}, dim_labels=0b1f_o1i0->0bf1
}
"""
  ops = {o.name: o for o in simulate(hlo_costs(text), _machine(tile=MatrixTile(rows=8, contracted=256, columns=256))).ops}
  assert ops["proj"].flops == 2 * 2 * 512 * 64 * 128 * 256
  assert ops["proj"].padded_flops == ops["proj"].flops
  assert ops["batched"].flops == 2 * 8 * 128 * 16 * 128
  assert ops["batched"].padded_flops == 2 * 8 * 128 * 256 * 256


def test_a_loop_body_runs_its_trip_count():
  body = f"""HloModule m, num_partitions=4

%body (p: (s32[], bf16[{N},{N}])) -> (s32[], bf16[{N},{N}]) {{
  %p = (s32[], bf16[{N},{N}]{{1,0}}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = bf16[{N},{N}]{{1,0}} get-tuple-element(%p), index=1
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  %y = bf16[{N},{N}]{{1,0}} dot(%x, %x), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  ROOT %r = (s32[], bf16[{N},{N}]{{1,0}}) tuple(%j, %y)
}}

%cond (p: (s32[], bf16[{N},{N}])) -> pred[] {{
  %p = (s32[], bf16[{N},{N}]{{1,0}}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(TRIPS)
  ROOT %c = pred[] compare(%i, %n), direction=LT
}}

ENTRY %main (x: bf16[{N},{N}]) -> (s32[], bf16[{N},{N}]) {{
  %x = bf16[{N},{N}]{{1,0}} parameter(0)
  %zero = s32[] constant(0)
  %t = (s32[], bf16[{N},{N}]{{1,0}}) tuple(%zero, %x)
  ROOT %w = (s32[], bf16[{N},{N}]{{1,0}}) while(%t), condition=%cond, body=%body
}}
"""
  one, five = (simulate(hlo_costs(body.replace("TRIPS", str(n))), _machine()) for n in (1, 5))
  assert five.step_time_s == pytest.approx(5 * one.step_time_s, rel=1e-3)
  assert next(o for o in five.ops if o.name == "y").count == 5


def test_a_group_across_slices_crosses_the_slow_link():
  fast, slow = _bare(ici(1e11)), dcn(1e9)
  m = _machine(fast=fast, slow=slow, devices_per_unit=4)
  inside, link_in = transfer_time(m, "all_reduce", 10**8, 4, 1)
  across, link_out = transfer_time(m, "all_reduce", 10**8, 8, 2)
  assert (link_in, link_out) == ("ICI", "DCN") and across > inside
  # Hierarchical: the slow link carries 1/4 of what a flat ring over it would.
  flat = 10**8 / slow.bandwidth
  assert across < flat


def test_what_crosses_hosts_is_named_and_timed_on_the_slow_link():
  """An all-gather over 8 devices on a machine of two 4-device hosts crosses them; on one host of
  8 (no slow link) nothing does, and the same schedule with every collective on the fast link is
  shorter: what the row's fast_link_step_time_s walks."""
  module = SYNC.replace("num_partitions=4", "num_partitions=8").replace("[1,4]<=[4]", "[1,8]<=[8]")
  fast, slow = _bare(nvlink(1e9)), _bare(network(1e8))
  two_hosts = _machine(fast=fast, slow=slow, devices_per_unit=4)
  walk = simulate(hlo_costs(module), two_hosts)
  assert walk.slow_link == slow and set(walk.across()) == {"all-gather"}
  assert walk.link_comm_time_s == {"nvlink_comm_time_s": 0.0, "network_comm_time_s": pytest.approx(walk.comm_time_s)}
  assert walk.link_comm_time_s["network_comm_time_s"] == pytest.approx(walk.across()["all-gather"])
  assert walk.link_comm_time_s["network_comm_time_s"] > 0
  one_host = simulate(hlo_costs(module), _machine(fast=fast, slow=None))
  assert one_host.link_comm_time_s == {"nvlink_comm_time_s": pytest.approx(one_host.comm_time_s)}
  assert one_host.slow_link is None and one_host.across() == {}
  assert one_host.step_time_s < walk.step_time_s


def test_a_row_over_two_gpu_hosts_carries_its_step_with_the_network_as_fast_as_nvlink():
  """gpu:h100x16 is two hosts of 8: the walk's slow link is their network (400 Gb/s a GPU), and
  the row's fast_link_step_time_s, the same schedule with that link at NVLink's rates, is shorter;
  one host has neither figure."""
  from jaxmem.hardware.targets import get_target
  from jaxmem.steptime import timeline

  module = SYNC.replace("num_partitions=4", "num_partitions=16").replace("[1,4]<=[4]", "[1,16]<=[16]")
  walk = timeline(hlo_costs(module), get_target("gpu:h100x16"))
  assert walk.slow_link.name == "network" and walk.link_comm_time_s["network_comm_time_s"] > 0
  assert walk.fast_link_step_time_s < walk.step_time_s
  node = SYNC.replace("num_partitions=4", "num_partitions=8").replace("[1,4]<=[4]", "[1,8]<=[8]")
  one = timeline(hlo_costs(node), get_target("gpu:h100x8"))
  assert (one.slow_link, one.fast_link_step_time_s) == (None, None) and set(one.link_comm_time_s) == {"nvlink_comm_time_s"}


@pytest.fixture(scope="module")
def fsdp_rows(compile_one):
  """tiny on tpu:v5e-4 over fsdp=4, full remat, at 1 and 2 microbatches (the TPU compiler's own
  asynchronous collectives: start and done fusions around the layers' matmuls)."""
  # Each compiled alone: compare would compile the no-remat baseline beside each too.
  return {mb: compile_one(model="tiny", target="tpu:v5e-4", mesh="fsdp=4", remat="full", microbatches=mb, batch=8,
                          seq=128) for mb in (1, 2)}


@pytest.mark.needs_tpu_compiler
def test_more_microbatches_under_fsdp_gather_more_and_take_longer(fsdp_rows):
  one, two = fsdp_rows[1], fsdp_rows[2]
  for r in (one, two):
    assert r.step_time_s >= r.roofline_step_time_s > 0
    assert 0 < r.exposed_comm_time_s <= r.step_time_s
    assert sum((r.compute_bound_share, r.memory_bound_share, r.comm_bound_share)) == pytest.approx(1.0)
    # The compiled program's device assignment places its devices on the slice's chips (2x2, no
    # wraparound), so its collectives are timed over the links their groups drive.
    assert not any("chip coordinates are not known" in n for n in r.notes)
  # Each microbatch gathers every layer's weights again: more bytes sent, a longer simulated step.
  assert two.comm_all_gather_bytes > one.comm_all_gather_bytes
  assert two.step_time_s > one.step_time_s


# One fused attention call of each kind, as the compilers print them (cuDNN's backend config cut
# to the fields read): batch 2, 4 heads, 256 positions, head size 64, causal.
_Q = "bf16[2,256,4,64]{3,2,1,0}"
_CUDNN_CALL = f"""HloModule m

ENTRY %main (q: bf16[2,256,4,64], k: bf16[2,256,4,64], v: bf16[2,256,4,64]) -> (bf16[2,4,256,64], f32[2,4,256]) {{
  %q = {_Q} parameter(0)
  %k = {_Q} parameter(1)
  %v = {_Q} parameter(2)
  ROOT %fa = (bf16[2,4,256,64]{{3,1,2,0}}, f32[2,4,256]{{2,1,0}}) custom-call(%q, %k, %v), custom_call_target="__cudnn$fmhaSoftmax", operand_layout_constraints={{{_Q}, {_Q}, {_Q}}}, metadata={{op_name="jit(f)/dot_product_attention_fwd"}}, backend_config={{"cudnn_fmha_backend_config": {{"intermediate_tensor_shape": {{"element_type": "BF16", "dimensions": ["2", "4", "256", "256"]}}, "mask_type": "CAUSAL"}}}}
}}
"""
_S = "bf16[2,4,256,64]{3,2,1,0}"
_SPLASH_CALL = f"""HloModule m

ENTRY %main (m: s8[1,2,2], q: bf16[2,4,256,64], k: bf16[2,4,256,64], v: bf16[2,4,256,64]) -> bf16[2,4,256,64] {{
  %m = s8[1,2,2]{{2,1,0}} parameter(0)
  %q = {_S} parameter(1)
  %k = {_S} parameter(2)
  %v = {_S} parameter(3)
  ROOT %fa = {_S} custom-call(%m, %q, %k, %v), custom_call_target="tpu_custom_call", operand_layout_constraints={{s8[1,2,2]{{2,1,0}}, {_S}, {_S}, {_S}}}, metadata={{op_name="jit(f)/shard_map/splash_mha_dkv_no_residuals/pallas_call"}}
}}
"""


@pytest.mark.parametrize("text, terms", [(_CUDNN_CALL, (1, 1)), (_SPLASH_CALL, (2, 2))], ids=["cudnn-fwd", "splash-dkv"])
def test_the_walk_times_a_fused_attention_kernels_matrix_work(text, terms):
  # FlashAttention's count, causal: 2 x (batch x heads) x T x S x (terms of the head sizes) / 2.
  expected = 2.0 * (2 * 4) * 256 * 256 * (terms[0] * 64 + terms[1] * 64) / 2
  costs = hlo_costs(text)
  assert costs.flops == 0  # kept out of the module's matrix FLOPs (the per-device share's count)
  walk = simulate(costs, _machine(hbm_bandwidth=1e18))  # so the op is compute-bound
  (op,) = [o for o in walk.ops if o.name == "fa"]
  assert op.flops == pytest.approx(expected)
  assert op.compute_time_s == pytest.approx(expected / 1e12)
  assert walk.step_time_s >= op.compute_time_s


def test_a_kernel_that_carries_its_own_cost_estimate_is_timed_by_it():
  # A Pallas call's pl.CostEstimate (megablox's gmm: 2*m*k*n) rides in its backend config.
  text = _SPLASH_CALL.replace("splash_mha_dkv_no_residuals", "gmm").replace(
      "metadata=", 'backend_config={"custom_call_config":{"cost_estimate":{"flops":"123456789","transcendentals":"0"}}}, metadata=')
  walk = simulate(hlo_costs(text), _machine(hbm_bandwidth=1e18))
  (op,) = [o for o in walk.ops if o.name == "fa"]
  assert op.flops == 123456789


def test_a_gpu_target_names_its_machine_types_network_and_crossing_collectives_are_timed_on_it():
  """gpu:h100x16@a3-high is two A3 High machines: the hosts' network is the machine type's
  (1,000 Gbps over 8 GPUs), slower than the DGX H100's 400 Gb/s a GPU, so the same crossing
  all-gather takes longer; a system that does not carry the part is one line."""
  from jaxmem.errors import JaxmemError
  from jaxmem.hardware.targets import get_target
  from jaxmem.steptime import timeline

  module = SYNC.replace("num_partitions=4", "num_partitions=16").replace("[1,4]<=[4]", "[1,16]<=[16]")
  dgx, a3 = (timeline(hlo_costs(module), get_target(name)) for name in ("gpu:h100x16", "gpu:h100x16@a3-high"))
  assert a3.link_comm_time_s["network_comm_time_s"] > dgx.link_comm_time_s["network_comm_time_s"] > 0
  assert any("A3 High" in n and "125 Gb/s a GPU" in n for n in a3.notes)
  assert get_target("gpu:h100x16@a3-high").name == "gpu:h100x16@a3-high"
  with pytest.raises(JaxmemError, match="carries h200, not h100"):
    get_target("gpu:h100x16@a3-ultra")
  with pytest.raises(JaxmemError, match="unknown GPU system 'dgx2'"):
    get_target("gpu:h100x16@dgx2")


def _torus_machine(dims, wrap, coords):
  return _machine(fast=_bare(ici(6e9)), torus=Torus(dims=dims, wrap=wrap, link_bandwidth=1e9, coords=coords))


def test_a_collective_in_a_slice_is_timed_over_the_links_its_group_drives():
  """The SYNC all-gather over 4 devices: on a closed ring (one axis of 4 with wraparound) both
  directions of its links, on the same axis without wraparound one, on a 2x2 plane one link an
  axis; each below the chip's six links together (what the walk falls back to without a torus)."""
  line = tuple((i, 0, 0) for i in range(4))
  plane = ((0, 0, 0), (1, 0, 0), (1, 1, 0), (0, 1, 0))
  ring = _torus_machine((4, 1, 1), (True, False, False), line)
  assert ring.torus.links([0, 1, 2, 3]) == 2 and ring.torus.links([0, 1]) == 1  # half the axis: a line
  open_line = _torus_machine((4, 1, 1), (False, False, False), line)
  square = _torus_machine((2, 2, 1), (False, False, False), plane)
  assert square.torus.links([0, 1, 2, 3]) == 2 and square.torus.links([0, 1]) == 1
  costs = hlo_costs(SYNC)
  times = {name: simulate(costs, m).comm_time_s for name, m in
           (("ring", ring), ("line", open_line), ("square", square), ("chip", _machine(fast=_bare(ici(6e9)))))}
  sent = next(o for o in costs.ops if o.name == "ag").comm_bytes
  assert times["line"] == pytest.approx(sent / 1e9, rel=1e-6)
  assert times["ring"] == pytest.approx(sent / 2e9, rel=1e-6) == times["square"]
  assert times["chip"] < times["ring"] < times["line"]


_ELEMENTWISE = f"""HloModule m

%fused (a: f32[{N},{N}]) -> f32[{N}] {{
  %a = f32[{N},{N}]{{1,0}} parameter(0)
  %e = f32[{N},{N}]{{1,0}} exponential(%a)
  %m = f32[{N},{N}]{{1,0}} multiply(%e, %a)
  %z = f32[] constant(0)
  ROOT %r = f32[{N}]{{0}} reduce(%m, %z), dimensions={{1}}, to_apply=%sum
}}

%sum (x: f32[], y: f32[]) -> f32[] {{
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}}

ENTRY %main (p: f32[{N},{N}]) -> f32[{N}] {{
  %p = f32[{N},{N}]{{1,0}} parameter(0)
  ROOT %f = f32[{N}]{{0}} fusion(%p), kind=kLoop, calls=%fused
}}
"""


def test_a_fusions_elementwise_work_runs_at_the_vector_units_rate_where_the_part_publishes_one():
  """exp, multiply and a reduce over N x N: 3 N^2 element operations. Without a vector rate the
  fusion is timed by its HBM bytes; at a rate slow enough, by its operations, compute-bound."""
  from jaxmem.hlo.ops import vector_ops
  from jaxmem.hlo.text import parse_module

  costs = hlo_costs(_ELEMENTWISE)
  fusion = parse_module(_ELEMENTWISE).get("f")
  assert vector_ops(costs.module).of(fusion) == 3 * N * N
  unpublished = next(o for o in simulate(costs, _machine()).ops if o.name == "f")
  slow = next(o for o in simulate(costs, _machine(vector_rate=1e6)).ops if o.name == "f")
  assert unpublished.bound == "memory" and unpublished.vector_ops == 3 * N * N
  assert slow.bound == "compute" and slow.compute_time_s == pytest.approx(3 * N * N / 1e6)
  assert slow.time_s > unpublished.time_s
