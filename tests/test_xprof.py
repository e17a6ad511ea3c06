"""XProf's Memory Viewer for a compile that never ran: the dump, the logdir, the real server."""

import os
import re
import sys

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from jaxmem.hardware.gpu import gpu_compiler_available
from jaxmem.hardware.tpu import tpu_compiler_available
from jaxmem.buffers import xprof
from jaxmem.errors import JaxmemError
from jaxmem.hlo.dump import DumpFormatError, read_dump
from jaxmem.hardware.targets import get_target
from xprof_server import XprofServer  # tests/xprof_server.py

GPU_OK, GPU_WHY = gpu_compiler_available("h100")
TPU_OK, TPU_WHY = tpu_compiler_available()
XPROF_OK, XPROF_WHY = xprof.xprof_available()
MIB = 1 << 20


def _sgd_step(w, x):
  """A two-layer train step: gradients, an update, the parameters donated as in jaxmem's step."""

  def loss(w):
    return jnp.sum(jnp.tanh(x @ w["a"]) @ w["b"])

  g = jax.grad(loss)(w)
  return jax.tree.map(lambda p, d: p - 0.1 * d, w, g)


def _compile(target: str, dump_dir: str):
  t = get_target(target)
  replicated = NamedSharding(t.make_mesh((("d", t.num_devices),)), PartitionSpec())
  f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32, sharding=replicated)  # noqa: E731
  w, x = {"a": f32(256, 512), "b": f32(512, 256)}, f32(128, 256)
  lowered = jax.jit(_sgd_step, donate_argnums=0).lower(w, x)
  # explain's text dump and the proto dump in one compile.
  return lowered.compile({"xla_dump_to": dump_dir, "xla_dump_hlo_as_text": True, **xprof.DUMP_AS_PROTO})


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
  if not GPU_OK:
    pytest.skip(f"GPU compiler unavailable: {GPU_WHY}")
  d = str(tmp_path_factory.mktemp("gpu-dump"))
  compiled = _compile("gpu:h100", d)
  return compiled, xprof.read_optimized_hlo(d), d


_BACKENDS = [
    pytest.param("cpu", "cpu_after_optimizations.hlo.pb", id="cpu"),
    pytest.param(
        "gpu:h100", "sm_9.0a_gpu_after_optimizations.hlo.pb", id="gpu",
        marks=pytest.mark.skipif(not GPU_OK, reason=f"GPU compiler unavailable: {GPU_WHY}"),
    ),
    pytest.param(
        "tpu:v5e-1", "after_optimizations.hlo.pb", id="tpu",
        marks=pytest.mark.skipif(not TPU_OK, reason=f"TPU compiler unavailable: {TPU_WHY}"),
    ),
]


@pytest.mark.parametrize("target,suffix", _BACKENDS)
def test_the_optimized_module_is_found_beside_the_text_dump(target, suffix, tmp_path):
  _compile(target, str(tmp_path))
  hlo = xprof.read_optimized_hlo(str(tmp_path))
  assert hlo.file.endswith(f".jit__sgd_step.{suffix}") or re.search(rf"\.jit__sgd_step\.cl_\d+\.{suffix}$", hlo.file)
  assert hlo.module_name == "jit__sgd_step"
  # The program id is the module's id, the number XLA puts in the dump's file names.
  assert hlo.program_id == int(re.match(r"module_(\d+)\.", hlo.file).group(1))
  assert hlo.xprof_module == f"jit__sgd_step({hlo.program_id})"
  # Other HloProto files of the same module hold no buffer assignment and are passed over.
  others = [n for n in os.listdir(tmp_path) if n.endswith(".hlo.pb") and n != hlo.file]
  assert others, os.listdir(tmp_path)
  # The text dump explain reads is still whole with the proto dump on.
  dump = read_dump(str(tmp_path))
  assert dump.allocations and dump.live.sequence


def test_written_logdir_parses_back_to_the_module(gpu, tmp_path):
  _, hlo, _ = gpu
  path = xprof.write_logdir(hlo.hlo_proto, hlo.module_name, str(tmp_path), run="r1", host="h")
  assert path == os.path.join(str(tmp_path), "plugins", "profile", "r1", "h.xplane.pb")
  with open(path, "rb") as f:
    data = f.read()
  space = xprof.xplane_messages().XSpace.FromString(data)
  assert [p.name for p in space.planes] == [xprof.METADATA_PLANE] and list(space.hostnames) == ["h"]
  plane = space.planes[0]
  stat_names = {m.id: m.name for m in plane.stat_metadata.values()}
  assert sorted(stat_names.values()) == sorted([xprof.HLO_PROTO_STAT, xprof.PROGRAM_ID_STAT])
  (event,) = plane.event_metadata.values()
  assert event.name == hlo.xprof_module
  stats = {stat_names[s.metadata_id]: s for s in event.stats}
  assert stats[xprof.HLO_PROTO_STAT].bytes_value == hlo.hlo_proto
  assert stats[xprof.PROGRAM_ID_STAT].uint64_value == hlo.program_id
  # jaxlib's own XSpace reader (C++, not this module's schema) takes the file too.
  assert [p.name for p in jax.profiler.ProfileData.from_serialized_xspace(data).planes] == [xprof.METADATA_PLANE]


def test_writer_records_a_module_as_jaxs_profiler_does(tmp_path):
  """What jax.profiler.trace writes for a jitted call on CPU, read with this module's schema:
  the stat names and the module naming the writer copies, so they cannot drift apart unseen."""
  x = jnp.ones((64, 64))
  with jax.profiler.trace(str(tmp_path)):
    jax.jit(lambda a: jnp.tanh(a @ a))(x).block_until_ready()
  (path,) = [os.path.join(r, n) for r, _, ns in os.walk(tmp_path) for n in ns if n.endswith(".xplane.pb")]
  assert os.path.dirname(os.path.dirname(path)) == os.path.join(str(tmp_path), "plugins", "profile")
  with open(path, "rb") as f:
    space = xprof.xplane_messages().XSpace.FromString(f.read())
  (plane,) = [p for p in space.planes if p.name == xprof.METADATA_PLANE]
  by_name = {m.name: m.id for m in plane.stat_metadata.values()}
  hlo_stat, pid_stat = by_name[xprof.HLO_PROTO_STAT], by_name[xprof.PROGRAM_ID_STAT]
  modules = []
  for event in plane.event_metadata.values():
    stats = {s.metadata_id: s for s in event.stats}
    proto = xprof.xplane_messages().HloProto.FromString(stats[hlo_stat].bytes_value)
    # The profiler's program id is the module's id or a fingerprint of the executable; either
    # way the module is named by it.
    assert event.name == xprof.xprof_module_name(proto.hlo_module.name, stats[pid_stat].uint64_value)
    assert proto.buffer_assignment
    modules.append(proto.hlo_module.name)
  assert "jit__lambda" in modules


def test_default_runs_do_not_overwrite_each_other(gpu, tmp_path):
  _, hlo, _ = gpu
  a = xprof.write_logdir(hlo.hlo_proto, hlo.module_name, str(tmp_path))
  b = xprof.write_logdir(hlo.hlo_proto, hlo.module_name, str(tmp_path))
  assert a != b and os.path.exists(a) and os.path.exists(b)
  assert re.fullmatch(r"\d{4}(_\d\d){5}", os.path.basename(os.path.dirname(a)))


def test_bad_input_is_a_one_line_error(gpu, tmp_path):
  _, hlo, dump_dir = gpu
  before = [n for n in os.listdir(dump_dir) if n.endswith("before_optimizations.hlo.pb")][0]
  with open(os.path.join(dump_dir, before), "rb") as f:
    unoptimized = f.read()
  cases = [
      (lambda: xprof.write_logdir(unoptimized, hlo.module_name, str(tmp_path)), "no buffer assignment"),
      (lambda: xprof.write_logdir(hlo.hlo_proto, "jit_other", str(tmp_path)), "jit__sgd_step"),
      (lambda: xprof.write_logdir(hlo.hlo_proto, hlo.module_name, str(tmp_path), run="a/b"), "one path component"),
      (lambda: xprof.write_logdir(hlo.hlo_proto, hlo.module_name, str(tmp_path), host=".."), "one path component"),
      (lambda: xprof.write_logdir(b"\xff\xff\xff", hlo.module_name, str(tmp_path)), "HloProto"),
  ]
  for call, words in cases:
    with pytest.raises(JaxmemError) as e:
      call()
    assert words in str(e.value) and "\n" not in str(e.value)
  assert not os.path.exists(os.path.join(str(tmp_path), "plugins"))  # nothing half-written
  xprof.write_logdir(hlo.hlo_proto, hlo.module_name, str(tmp_path), run="r")
  with pytest.raises(JaxmemError, match="already exists"):  # XProf would show the first compile
    xprof.write_logdir(hlo.hlo_proto, hlo.module_name, str(tmp_path), run="r", host="other")
  with pytest.raises(DumpFormatError, match="xla_dump_hlo_as_proto"):
    xprof.read_optimized_hlo(str(tmp_path / "plugins"))
  with pytest.raises(DumpFormatError, match="jit_other"):
    xprof.read_optimized_hlo(dump_dir, module_name="jit_other")


def test_without_protobuf_the_error_says_what_to_install(monkeypatch):
  xprof._messages.cache_clear()
  monkeypatch.setitem(sys.modules, "google.protobuf", None)
  try:
    with pytest.raises(JaxmemError, match=re.escape("pip install 'jaxmem[xprof]'")):
      xprof.xplane_messages()
  finally:
    monkeypatch.undo()
    xprof._messages.cache_clear()


@pytest.mark.skipif(not XPROF_OK, reason=XPROF_WHY)
@pytest.mark.needs_gpu_compiler("h100")
def test_xprof_memory_viewer_reports_the_compilers_peak(tmp_path):
  """The real xprof server, on a loopback port, serving what ``jaxmem.explain(...).to_xprof``
  wrote: its Memory Viewer's peak for device memory is XLA:GPU's peak_memory_in_bytes to the
  byte (both are the peak of the buffer assignment's heap simulation, arguments and outputs
  included), and explain's own peak."""
  import jaxmem

  f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)  # noqa: E731
  r = jaxmem.explain(_sgd_step, {"a": f32(256, 512), "b": f32(512, 256)}, f32(128, 256), target="gpu:h100", donate_argnums=0)
  r.to_xprof(str(tmp_path), run="gpu")
  with XprofServer(str(tmp_path)) as server:
    data = server.memory_viewer("gpu", "jaxmem", r.optimized_hlo.xprof_module, memory_space=0)
    pid = server.process.pid
  assert data["moduleName"] == r.optimized_hlo.module_name == "jit__sgd_step"
  # MiB as a double: exact for any byte count below 2**53.
  assert data["peakHeapMib"] * MIB == r.report.peak_memory_in_bytes == r.peak_bytes
  # The buffers it lists at the peak add up to the peak, as explain's live set does.
  assert sum(b["logicalBufferSizeMib"] for b in data["maxHeap"]) * MIB == pytest.approx(r.peak_bytes, rel=1e-9)
  assert r.live_bytes_at_peak == pytest.approx(r.peak_bytes, rel=1e-3)
  with pytest.raises(ProcessLookupError):  # stopped by its process id
    os.kill(pid, 0)
