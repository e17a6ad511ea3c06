"""The step-time estimate (jaxmem.steptime): the roofline bound's terms on every compiled row, the
target peaks behind them, the machine each target kind walks its ops on, the HBM traffic read from
the optimized HLO, model FLOPs and MFU."""

import dataclasses

import pytest

from jaxmem.steptime import Work, estimate
from jaxmem.hardware import targets as tg
from jaxmem.hardware.machine import LINKS, Machine
from jaxmem.hardware.targets import get_target, target_machine, target_peaks
from jaxmem.hlo.ops import hlo_costs
from jaxmem.hlo.traffic import traffic
from jaxmem.inference import infer
from jaxmem.models import count_active_params, count_params, get_config
from jaxmem.models.model_flops import inference_flops, matmul_params, training_flops
from jaxmem.planning import sweep
from jaxmem.records import StepTime
from jaxmem.steptime import OpTimes, step_time, timeline
from jaxmem.render import tables
from jaxmem.render.inference import render_infer

GB = 10**9


# --- the peaks, from the target's kind (no compile) ---------------------------------------------


@pytest.mark.parametrize("name", ["tpu:v5e-1", "tpu:v7x-2", "gpu:h100"])
def test_an_attached_device_has_the_peaks_of_its_part(name):
  # The attached kind finds the part by the device's kind: the same figures as the named target.
  named = get_target(name)
  attached = dataclasses.replace(named, name="attached", kind=tg.Attached())
  assert target_peaks(attached) == target_peaks(named) and target_peaks(named)[0] is not None
  assert attached.source == "attached" and not named.kind.attached


def test_a_target_without_published_peaks_says_why():
  unknown = dataclasses.replace(get_target("gpu:h100"), name="attached", device_kind="Some GPU", kind=tg.Attached())
  peaks, why = target_peaks(unknown)
  assert peaks is None and "Some GPU" in why
  peaks, why = target_peaks(get_target("cpu"))
  assert peaks is None and "cpu" in why


def test_each_kind_gives_its_platforms_runtime_terms():
  for name in ("tpu:v5e-1", "gpu:h100", "cpu"):
    t = get_target(name)
    assert all(t.platform in term.platforms for term in t.kind.runtime_terms(t))
  assert get_target("cpu").kind.runtime_terms(get_target("cpu")) == ()


# --- the machine each kind walks its ops on (no compile) ----------------------------------------

# One target of each kind, and what its machine's links are (None: no machine, and why not). A new
# kind without an entry here fails the test below: its step time would be unmodelled.
KIND_EXAMPLES = {
    tg.Cpu: ("cpu", None),
    tg.Tpu: ("tpu:v5e-8", ("ICI", "DCN", "host")),  # two slices (slices=2 below); the host link (PCIe)
    tg.Gpu: ("gpu:h100x64", ("NVLink", "network")),
    tg.Attached: ("gpu:h100x8", ("NVLink",)),  # an attached H100 host, by its device kind
}


def _example(kind: type) -> tg.Target:
  name = KIND_EXAMPLES[kind][0]
  if kind is tg.Attached:
    return dataclasses.replace(get_target(name), name="attached", kind=tg.Attached())
  return get_target(name, slices=2) if kind is tg.Tpu else get_target(name)


def test_every_target_kind_gives_the_machine_its_ops_are_walked_on():
  assert set(KIND_EXAMPLES) == set(tg.TargetKind.__subclasses__())
  for kind, (_, links) in KIND_EXAMPLES.items():
    t = _example(kind)
    machine, why = target_machine(t)
    assert type(t.kind) is kind
    if links is None:
      assert machine is None and why == target_peaks(t)[1] is not None
      continue
    assert isinstance(machine, Machine) and why is None, kind
    assert tuple(link.name for link in machine.links) == links
    peaks, _ = target_peaks(t)
    assert (machine.peak_flops, machine.hbm_bandwidth, machine.fast.bandwidth) == (
        peaks.peak_flops, peaks.hbm_bandwidth, peaks.link_bandwidth)
  # An attached device is its catalogued part's single slice or host; an unknown one has no machine.
  attached, _ = target_machine(_example(tg.Attached))
  host, _ = target_machine(get_target("gpu:h100x8"))
  assert attached == host
  unknown = dataclasses.replace(_example(tg.Attached), device_kind="Some GPU")
  machine, why = target_machine(unknown)
  assert machine is None and "Some GPU" in why


def test_every_link_names_a_field_of_the_rows_and_of_the_op_times():
  step_fields = {f.name for f in dataclasses.fields(StepTime)}
  op_fields = {f.name for f in dataclasses.fields(OpTimes)}
  for link in LINKS:
    assert link.field == f"{link.name.lower()}_comm_time_s"
    assert link.field in step_fields and link.field in op_fields
  assert len({link.field for link in LINKS}) == len(LINKS)


def _ids(groups):
  return "{" + ",".join("{" + ",".join(map(str, g)) + "}" for g in groups) + "}"


# gpu:h100x64 is eight hosts of 8. Two all-gathers of one device's [1024, 1024] into [8192, 1024]:
# one over each host's own 8 GPUs (NVLink), one over a GPU of each host (the hosts' network).
_HOSTS = f"""HloModule m, num_partitions=64

ENTRY %main (p: bf16[1024,1024]) -> (bf16[8192,1024], bf16[8192,1024]) {{
  %p = bf16[1024,1024]{{1,0}} parameter(0)
  %inside = bf16[8192,1024]{{1,0}} all-gather(%p), channel_id=1, replica_groups={_ids([range(h * 8, h * 8 + 8) for h in range(8)])}, dimensions={{0}}, use_global_device_ids=true
  %across = bf16[8192,1024]{{1,0}} all-gather(%p), channel_id=2, replica_groups={_ids([range(g, 64, 8) for g in range(8)])}, dimensions={{0}}, use_global_device_ids=true
  ROOT %t = (bf16[8192,1024]{{1,0}}, bf16[8192,1024]{{1,0}}) tuple(%inside, %across)
}}
"""


def test_each_links_time_is_named_by_its_link_on_eight_gpu_hosts():
  """The field named for NVLink holds the all-gather inside the hosts, at NVLink's rate; the one
  named for the hosts' network holds the one across them, at the network's; together they are
  the walk's whole communication. The roofline's comm term, every byte at NVLink's rate, says
  it is a bound, below the network's time alone."""
  target = get_target("gpu:h100x64")
  costs = hlo_costs(_HOSTS)
  sent = {o.name: o.comm_bytes for o in costs.ops}
  assert sent["inside"] == sent["across"] > 0
  machine, _ = target_machine(target)
  nvlink, net = machine.fast, machine.slow
  assert (nvlink.name, net.name) == ("NVLink", "network") and net.bandwidth < nvlink.bandwidth
  est = step_time(costs, target, flops=0.0, bytes_accessed=costs.bytes_accessed, comm_bytes=costs.comm_bytes,
                  num_devices=64)
  st, ops = est.step, est.ops
  walk = timeline(costs, target)
  by_name = {o.name: o for o in walk.ops}
  assert (by_name["inside"].link, by_name["across"].link) == ("NVLink", "network")
  # Each link's time at its own rate: NCCL's latency, then the bytes over the link's bandwidth.
  inside = nvlink.base_latency_s + 7 * nvlink.step_latency_s + sent["inside"] / nvlink.bandwidth
  across = net.base_latency_s + 7 * net.step_latency_s + sent["across"] / net.bandwidth
  assert st.nvlink_comm_time_s == pytest.approx(inside) == by_name["inside"].comm_time_s
  assert st.network_comm_time_s == pytest.approx(across) == by_name["across"].comm_time_s
  assert st.network_comm_time_s > 5 * st.nvlink_comm_time_s  # 50 GB/s a GPU against 450
  assert st.nvlink_comm_time_s + st.network_comm_time_s == pytest.approx(walk.comm_time_s)
  assert (st.ici_comm_time_s, st.dcn_comm_time_s) == (None, None)  # no such links on GPUs
  assert st.roofline_comm_time_s == pytest.approx(costs.comm_bytes / nvlink.bandwidth)
  assert st.roofline_comm_time_s < st.network_comm_time_s
  # The op times name the same links with the same figures, and their comm total is the walk's.
  assert (ops.nvlink_comm_time_s, ops.network_comm_time_s) == (st.nvlink_comm_time_s, st.network_comm_time_s)
  assert ops.comm_time_s == pytest.approx(walk.comm_time_s)
  assert {o.cost.name: o.link for o in ops.ops if o.cost.comm_bytes} == {"inside": "NVLink", "across": "network"}
  # One host of 8: NVLink only, nothing on a network.
  one = step_time(hlo_costs(_HOSTS.replace("num_partitions=64", "num_partitions=8")), get_target("gpu:h100x8"),
                  flops=0.0, bytes_accessed=0, comm_bytes=costs.comm_bytes, num_devices=8).step
  assert one.network_comm_time_s is None and one.nvlink_comm_time_s > 0


def test_a_link_without_a_published_bandwidth_has_no_time():
  """TPU v4 publishes no per-chip ICI figure: its collectives are not timed, and the ICI field
  says unknown, not 0."""
  module = "\n".join(line for line in _HOSTS.splitlines() if "%across" not in line)
  module = module.replace("num_partitions=64", "num_partitions=4").replace("tuple(%inside, %across)", "tuple(%inside, %inside)")
  module = module.replace(_ids([range(h * 8, h * 8 + 8) for h in range(8)]), "{{0,1,2,3}}")
  costs = hlo_costs(module)
  st = step_time(costs, get_target("tpu:v4-8"), flops=0.0, bytes_accessed=0, comm_bytes=costs.comm_bytes,
                 num_devices=4).step
  assert costs.comm_bytes > 0 and st.ici_comm_time_s is None and st.roofline_comm_time_s is None


# --- the terms, from given figures (no compile) -------------------------------------------------


def _estimate(target="tpu:v5e-8", flops=1e12, bytes_accessed=10 * GB, comm=2 * GB, n=8, work=None):
  return estimate(flops=flops, bytes_accessed=bytes_accessed, comm_bytes=comm, num_devices=n,
                  target=get_target(target), work=work)


def test_each_term_is_its_figure_over_the_peak_and_the_bound_is_the_largest():
  peaks, _ = target_peaks(get_target("tpu:v5e-8"))
  st, notes = _estimate(work=Work(tokens=8 * 4096, model_flops=8 * 0.9e12))
  assert st.roofline_compute_time_s == pytest.approx(1e12 / peaks.peak_flops)
  assert st.roofline_memory_time_s == pytest.approx(10 * GB / peaks.hbm_bandwidth)
  assert st.roofline_comm_time_s == pytest.approx(2 * GB / peaks.link_bandwidth)
  terms = {"compute": st.roofline_compute_time_s, "memory": st.roofline_memory_time_s, "comm": st.roofline_comm_time_s}
  assert st.step_time_s == max(terms.values()) and st.bound == max(terms, key=terms.get)
  assert st.tokens_per_s_per_device == pytest.approx(4096 / st.step_time_s)
  assert st.mfu == pytest.approx(0.9e12 / (st.step_time_s * peaks.peak_flops))
  assert st.ridge_point == pytest.approx(peaks.peak_flops / peaks.hbm_bandwidth) and not notes
  # More FLOPs than the others can hide: compute-bound, and MFU is model FLOPs over program FLOPs.
  big, _ = _estimate(flops=1e15, work=Work(tokens=1, model_flops=8 * 0.9e15))
  assert big.bound == "compute" and big.mfu == pytest.approx(0.9)


def test_the_compute_term_never_times_fewer_flops_than_the_model_needs():
  st, notes = _estimate(flops=1e12, work=Work(tokens=1, model_flops=8 * 2.2e12, floor_flops=8 * 2e12))
  peaks, _ = target_peaks(get_target("tpu:v5e-8"))
  assert st.roofline_compute_time_s == pytest.approx(2e12 / peaks.peak_flops)
  assert any(n.startswith("roofline_compute_time_s: the program's FLOPs per device") for n in notes)
  # Above the floor (a causal kernel may run fewer FLOPs than the model's non-causal count): as counted.
  st, notes = _estimate(flops=1e12, work=Work(tokens=1, model_flops=8 * 1.2e12, floor_flops=8 * 0.9e12))
  assert st.roofline_compute_time_s == pytest.approx(1e12 / peaks.peak_flops) and not notes


def test_the_link_is_half_the_quoted_bidirectional_figure_and_a_device_share_of_a_chip():
  v5p, _ = target_peaks(get_target("tpu:v5p-8"))
  v7x, _ = target_peaks(get_target("tpu:v7x-8"))  # two devices a chip
  h100, _ = target_peaks(get_target("gpu:h100x8"))
  assert v5p.link_bandwidth == pytest.approx(1200e9 / 2) and v5p.peak_flops == 459e12
  assert v7x.peak_flops == pytest.approx(2307e12 / 2) and v7x.hbm_bandwidth == pytest.approx(7380e9 / 2)
  assert h100.link == "NVLink" and h100.link_bandwidth == pytest.approx(450e9)
  a800, _ = target_peaks(get_target("gpu:a800x8"))
  a100, _ = target_peaks(get_target("gpu:a100-80gbx8"))
  assert a800.peak_flops == a100.peak_flops and a800.link_bandwidth < a100.link_bandwidth


def test_a_target_without_figures_gives_none_and_says_why():
  st, notes = _estimate(target="cpu", n=1)
  assert st.step_time_s is None and st.bound is None and st.mfu is None
  assert any(n.startswith("step time: target cpu") for n in notes)
  # TPU v4's page gives no per-chip ICI figure: no comm term, and the step leaves it out, said.
  st, notes = _estimate(target="tpu:v4-8", n=4)
  assert st.roofline_comm_time_s is None and st.step_time_s == max(st.roofline_compute_time_s, st.roofline_memory_time_s)
  assert any("no published per-chip interconnect bandwidth for TPU v4" in n for n in notes)


def test_multislice_communication_is_said_to_be_a_lower_bound():
  st, notes = estimate(flops=1.0, bytes_accessed=1, comm_bytes=GB, num_devices=16,
                       target=get_target("tpu:v5e-8", slices=2), work=None)
  assert st.roofline_comm_time_s is not None and any("cross DCN" in n for n in notes)


def test_model_flops_are_6nt_plus_attention():
  cfg = get_config("llama3-8b")
  n = matmul_params(cfg)
  assert n == count_active_params(cfg) - cfg.vocab_size * cfg.d_model  # the lookup table is no matmul
  t, s = 8 * 2048, 2048
  attn = 12 * cfg.num_layers * t * s * cfg.num_heads * cfg.head_dim  # PaLM appendix B
  assert training_flops(cfg, batch=8, seq=s, causal=False) == pytest.approx(6 * n * t + attn)
  assert training_flops(cfg, batch=8, seq=s) == pytest.approx(6 * n * t + attn / 2)  # the causal half
  assert inference_flops(cfg, tokens=t, context=s) == pytest.approx((6 * n * t + attn) / 3)  # decode: all of it
  assert inference_flops(cfg, tokens=t, context=s, causal=True) == pytest.approx((6 * n * t + attn / 2) / 3)
  moe = get_config("mixtral-8x7b")
  assert matmul_params(moe) < count_params(moe) / 3  # the k routed experts a token uses, not all


# --- HBM traffic from HLO text ----------------------------------------------------------------

_LOOP = """HloModule m, entry_computation_layout={(f32[4,256,256]{2,1,0}, f32[64,256]{1,0})->f32[64,256]{1,0}}

%slice_w (p0: f32[4,256,256], p1: s32[]) -> f32[256,256] {
  %p0 = f32[4,256,256]{2,1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %c0 = s32[] constant(0)
  %ds = f32[1,256,256]{2,1,0} dynamic-slice(%p0, %p1, %c0, %c0), dynamic_slice_sizes={1,256,256}
  ROOT %b = f32[256,256]{1,0} bitcast(%ds)
}

%save (p0: f32[4,64,256], p1: f32[64,256], p2: s32[]) -> f32[4,64,256] {
  %p0 = f32[4,64,256]{2,1,0} parameter(0)
  %p1 = f32[64,256]{1,0} parameter(1)
  %p2 = s32[] parameter(2)
  %c0 = s32[] constant(0)
  %u = f32[1,64,256]{2,1,0} bitcast(%p1)
  ROOT %dus = f32[4,64,256]{2,1,0} dynamic-update-slice(%p0, %u, %p2, %c0, %c0)
}

%body (t: (s32[], f32[64,256], f32[4,256,256], f32[4,64,256])) -> (s32[], f32[64,256], f32[4,256,256], f32[4,64,256]) {
  %t = (s32[], f32[64,256]{1,0}, f32[4,256,256]{2,1,0}, f32[4,64,256]{2,1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = f32[64,256]{1,0} get-tuple-element(%t), index=1
  %ws = f32[4,256,256]{2,1,0} get-tuple-element(%t), index=2
  %acc = f32[4,64,256]{2,1,0} get-tuple-element(%t), index=3
  %w = f32[256,256]{1,0} fusion(%ws, %i), kind=kLoop, calls=%slice_w
  %y = f32[64,256]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %vmem = f32[64,256]{1,0:T(8,128)S(1)} copy(%y)
  %acc2 = f32[4,64,256]{2,1,0} fusion(%acc, %y, %i), kind=kLoop, calls=%save
  %one = s32[] constant(1)
  %i2 = s32[] add(%i, %one)
  ROOT %r = (s32[], f32[64,256]{1,0}, f32[4,256,256]{2,1,0}, f32[4,64,256]{2,1,0}) tuple(%i2, %y, %ws, %acc2)
}

%cond (t: (s32[], f32[64,256], f32[4,256,256], f32[4,64,256])) -> pred[] {
  %t = (s32[], f32[64,256]{1,0}, f32[4,256,256]{2,1,0}, f32[4,64,256]{2,1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %n = s32[] constant(TRIPS)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (ws: f32[4,256,256], x: f32[64,256]) -> f32[64,256] {
  %ws = f32[4,256,256]{2,1,0} parameter(0)
  %x = f32[64,256]{1,0} parameter(1)
  %z = s32[] constant(0)
  %acc = f32[4,64,256]{2,1,0} broadcast(%z), dimensions={}
  %t = (s32[], f32[64,256]{1,0}, f32[4,256,256]{2,1,0}, f32[4,64,256]{2,1,0}) tuple(%z, %x, %ws, %acc)
  %l = (s32[], f32[64,256]{1,0}, f32[4,256,256]{2,1,0}, f32[4,64,256]{2,1,0}) while(%t), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"TRIPS"}}
  ROOT %out = f32[64,256]{1,0} get-tuple-element(%l), index=1
}
"""


def test_traffic_charges_slices_and_in_place_updates_per_layer_times_the_trip_count():
  w, act = 256 * 256 * 4, 64 * 256 * 4  # one layer's weight, one activation
  two, four = (traffic(_LOOP.replace("TRIPS", str(n))) for n in (2, 4))
  # Per trip: the slice fusion reads one layer's weight (and the s32 index) and writes it; the dot
  # reads both operands and writes its result; the copy into VMEM (S(1)) reads only; the in-place
  # update reads the new activation and writes it, not the stack; the counter; the condition.
  per_trip = (w + w + 4) + (act + w + act) + act + (act + act + 4) + 12 + 9
  assert four.bytes_accessed - two.bytes_accessed == 2 * per_trip
  assert two.bytes_accessed == 2 * per_trip + 9 + (4 * act + 4)  # one more condition, the stack's broadcast
  assert not four.lower_bound


# XLA:TPU's spelling of the same loop: the stack is retiled (T(16,128) to T(8,128) for bf16) by a
# nested fusion that returns its operand's buffer in place, and the layer is sliced out of, or
# written into, that view (seen in Llama 3.1 70B's MaxText step on tpu7x: 22 GB a layer charged).
_RELAYOUT = """%relayout_w (q: f32[4,256,256]) -> f32[4,256,256] {
  %q = f32[4,256,256]{2,1,0} parameter(0)
  ROOT %c = f32[4,256,256]{2,1,0} copy(%q)
}

%relayout_acc (q: f32[4,64,256]) -> f32[4,64,256] {
  %q = f32[4,64,256]{2,1,0} parameter(0)
  ROOT %c = f32[4,64,256]{2,1,0} copy(%q)
}

"""


def _viewed(aliased: bool) -> str:
  alias = ", output_to_operand_aliasing={{}: (0, {})}" if aliased else ""
  text = _RELAYOUT + _LOOP.replace("TRIPS", "4")
  text = text.replace(
      "  %ds = f32[1,256,256]{2,1,0} dynamic-slice(%p0,",
      f"  %v = f32[4,256,256]{{2,1,0}} fusion(%p0), kind=kLoop{alias}, calls=%relayout_w\n"
      "  %ds = f32[1,256,256]{2,1,0} dynamic-slice(%v,")
  return text.replace(
      "  ROOT %dus = f32[4,64,256]{2,1,0} dynamic-update-slice(%p0,",
      f"  %v = f32[4,64,256]{{2,1,0}} fusion(%p0), kind=kLoop{alias}, calls=%relayout_acc\n"
      "  ROOT %dus = f32[4,64,256]{2,1,0} dynamic-update-slice(%v,")


def test_traffic_sees_through_a_stack_retiled_in_place_to_the_layer_it_slices_or_updates():
  plain = traffic(_LOOP.replace("TRIPS", "4")).bytes_accessed
  assert traffic(_viewed(aliased=True)).bytes_accessed == plain
  # A nested fusion that makes a copy of its own reads the stack whole: more than the layer.
  stacks = 4 * (4 * 256 * 256 * 4 + 4 * 64 * 256 * 4)
  assert traffic(_viewed(aliased=False)).bytes_accessed > plain + stacks / 2


def test_traffic_without_a_trip_count_is_a_lower_bound():
  text = _LOOP.replace(', backend_config={"known_trip_count":{"n":"TRIPS"}}', "").replace("constant(TRIPS)", "parameter(1)")
  t = traffic(text)
  assert t.lower_bound and any("without a known trip count" in n for n in t.notes)


# --- compiled rows ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def batch_rows():
  """tiny on tpu:v5e-1, no remat, at batch 2 and 8 (two compiles of about a second each)."""
  return [sweep.compare(model="tiny", target="tpu:v5e-1", remat="none", batch=b, seq=128, cache=False)[0]
          for b in (2, 8)]


@pytest.mark.needs_tpu_compiler
def test_every_compiled_row_carries_the_estimate(batch_rows):
  small, large = batch_rows
  peaks, _ = target_peaks(get_target("tpu:v5e-1"))
  assert small.roofline_compute_time_s == pytest.approx(small.flops / peaks.peak_flops)
  assert small.roofline_memory_time_s == pytest.approx(small.bytes_accessed / peaks.hbm_bandwidth)
  terms = (small.roofline_compute_time_s, small.roofline_memory_time_s, small.roofline_comm_time_s)
  assert small.roofline_step_time_s == max(terms)
  # The simulated schedule: never below the bound, its shares of the step summing to one.
  assert small.step_time_s >= small.roofline_step_time_s
  shares = (small.compute_bound_share, small.memory_bound_share, small.comm_bound_share)
  assert sum(shares) == pytest.approx(1.0) and small.exposed_comm_time_s == 0.0
  # The sum over ops (each op at its own bound) is at least the step's memory term: the ops' bytes sum to it.
  assert small.op_time_s >= small.roofline_memory_time_s and small.hlo_flops <= small.flops
  assert small.bound in ("compute", "memory") and small.roofline_comm_time_s == 0.0
  assert small.model_flops == pytest.approx(training_flops(get_config("tiny"), batch=2, seq=128))
  assert 0 < small.mfu < 1
  # Four times the tokens: more FLOPs, more traffic, a longer step.
  assert large.flops > small.flops and large.bytes_accessed > small.bytes_accessed
  assert large.step_time_s > small.step_time_s
  # The fields are StepTime's, flat in JSON, and the table labels them estimates.
  assert set(StepTime().as_dict()) <= set(small.as_dict())
  assert small.step_time() == StepTime(**{f.name: getattr(small, f.name) for f in dataclasses.fields(StepTime)})
  text = tables.render_compare(batch_rows, "table", columns=frozenset({"all"}))
  assert all(h in text for h in tables.STEP_TIME_HEADERS)


@pytest.mark.needs_tpu_compiler
def test_rows_without_an_estimate_show_no_estimate_columns(batch_rows):
  # A CPU target's rows (no peak figures: see test_a_target_without_figures_gives_none_and_says_why).
  bare = [dataclasses.replace(r, **dict.fromkeys(("step_time_s", "bound", "mfu"))) for r in batch_rows]
  assert "step (est)" not in tables.render_compare(bare, "table")
  mixed = tables.render_compare([bare[0], batch_rows[1]], "markdown").splitlines()
  assert any("| -  " in line or "| - " in line for line in mixed)


@pytest.mark.needs_tpu_compiler
def test_decode_is_memory_bound_with_its_time_per_token():
  (dec,) = infer.infer(model="tiny", phase="decode", context=[256], batch=2, target="tpu:v5e-1")
  assert dec.arithmetic_intensity < dec.ridge_point and dec.bound == "memory"
  assert dec.time_per_output_token_s == dec.step_time_s > 0
  assert dec.model_flops == pytest.approx(inference_flops(get_config("tiny"), tokens=2, context=256))
  text = render_infer([dec], "table", columns=frozenset({"all"}))
  assert "per token (est)" in text and "FLOP/B vs ridge" in text and " < " in text


@pytest.mark.slow
@pytest.mark.needs_tpu_compiler
def test_prefill_is_compute_bound_and_decode_memory_bound():
  # One layer 1024 wide (about 20 s of compile on a loaded 2-core machine): prefill's matmuls over
  # 1024 tokens are above v5e's ridge (240 FLOP/B), decode's one token per sequence far below it.
  cfg = get_config("llama3-1b", num_layers=1, vocab_size=1024, d_model=1024, d_ff=4096, num_heads=8, num_kv_heads=8)
  pre, dec = infer.infer(model=cfg, phase="prefill,decode", prompt=256, context=[256], batch=4, target="tpu:v5e-1",
                         attention="dot")
  assert pre.phase == "prefill" and dec.phase == "decode"
  assert pre.arithmetic_intensity > pre.ridge_point > dec.arithmetic_intensity
  assert pre.bound == "compute" and dec.bound == "memory"
  assert dec.time_per_output_token_s == dec.step_time_s and pre.time_per_output_token_s is None


@pytest.mark.slow  # a TPU compile at seq 1024 for the kernel's block skipping; the closed form's causal count is tested above
@pytest.mark.needs_tpu_compiler
def test_model_flops_never_exceed_what_a_causal_kernel_runs():
  """tiny at seq 1024 with splash, no remat: the kernel skips the masked blocks, so the program
  runs fewer FLOPs than the unhalved attention count; the rows' causal count stays under it (an
  MFU formed with the unhalved one could read above 100% on a compute-bound step)."""
  (row,) = sweep.compare(model="tiny", target="tpu:v5e-1", remat="none", batch=2, seq=1024, cache=False)
  assert row.attention == "splash" and row.flops is not None
  assert row.model_flops <= row.flops < training_flops(get_config("tiny"), batch=2, seq=1024, causal=False)
