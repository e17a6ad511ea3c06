"""Collective bytes per device from optimized HLO: exact figures, loop trip counts, backends' syntax."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxmem._quiet import quiet
from jaxmem.hlo.comms import KINDS, collectives, collectives_from_hlo
from jaxmem.hlo.text import parse_module

MIB = 1 << 20


def _mesh1d(devices=None):
  return Mesh(np.array(devices or jax.devices()[:8]), ("x",))


def _shard_map(f, mesh, in_specs, out_specs):
  return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs))


def test_single_all_gather_exact():
  mesh = _mesh1d()
  x = jax.ShapeDtypeStruct((1024, 1024), jnp.float32, sharding=NamedSharding(mesh, P("x")))
  compiled = jax.jit(lambda x: x * 2, out_shardings=NamedSharding(mesh, P())).lower(x).compile()
  c = collectives(compiled)
  # Each device sends its 1/8 shard to 7 others around the ring: (7/8) x 4 MiB.
  assert c.bytes_by_kind["all_gather"] == 7 * 4 * MIB // 8
  assert c.count_by_kind == {**dict.fromkeys(KINDS, 0), "all_gather": 1}
  assert c.total_bytes == 7 * 4 * MIB // 8
  assert c.notes == ()
  assert set(c.as_dict()) == {"bytes_by_kind", "count_by_kind", "total_bytes", "lower_bound", "notes"}
  assert c.lower_bound is False


def test_single_psum_exact():
  mesh = _mesh1d()
  x = jax.ShapeDtypeStruct((1024, 1024), jnp.float32, sharding=NamedSharding(mesh, P("x")))
  f = _shard_map(lambda a: jax.lax.psum(a, "x"), mesh, P("x"), P())
  c = collectives(f.lower(x).compile())
  # The per-device buffer is [128, 1024] f32 = 512 KiB; ring all-reduce sends 2(g-1)/g of it.
  assert c.bytes_by_kind["all_reduce"] == 2 * 7 * (512 * 1024) // 8
  assert c.count_by_kind["all_reduce"] == 1
  assert c.total_bytes == c.bytes_by_kind["all_reduce"]


def test_ppermute_and_psum_scatter_exact():
  mesh = _mesh1d()
  x = jax.ShapeDtypeStruct((1024, 1024), jnp.float32, sharding=NamedSharding(mesh, P("x")))
  ring = [(i, (i + 1) % 8) for i in range(8)]
  c = collectives(_shard_map(lambda a: jax.lax.ppermute(a, "x", ring), mesh, P("x"), P("x")).lower(x).compile())
  assert c.bytes_by_kind["collective_permute"] == 512 * 1024
  f = _shard_map(lambda a: jax.lax.psum_scatter(a, "x", scatter_dimension=1, tiled=True), mesh, P("x"), P("x"))
  c = collectives(f.lower(x).compile())
  assert c.bytes_by_kind["reduce_scatter"] == 7 * (512 * 1024) // 8


def _fsdp_scan(devices, layers, d=256, f=512, b=64):
  """value_and_grad of a scanned stack, W [L, D, F] sharded (None, fsdp, tensor) on a 4x2 mesh."""
  mesh = Mesh(np.array(devices).reshape(4, 2), ("fsdp", "tensor"))
  ws = NamedSharding(mesh, P(None, "fsdp", "tensor"))
  xs = NamedSharding(mesh, P("fsdp", None))

  def loss(w, x):
    def body(x, wl):
      return jnp.tanh(x @ wl) @ wl.T, None

    return jax.lax.scan(body, x, w)[0].sum()

  step = jax.jit(jax.value_and_grad(loss), in_shardings=(ws, xs), out_shardings=(NamedSharding(mesh, P()), ws))
  with quiet():
    return step.lower(jax.ShapeDtypeStruct((layers, d, f), jnp.float32, sharding=ws),
                      jax.ShapeDtypeStruct((b, d), jnp.float32, sharding=xs)).compile()


# The only collective outside the scans is the loss's scalar psum over fsdp (g=4): 2*3/4*4 B.
_OUTSIDE_BYTES = {**dict.fromkeys(KINDS, 0), "all_reduce": 6}
_OUTSIDE_COUNT = {**dict.fromkeys(KINDS, 0), "all_reduce": 1}


def _loop_part(c):
  return c.total_bytes - sum(_OUTSIDE_BYTES.values())


def test_scan_layers_multiply_bytes_cpu():
  two, six = (collectives(_fsdp_scan(jax.devices()[:8], n)) for n in (2, 6))
  assert two.notes == six.notes == ()
  # Which collectives XLA:CPU picks for a layer is its choice, and it changed between releases
  # (jaxlib 0.10.2: 1,470,464 bytes per layer, with an all-to-all; 0.12.0.1: 1,507,328, with two
  # more all-gathers instead). What holds for any: the scan's body runs once per layer, so from
  # 2 to 6 layers the loop part triples, kind by kind, in bytes and in counts.
  assert _loop_part(six) == 3 * _loop_part(two) > 0
  for k in KINDS:
    assert six.bytes_by_kind[k] - _OUTSIDE_BYTES[k] == 3 * (two.bytes_by_kind[k] - _OUTSIDE_BYTES[k]), k
    assert six.count_by_kind[k] - _OUTSIDE_COUNT[k] == 3 * (two.count_by_kind[k] - _OUTSIDE_COUNT[k]), k
  assert six.count_by_kind["all_gather"] == 3 * two.count_by_kind["all_gather"] > 0
  # And FSDP's traffic has floors that follow from the shapes, per layer. W [256, 512] f32 is
  # sharded (fsdp=4, tensor=2): FSDP gathers each layer's [256, 256] tensor shard over fsdp
  # before using it, at least once, (g-1)/g of 256 KiB; its gradient, summed over the fsdp batch
  # shards, costs at least what a reduce-scatter of it does, the same 192 KiB (an all-reduce of
  # S sends 2(g-1)/g S, twice a reduce-scatter's, hence the half).
  per_layer = {k: (two.bytes_by_kind[k] - _OUTSIDE_BYTES[k]) // 2 for k in KINDS}
  w_shard = 3 * (256 * 256 * 4) // 4
  assert per_layer["all_gather"] >= w_shard, per_layer
  assert per_layer["reduce_scatter"] + per_layer["all_reduce"] / 2 >= w_shard, per_layer


def _mlp_grads(mesh, param_spec, batch_spec):
  def loss(params, x):
    h = jnp.tanh(x @ params["w1"])
    return jnp.mean((h @ params["w2"]) ** 2)

  psh = NamedSharding(mesh, param_spec)
  shapes = {"w1": jax.ShapeDtypeStruct((256, 512), jnp.float32, sharding=psh),
            "w2": jax.ShapeDtypeStruct((512, 256), jnp.float32, sharding=psh)}
  x = jax.ShapeDtypeStruct((64, 256), jnp.float32, sharding=NamedSharding(mesh, batch_spec))
  grads = jax.jit(jax.grad(loss), out_shardings={"w1": psh, "w2": psh})
  return collectives(grads.lower(shapes, x).compile())


def test_data_parallel_vs_fsdp():
  mesh = _mesh1d()
  dp = _mlp_grads(mesh, P(), P("x"))
  fsdp = _mlp_grads(mesh, P("x"), P("x"))
  # Data parallel: replicated parameters, gradients summed across the batch shards.
  assert dp.bytes_by_kind["all_reduce"] > 0
  assert dp.bytes_by_kind["all_gather"] == 0
  # FSDP: parameters gathered before use, gradients reduced back to shards.
  assert fsdp.bytes_by_kind["all_gather"] > 0
  assert fsdp.bytes_by_kind["reduce_scatter"] + fsdp.bytes_by_kind["all_reduce"] > 0


def _accelerator_scans(devices_fn):
  with quiet():
    devices = devices_fn()
  return [collectives(_fsdp_scan(devices, n)) for n in (2, 6)]


@pytest.mark.needs_tpu_compiler
def test_tpu_v5e_scan():
  from jaxmem.hardware.tpu import tpu_devices

  two, six = _accelerator_scans(lambda: tpu_devices("v5e", 8))
  # TPU leaves known_trip_count out: the count is derived from the loop's condition and body.
  assert two.notes == six.notes == ()
  assert two.total_bytes > 0 and two.bytes_by_kind["all_gather"] > 0
  assert two.bytes_by_kind["reduce_scatter"] > 0  # TPU's all-reduce-scatter fusion
  assert _loop_part(six) == 3 * _loop_part(two)


@pytest.mark.slow  # a TPU compile of an expert mesh under splash; tests/test_moe_wiring.py counts the all-to-alls on the CPU
@pytest.mark.needs_tpu_compiler
def test_tpu_expert_mesh_all_to_all_with_splash_attention(compile_one):
  # The smallest case that read 0 all-to-all bytes: splash's Pallas kernel in the layer scan,
  # printed over several lines, cut the loop body short; the loop counted once, without its
  # token exchange. The dispatch is the same whatever the attention: dot's loop has no kernel.
  work = dict(model="tiny-moe", target="tpu:v5p-16", mesh="expert=8,fsdp=1", batch=8, seq=128)
  splash, dot = (compile_one(remat="full", attention=a, **work) for a in ("auto", "dot"))
  assert splash.attention == "splash" and splash.error is None and dot.error is None
  assert not any("trip count" in n for n in splash.notes) and splash.comm_lower_bound is False
  assert splash.comm_all_to_all_bytes > 0
  assert splash.comm_all_to_all_bytes == pytest.approx(dot.comm_all_to_all_bytes, rel=0.01)


@pytest.mark.needs_gpu_compiler("h100")
def test_gpu_h100_scan():
  from jaxmem.hardware.gpu import gpu_devices

  two, six = _accelerator_scans(lambda: gpu_devices("h100", 8))
  assert two.notes == six.notes == ()
  assert two.total_bytes > 0 and two.bytes_by_kind["all_gather"] > 0
  assert _loop_part(six) == 3 * _loop_part(two)


# -- literal HLO ------------------------------------------------------------------------------

_HEAD = "HloModule m, num_partitions=8\n\n%add (a: f32[], b: f32[]) -> f32[] {\n  %a = f32[] parameter(0)\n" \
        "  %b = f32[] parameter(1)\n  ROOT %s = f32[] add(%a, %b)\n}\n\n"


def _one(instruction: str, head: str = _HEAD) -> dict:
  text = head + ("ENTRY %main (p: f32[64,256]) -> f32[256,256] {\n  %p = f32[64,256]{1,0} parameter(0)\n"
                 f"  ROOT {instruction}\n}}\n")
  return collectives_from_hlo(text).bytes_by_kind


_AG = "%ag = f32[256,256]{1,0} all-gather(%p), channel_id=1, replica_groups=RG, dimensions={0}, use_global_device_ids=true"
_FULL = 256 * 256 * 4


@pytest.mark.parametrize("groups, g", [
    ("{{0,1,2,3},{4,5,6,7}}", 4),
    ("{{0,1},{2,3},{4,5},{6,7}}", 2),
    ("[2,4]<=[8]", 4),
    ("[4,2]<=[2,4]T(1,0)", 2),
    ("[1,8]<=[8]", 8),
    ("mesh['axis_0'=4,'axis_1'=2] {'axis_0'}", 4),
    ("mesh['axis_0'=4,'axis_1'=1,'axis_2'=2] {'axis_0','axis_2'}", 8),
    ("mesh['axis_0'=8] {'axis_0':(2)4}", 4),
    ("{}", 8),  # everyone: num_partitions in flattened-id mode (replica_count 1)
])
def test_replica_group_syntaxes(groups, g):
  assert _one(_AG.replace("RG", groups))["all_gather"] == (g - 1) * _FULL // g


def test_channel_without_global_ids_takes_all_partitions():
  # Cross-replica-and-partition: groups list replicas (here 2 of them), each with its 8 partitions.
  head = _HEAD.replace("num_partitions=8", "replica_count=2, num_partitions=8")
  ar = "%ar = f32[256,256]{1,0} all-reduce(%p), channel_id=3, replica_groups={{0,1}}, to_apply=%add"
  assert _one(ar, head)["all_reduce"] == round(2 * 15 * _FULL / 16)
  # Without channel_id the groups are replicas alone.
  ar = "%ar = f32[256,256]{1,0} all-reduce(%p), replica_groups={{0,1}}, to_apply=%add"
  assert _one(ar, head)["all_reduce"] == _FULL


def test_kinds_dtypes_and_tuples():
  rs = "%rs = bf16[16,256]{1,0} reduce-scatter(%p), channel_id=1, replica_groups=[2,4]<=[8], use_global_device_ids=true, dimensions={0}, to_apply=%add"
  assert _one(rs)["reduce_scatter"] == 3 * 16 * 256 * 2  # (g-1)/g of the 4x larger input
  ar = ("%ar = (f32[256,256]{1,0}, bf16[256]{0}, pred[8]{0}) all-reduce(%p, %p, %p), channel_id=1, "
        "replica_groups=[4,2]<=[8], use_global_device_ids=true, to_apply=%add")
  assert _one(ar)["all_reduce"] == (_FULL + 512 + 8)  # 2(g-1)/g = 1 for g=2
  a2a = "%a = f8e4m3fn[8,128]{1,0} all-to-all(%p), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}"
  assert _one(a2a)["all_to_all"] == 7 * 1024 // 8
  cp = "%c = f32[64,256]{1,0} collective-permute(%p), channel_id=1, source_target_pairs={{0,1},{1,2},{2,0},{3,3}}"
  assert _one(cp)["collective_permute"] == 64 * 256 * 4


_ASYNC = """HloModule m, num_partitions=8

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%wrapped_rs (x: f32[256,256]) -> f32[64,256] {
  %x = f32[256,256]{1,0} parameter(0)
  ROOT %rs = f32[64,256]{1,0} reduce-scatter(%x), channel_id=7, replica_groups=[2,4]<=[4,2]T(1,0), use_global_device_ids=true, dimensions={0}, to_apply=%add
}

ENTRY %main (p: f32[64,256], q: f32[256,256]) -> f32[64,256] {
  %p = f32[64,256]{1,0} parameter(0)
  %q = f32[256,256]{1,0} parameter(1)
  %ags = ((f32[64,256]{1,0}, f32[64,256]{1,0}), (f32[256,256]{1,0}, f32[256,256]{1,0})) all-gather-start(%p, %p), channel_id=1, replica_groups=[2,4]<=[4,2]T(1,0), dimensions={0}, use_global_device_ids=true
  %agd = (f32[256,256]{1,0}, f32[256,256]{1,0}) all-gather-done(%ags)
  %ars = f32[64,256]{1,0} all-reduce-start(%p), channel_id=2, replica_groups=[4,2]<=[8], use_global_device_ids=true, to_apply=%add
  %ard = f32[64,256]{1,0} all-reduce-done(%ars)
  %cps = (f32[64,256]{1,0}, f32[64,256]{1,0}, u32[], u32[]) collective-permute-start(%p), channel_id=3, source_target_pairs={{0,1},{1,0}}
  %cpd = f32[64,256]{1,0} collective-permute-done(%cps)
  %a2s = ((f32[64,256]{1,0}), f32[64,256]{1,0}) all-to-all-start(%p), channel_id=4, replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_0'}, dimensions={0}
  %a2d = f32[64,256]{1,0} all-to-all-done(%a2s)
  %rss = ((f32[256,256]{1,0}), f32[64,256]{1,0}, s32[]) async-start(%q), calls=%wrapped_rs
  %rsu = ((f32[256,256]{1,0}), f32[64,256]{1,0}, s32[]) async-update(%rss), calls=%wrapped_rs
  ROOT %rsd = f32[64,256]{1,0} async-done(%rsu), calls=%wrapped_rs
}
"""


def test_async_pairs_count_once():
  c = collectives_from_hlo(_ASYNC)
  s = 64 * 256 * 4
  assert c.count_by_kind == dict.fromkeys(KINDS, 1)
  assert c.bytes_by_kind == {
      "all_gather": 3 * 2 * _FULL // 4,
      "reduce_scatter": 3 * _FULL // 4,
      "all_reduce": s,  # g=2
      "all_to_all": 3 * s // 4,
      "collective_permute": s,
  }


_LOOP = """HloModule m, num_partitions=8

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%body (t: (s32[], f32[64])) -> (s32[], f32[64]) {
  %t = (s32[]{:T(128)}, f32[64]{0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %ci = s32[] copy(%i)
  %one = s32[] constant(1)
  %next = s32[] add(%ci, %one)
  %v = f32[64]{0} get-tuple-element(%t), index=1
  %ar = f32[64]{0} all-reduce(%v), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=%add
  ROOT %r = (s32[], f32[64]{0}) tuple(%next, %ar)
}

%cond (t: (s32[], f32[64])) -> pred[] {
  %t = (s32[], f32[64]{0}) parameter(0)
  %lim = s32[] constant(LIMIT)
  %i = s32[] get-tuple-element(%t), index=0
  ROOT %lt = pred[] compare(%i, %lim), direction=LT
}

ENTRY %main (p: f32[64]) -> (s32[], f32[64]) {
  %p = f32[64]{0} parameter(0)
  %zero = s32[] constant(INIT)
  %z = s32[] copy(%zero)
  %init = (s32[], f32[64]{0}) tuple(%z, %p)
  ROOT %w = (s32[], f32[64]{0}) while(%init), condition=%cond, body=%body, metadata={op_name="x/while/body"}BACKEND
}
"""
_AR64 = 2 * 7 * 256 // 8


def _loop(limit=12, init=0, backend=""):
  return collectives_from_hlo(_LOOP.replace("LIMIT", str(limit)).replace("INIT", str(init)).replace("BACKEND", backend))


def test_loop_trip_count_known_and_derived():
  known = _loop(backend=', backend_config={"known_induction_variable":{"tuple_index":"0"},"known_trip_count":{"n":"5"}}')
  assert known.bytes_by_kind["all_reduce"] == 5 * _AR64 and known.count_by_kind["all_reduce"] == 5
  derived = _loop(limit=12, init=2)  # TPU's form: no known_trip_count, count from cond and body
  assert derived.count_by_kind["all_reduce"] == 10 and derived.notes == ()


def test_loop_trip_count_derived_from_elided_tuple_reads(elide_get_tuple_elements):
  # jaxlib 0.12.0.1's dumps (not compiled.as_text()) print no get-tuple-element: the condition
  # compares %t#0 with the limit and the body adds to %t#0 in place.
  text = elide_get_tuple_elements(_LOOP.replace("LIMIT", "12").replace("INIT", "2").replace("BACKEND", ""))
  assert "get-tuple-element" not in text and "compare(%t#0, %lim)" in text
  c = collectives_from_hlo(text)
  assert c.count_by_kind["all_reduce"] == 10 and c.notes == ()
  assert c.bytes_by_kind["all_reduce"] == 10 * _AR64


def test_loop_without_trip_count_counts_once_as_a_lower_bound():
  text = _LOOP.replace("LIMIT", "12").replace("BACKEND", "").replace("%zero = s32[] constant(INIT)",
                                                                      "%zero = s32[] parameter(1)")
  c = collectives_from_hlo(text)
  assert c.count_by_kind["all_reduce"] == 1
  assert c.lower_bound is True
  assert any("trip count" in n and "lower bound" in n for n in c.notes)
  # A loop with nothing to multiply leaves the figures exact, whatever its trip count.
  quiet_loop = text.replace("%ar = f32[64]{0} all-reduce(%v), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, "
                            "use_global_device_ids=true, to_apply=%add", "%ar = f32[64]{0} negate(%v)")
  q = collectives_from_hlo(quiet_loop)
  assert q.total_bytes == 0 and q.lower_bound is False and q.notes == ()


# libtpu prints a Pallas kernel's (splash attention's) frontend_attributes with the newlines of
# its JSON metadata; the third line starts with "}}", where a line-by-line reader ended the body.
_KERNEL = """  %k = (f32[64]{0}, f32[64]{0}) custom-call(%v), custom_call_target="tpu_custom_call", frontend_attributes={kernel_metadata={
"xprof_metadata":"{\\"block_q\\": 512, \\"block_kv\\": 512}"
}}, metadata={op_name="jit(train_step)/while/body/shard_map/pallas_call" stack_frame_id=216}, backend_config={"custom_call_config":{"body":"TUzvUg=="}}
"""


def test_loop_body_with_a_multiline_kernel_instruction_keeps_its_counter_and_collectives():
  text = _LOOP.replace("LIMIT", "12").replace("INIT", "2").replace("BACKEND", "")
  text = text.replace("  %ar = f32[64]{0} all-reduce", _KERNEL + "  %ar = f32[64]{0} all-reduce")
  assert "\n}}, metadata=" in text
  c = collectives_from_hlo(text)
  assert c.count_by_kind["all_reduce"] == 10 and c.bytes_by_kind["all_reduce"] == 10 * _AR64
  assert c.notes == () and c.lower_bound is False
  body = parse_module(text).computations["body"]
  assert body.root == "r" and body.instructions["k"].op_name.endswith("/pallas_call")
  # A bracket left open on one line never takes in the next instruction or the closing brace.
  broken = parse_module(text.replace(_KERNEL, '  %k = f32[64]{0} custom-call(%v), custom_call_target="x", attr={\n'))
  assert broken.computations["body"].root == "r" and "ar" in broken.computations["body"].instructions


def test_tpu_async_collective_fusions_and_reduce_scatter_fusion():
  # The TPU compiler repeats one async all-gather (one channel id) in its start, overlap and
  # done fusions, the overlap ones possibly inside a loop the collective spans; it writes a
  # reduce-scatter as an all-reduce inside an all-reduce-scatter fusion.
  text = """HloModule m, num_partitions=8

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%start (p0: bf16[64,256]) -> (bf16[64,256], bf16[256,256]) {
  %p0 = bf16[64,256]{1,0:T(8,128)(2,1)} parameter(0)
  %ag1 = bf16[256,256]{1,0:T(8,128)(2,1)} all-gather(%p0), channel_id=15, replica_groups=[2,4]<=[4,2]T(1,0), dimensions={0}, use_global_device_ids=true
  ROOT %cc = (bf16[64,256]{1,0}, bf16[256,256]{1,0}) custom-call(%ag1), custom_call_target="AsyncCollectiveStart"
}

%done (p0: bf16[64,256], p1: bf16[256,256]) -> bf16[256,256] {
  %p0 = bf16[64,256]{1,0} parameter(0)
  %p1 = bf16[256,256]{1,0} parameter(1)
  %ag2 = bf16[256,256]{1,0} all-gather(%p0), channel_id=15, replica_groups=[2,4]<=[4,2]T(1,0), dimensions={0}, use_global_device_ids=true
  ROOT %cc = bf16[256,256]{1,0} custom-call(%p0, %p1, %ag2), custom_call_target="AsyncCollectiveDone"
}

%overlap (p0: bf16[64,256]) -> bf16[256,256] {
  %p0 = bf16[64,256]{1,0} parameter(0)
  ROOT %ag3 = bf16[256,256]{1,0} all-gather(%p0), channel_id=15, replica_groups=[2,4]<=[4,2]T(1,0), dimensions={0}, use_global_device_ids=true
}

%body (t: (s32[], bf16[64,256])) -> (s32[], bf16[64,256]) {
  %t = (s32[], bf16[64,256]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  %x = bf16[64,256]{1,0} get-tuple-element(%t), index=1
  %o = bf16[256,256]{1,0} fusion(%x), kind=kCustom, calls=%overlap
  ROOT %r = (s32[], bf16[64,256]{1,0}) tuple(%next, %x)
}

%cond (t: (s32[], bf16[64,256])) -> pred[] {
  %t = (s32[], bf16[64,256]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %n = s32[] constant(12)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%all-reduce-scatter.clone.1 (input.2: f32[256,256]) -> f32[64,256] {
  %input.2 = f32[256,256]{1,0:T(8,128)} parameter(0)
  %ar = f32[256,256]{1,0:T(8,128)} all-reduce(%input.2), channel_id=16, replica_groups={{0,2,4,6},{1,3,5,7}}, use_global_device_ids=true, to_apply=%add
  %c0 = s32[] constant(0)
  ROOT %ds = f32[64,256]{1,0} dynamic-slice(%ar, %c0, %c0), dynamic_slice_sizes={64,256}
}

ENTRY %main (p: bf16[64,256], q: f32[256,256]) -> bf16[256,256] {
  %p = bf16[64,256]{1,0} parameter(0)
  %q = f32[256,256]{1,0} parameter(1)
  %rs = f32[64,256]{1,0:T(8,128)S(1)} fusion(%q), kind=kCustom, calls=%all-reduce-scatter.clone.1
  %s = (bf16[64,256]{1,0}, bf16[256,256]{1,0}) fusion(%p), kind=kCustom, calls=%start
  %g0 = bf16[64,256]{1,0} get-tuple-element(%s), index=0
  %g1 = bf16[256,256]{1,0} get-tuple-element(%s), index=1
  %zero = s32[] constant(0)
  %init = (s32[], bf16[64,256]{1,0}) tuple(%zero, %g0)
  %w = (s32[], bf16[64,256]{1,0}) while(%init), condition=%cond, body=%body
  ROOT %d = bf16[256,256]{1,0} fusion(%g0, %g1), kind=kCustom, calls=%done
}
"""
  c = collectives_from_hlo(text)
  assert c.count_by_kind == {**dict.fromkeys(KINDS, 0), "all_gather": 1, "reduce_scatter": 1}
  assert c.bytes_by_kind["all_gather"] == 3 * 256 * 256 * 2 // 4
  assert c.bytes_by_kind["reduce_scatter"] == 3 * _FULL // 4


def test_conditional_counts_largest_branch_and_call_counts_once():
  text = """HloModule m, num_partitions=8

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%small (x: f32[64]) -> f32[64] {
  %x = f32[64]{0} parameter(0)
  ROOT %ar = f32[64]{0} all-reduce(%x), channel_id=1, replica_groups=[4,2]<=[8], use_global_device_ids=true, to_apply=%add
}

%big (x: f32[64]) -> f32[64] {
  %x = f32[64]{0} parameter(0)
  ROOT %ar = f32[64]{0} all-reduce(%x), channel_id=2, replica_groups=[1,8]<=[8], use_global_device_ids=true, to_apply=%add
}

%callee (x: f32[64]) -> f32[64] {
  %x = f32[64]{0} parameter(0)
  ROOT %ag = f32[64]{0} all-gather(%x), channel_id=3, replica_groups=[1,8]<=[8], dimensions={0}, use_global_device_ids=true
}

ENTRY %main (i: s32[], p: f32[64]) -> f32[64] {
  %i = s32[] parameter(0)
  %p = f32[64]{0} parameter(1)
  %c = f32[64]{0} conditional(%i, %p, %p), branch_computations={%small, %big}
  ROOT %k = f32[64]{0} call(%c), to_apply=%callee
}
"""
  c = collectives_from_hlo(text)
  assert c.bytes_by_kind["all_reduce"] == 2 * 7 * 256 // 8
  assert c.bytes_by_kind["all_gather"] == 7 * 256 // 8
  assert any("conditional" in n for n in c.notes)
