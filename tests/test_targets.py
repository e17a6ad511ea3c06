"""TPU and GPU targets through their real compilers, without the hardware; meshes; fit and OOM."""

import dataclasses

import pytest

from jaxmem.cli import main
from jaxmem.hardware.availability import CompilerAvailability
from jaxmem.hardware.gpu import GPU_SPECS, gpu_compiler_available
from jaxmem.hardware.tpu import tpu_compiler_available
from jaxmem.hardware import targets as tg
from jaxmem.errors import JaxmemError
from jaxmem.models import get_config
from jaxmem.planning import sweep
from jaxmem.resolve import plan

needs_tpu = pytest.mark.needs_tpu_compiler
needs_gpu = pytest.mark.needs_gpu_compiler("h100")

# Small, but with dimensions of whole TPU tiles (multiples of 128), so layout padding of tiny
# arrays does not blur the ratios.
TILED = get_config("tiny", d_model=256, d_ff=512, num_heads=4, num_kv_heads=2, head_dim=64, vocab_size=1024)
TINY = dict(model=TILED, batch=8, seq=128, optimizer="adamw")


@pytest.mark.parametrize(
    "name,devices,platform",
    [
        ("cpu", 1, "cpu"),
        ("cpu:4", 4, "cpu"),
        ("tpu:v5e-8", 8, "tpu"),
        ("tpu:v5p-8", 4, "tpu"),  # v5p names count TensorCores: 4 chips
        ("tpu:v4-16", 8, "tpu"),
        ("tpu:v6e-256", 256, "tpu"),
        ("gpu:h100", 1, "gpu"),
        ("gpu:a100-80gbx8", 8, "gpu"),
        ("gpu:a100-40gb", 1, "gpu"),
        ("gpu:a800", 1, "gpu"),
        ("gpu:a800x8", 8, "gpu"),  # MEMO's 8 A800s
        ("gpu:h100x16", 16, "gpu"),
    ],
)
def test_target_names(name, devices, platform):
  t = tg.get_target(name)
  assert (t.num_devices, t.platform) == (devices, platform)


def test_a800_is_the_a100_80gb_with_its_own_nvlink():
  a100, a800 = GPU_SPECS["a100-80gb"], GPU_SPECS["a800"]
  assert a800.description == "NVIDIA A800-SXM4-80GB"
  assert (a100.nvlink_bandwidth, a800.nvlink_bandwidth) == (600e9, 400e9)
  # The host differs too: an A2 Ultra VM carries A100s; no published machine carries A800s, so
  # neither its host nor its scale-out network is catalogued.
  assert a800.network_bandwidth is None and a100.network_bandwidth is not None
  same = lambda s: dataclasses.replace(s, name="", description="", nvlink_bandwidth=0, host=None,  # noqa: E731
                                       network_bandwidth=None)
  assert same(a800) == same(a100)  # memory, compute and the compiler's target description
  assert tg.get_target("gpu:a800x8").capacity_bytes == tg.get_target("gpu:a100-80gbx8").capacity_bytes
  listed = {r.target: r for r in tg.list_targets() if r.platform == "gpu"}
  assert (listed["gpu:a800x8"].nvlink_gb_s, listed["gpu:a100-80gbx8"].nvlink_gb_s) == (400, 600)


@pytest.mark.slow  # a deviceless GPU compile; the A800's description is the A100's (above), whose compile has tests
@pytest.mark.needs_gpu_compiler("a800")
def test_a800_compiles_deviceless_as_sm_80():
  (row,) = sweep.compare(**TINY, target="gpu:a800", remat="none", attention="dot")  # one GPU compile
  assert row.error is None and row.target == "gpu:a800"
  assert row.peak_memory_in_bytes is not None and row.fits is True


def test_gpu_hosts_of_eight():
  t = tg.get_target("gpu:h100x16")
  assert (t.hosts, t.kind.per_host) == (2, 8)


@pytest.mark.parametrize(
    "name,match",
    [
        ("tpu:v9-8", "unknown TPU generation"),
        ("tpu:v5e-3", "valid sizes"),
        ("gpu:rtx9090", "unknown GPU"),
        ("gpu:h100x12", "multiple of 8"),
        ("quantum", "unknown target"),
    ],
)
def test_bad_target_names(name, match):
  with pytest.raises(JaxmemError, match=match):
    tg.get_target(name)


@pytest.mark.parametrize(
    "name,canonical",
    [
        ("tpu7x-4x4x4", "tpu:v7x-128"),  # tpu-recipes' slice: 64 chips, two devices a chip
        ("tpu7x-128", "tpu:v7x-128"),  # MaxText's compile_topology
        ("tpu:tpu7x-4x4x4", "tpu:v7x-128"),
        ("TPU7X-4x4x8", "tpu:v7x-256"),
        ("v5p-1024", "tpu:v5p-1024"),  # the v5p recipes' accelerator type
        ("v5p-8x8x8", "tpu:v5p-1024"),
        ("v6e-16x16", "tpu:v6e-256"),
        ("v5litepod-2x4", "tpu:v5e-8"),
    ],
)
def test_recipe_slice_names_are_the_same_targets(name, canonical):
  """A slice named the way the recipes name it (the accelerator type without ``tpu:``, or its
  chip grid) is the target of that accelerator type: the same name, devices and machine."""
  t, same = tg.get_target(name), tg.get_target(canonical)
  assert (t.name, t.num_devices, t.kind) == (same.name, same.num_devices, same.kind)


def test_tpu7x_grid_is_two_devices_a_chip():
  t = tg.get_target("tpu7x-4x4x4")
  assert t.num_devices == 2 * 4 * 4 * 4


@pytest.mark.parametrize(
    "name,match",
    [
        ("tpu7x-4x4x3", r"no v7x slice of chip grid 4x4x3; valid grids: .*4x4x4 \(v7x-128\)"),
        ("tpu7x-4x4", "no v7x slice of chip grid 4x4;"),  # a 3-D generation's grid has three sides
        ("v5e-4x4x4", "no v5e slice of chip grid 4x4x4;"),
        ("tpu7x-7", "no v7x-7 slice; valid sizes"),
        ("tpu:v9-4x4x4", "unknown TPU generation 'v9'"),
        ("v9-4x4x4", "unknown target 'v9-4x4x4'; valid forms: .*GEN-AxBxC"),  # no tpu: and no TPU generation
        ("h100-8", "unknown target"),
        ("tpu7x-4x4x4x4", "unknown target"),
        ("tpu7x-", "unknown target"),
    ],
)
def test_bad_recipe_slice_names_are_one_line(name, match):
  with pytest.raises(JaxmemError, match=match) as e:
    tg.get_target(name)
  assert "\n" not in str(e.value)


def test_slices_on_a_recipe_slice_name():
  assert tg.get_target("tpu7x-4x4x4", slices=2).num_devices == 256


def test_slices_only_for_tpu():
  with pytest.raises(JaxmemError, match="TPU targets only"):
    tg.get_target("gpu:h100", slices=2)


@pytest.fixture(scope="module")
def tpu_meshes():  # compiled only where the slow tests below run
  """One sweep on a v5e-4 slice shared by the mesh tests: data, FSDP and data x tensor."""
  rows = sweep.compare(**TINY, target="tpu:v5e-4", remat="none", mesh=["data=4", "fsdp=4", "data=2,tensor=2"])
  return {r.mesh: r for r in rows}


# Slow: three TPU compiles. The same relations on the host CPU compiler are test_compare's FSDP and
# tensor-parallel tests, and TPU programs over data, FSDP and tensor axes compile in the fast
# suite through test_attention's splash case.
@pytest.mark.slow
@needs_tpu
def test_tpu_fsdp_divides_state_and_data_parallel_does_not(tpu_meshes):
  dp, fsdp = tpu_meshes["data=4"], tpu_meshes["fsdp=4"]
  assert dp.error is None and fsdp.error is None
  assert dp.param_bytes == dp.param_bytes_global  # replicated: every device holds all
  assert fsdp.param_bytes < dp.param_bytes / 3
  assert fsdp.optimizer_state_bytes < dp.optimizer_state_bytes / 3
  # The compiler agrees: argument bytes per device fall by about the mesh size.
  assert fsdp.argument_size_in_bytes < dp.argument_size_in_bytes / 3
  assert fsdp.capacity_bytes and fsdp.fits is True and fsdp.peak_memory_in_bytes is not None
  assert dp.peak_memory_in_bytes <= dp.capacity_bytes  # what "fits" means


@pytest.mark.slow  # shares the TPU compiles above
@needs_tpu
def test_tensor_parallel_on_tpu_shards_weights(tpu_meshes):
  assert tpu_meshes["data=2,tensor=2"].error is None
  assert tpu_meshes["data=2,tensor=2"].param_bytes < 0.7 * tpu_meshes["data=4"].param_bytes


@pytest.mark.slow  # a deviceless GPU compile; tests/test_attention.py compiles for an H100
@needs_gpu
def test_gpu_target_compiles_and_fits():
  rows = sweep.compare(**TINY, target="gpu:h100x2", remat="none", mesh="fsdp=2")  # one GPU compile
  assert len(rows) == 1
  for r in rows:
    assert r.error is None
    assert r.peak_memory_in_bytes is not None and r.fits is True
    assert r.capacity_bytes < 80 * 2**30


@needs_tpu
def test_out_of_memory_is_a_row_not_a_crash():
  # An 8B model's AdamW state alone is ~96 GB: far beyond one v5e chip's 16 GiB, which the
  # arguments' shapes show before any compile (jaxmem.compiler.figures).
  rows = sweep.compare(model="llama3-8b", batch=1, seq=128, target="tpu:v5e-1", remat="full", optimizer="adamw")
  assert len(rows) == 2
  for r in rows:
    assert r.fits is False
    assert r.error and r.error.startswith("not compiled: the arguments alone need")
    assert r.required_bytes > r.capacity_bytes and r.compile_seconds is None
  # Arguments that fit and temporaries that do not: the compiler's own refusal, as a row.
  (r,) = sweep.compare(model="tiny", batch=16384, seq=1024, target="tpu:v5e-1", remat="none")
  assert r.fits is False and r.error and "RESOURCE_EXHAUSTED" in r.error
  assert r.required_bytes is None or r.required_bytes > r.capacity_bytes


@needs_tpu
def test_cli_out_of_memory_exits_zero(capsys):
  argv = ["compare", "--model", "llama3-8b", "--batch", "1", "--seq", "128", "--target", "tpu:v5e-1", "--remat", "full", "--format", "json"]
  assert main(argv) == 0
  assert '"fits": false' in capsys.readouterr().out


@needs_tpu
@pytest.mark.parametrize(
    "argv,match",
    [
        (["--target", "tpu:v5e-8", "--mesh", "data=4"], "has 4 devices but target tpu:v5e-8 has 8"),
        (["--target", "tpu:v5e-4", "--mesh", "fsdp=4", "--batch", "2"], "not divisible"),
        (["--target", "tpu:v5e-4", "--mesh", "tensor=4"], "kv_heads"),  # tiny has 2 kv heads
    ],
)
def test_bad_meshes_on_accelerators(argv, match, capsys):
  assert main(["compare", "--model", "tiny", "--batch", "8", "--seq", "16", *argv]) == 2
  err = capsys.readouterr().err
  assert match in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@needs_tpu
def test_a_tensor_axis_that_divides_the_heads_is_accepted():
  # tiny-gpt2 has 4 heads and 4 kv heads: tensor=4 splits them (checked before compiling).
  p = plan(model="tiny-gpt2", batch=8, seq=16, target="tpu:v5e-4", mesh="tensor=4")
  assert p.meshes == ((("tensor", 4),),) and p.target.num_devices == 4


def test_indivisible_heads_on_tensor_axis(capsys):
  # tiny has 2 KV heads: a tensor axis of 4 cannot split them.
  assert main(["compare", "--model", "tiny", "--batch", "8", "--seq", "16", "--target", "cpu:4", "--mesh", "tensor=4"]) == 2
  err = capsys.readouterr().err
  assert "not divisible" in err and "kv_heads" in err


def test_default_target_here_is_the_first_compiler_installed():
  name, why = tg.default_target_name()
  if tg.attached_accelerator_present():
    assert (name, why) == ("attached", "an accelerator is attached")
    return
  expected = next((n for n in tg.DEFAULT_ACCELERATORS
                   if (gpu_compiler_available(n[4:]) if n.startswith("gpu:") else tpu_compiler_available())), "cpu")
  assert name == expected
  assert why.startswith("no accelerator attached")


@pytest.mark.parametrize(
    "attached,gpu,tpu,expected",
    [
        (True, True, True, "attached"),
        (False, True, True, "gpu:h100"),
        (False, False, True, "tpu:v6e-1"),
        (False, False, False, "cpu"),
    ],
)
def test_default_target_order(monkeypatch, attached, gpu, tpu, expected):
  no = CompilerAvailability(ok=False, why="not here")
  yes = CompilerAvailability(ok=True)
  monkeypatch.setattr(tg, "attached_accelerator_present", lambda: attached)
  monkeypatch.setattr(tg, "gpu_compiler_available", lambda name=None: yes if gpu else no)
  monkeypatch.setattr(tg, "tpu_compiler_available", lambda: yes if tpu else no)
  name, why = tg.default_target_name()
  assert name == expected
  assert (name in why) or (expected == "cpu" and "no TPU/GPU compiler installed" in why)


@needs_tpu
def test_multislice_target_compiles():
  t = tg.get_target("tpu:v5e-4", slices=2)
  assert t.num_devices == 8 and t.name == "tpu:v5e-4x2slices"
  rows = sweep.compare(model="tiny", batch=8, seq=32, target="tpu:v5e-4", slices=2, mesh="data=2,fsdp=4", remat="none")
  assert rows[0].error is None and rows[0].num_devices == 8
  assert rows[0].comm_bytes > 0  # gradients cross the slices


# --- targets as an API ---------------------------------------------------------


def test_public_target_devices_capacity_and_mesh():
  import jaxmem

  t = jaxmem.target("cpu:4")
  assert len(t.devices) == 4 and t.devices() == t.devices  # the older call spelling still works
  assert t.capacity_bytes is None  # the CPU has no device memory limit
  mesh = t.mesh({"data": 2, "fsdp": -1})
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2} and set(mesh.devices.flat) == set(t.devices)
  assert t.mesh([("x", 4)]).axis_names == ("x",)


@pytest.mark.parametrize(
    "axes, match",
    [
        ({"data": 3}, "mesh data=3 has 3 devices but target cpu:4 has 4"),
        ({"data": -1, "fsdp": -1}, "at most one -1"),
        ({"data": 3, "fsdp": -1}, "3 does not divide"),
        ({"data": "2"}, "name: size pairs"),
    ],
)
def test_public_mesh_errors_are_one_line(axes, match):
  import jaxmem

  with pytest.raises(JaxmemError, match=match):
    jaxmem.target("cpu:4").mesh(axes)


def test_target_mesh_works_with_shard_map():
  import jax
  import jax.numpy as jnp
  from jax.sharding import PartitionSpec as P

  import jaxmem

  mesh = jaxmem.target("cpu:4").mesh({"fsdp": 4})
  # All-gather a sharded weight inside shard_map, as FSDP does by hand.
  gather = lambda w: jax.lax.all_gather(w, "fsdp", tiled=True).sum(0)  # noqa: E731
  step = jax.shard_map(gather, mesh=mesh, in_specs=P("fsdp"), out_specs=P(), check_vma=False)
  w = jax.ShapeDtypeStruct((64, 32), jnp.float32, sharding=jax.sharding.NamedSharding(mesh, P("fsdp")))
  report = jaxmem.analyze(step, w, target="cpu:4")
  assert list(report.argument_bytes.values()) == [64 * 32 * 4 // 4]  # a shard each
  assert report.comm_all_gather_bytes == 3 * 64 * 32 * 4 // 4  # (g-1)/g of the gathered weight


@pytest.mark.needs_tpu_compiler
def test_public_tpu_target_has_its_compiler_capacity():
  import jaxmem

  t = jaxmem.target("tpu:v5p-64")
  assert len(t.devices) == 32 and t.devices[0].platform == "tpu"  # v5p names count TensorCores: 32 chips
  assert 90 * 2**30 < t.capacity_bytes < t.hbm_bytes * 1.01
  assert dict(t.mesh({"data": 2, "fsdp": 16}).shape) == {"data": 2, "fsdp": 16}


def test_fsdp_shardings_split_the_largest_dimension_the_axis_divides():
  import jax
  import jax.numpy as jnp
  from jax.sharding import PartitionSpec as P

  import jaxmem

  mesh = jaxmem.target("cpu:8").mesh({"data": 2, "fsdp": 4})
  tree = {
      "w": jax.ShapeDtypeStruct((64, 256), jnp.float32),  # the larger dimension
      "b": jax.ShapeDtypeStruct((6, 12), jnp.float32),  # 12 divides by 4, 6 does not
      "odd": jax.ShapeDtypeStruct((3, 5), jnp.float32),  # nothing divides: replicated
      "step": jax.ShapeDtypeStruct((), jnp.int32),
  }
  specs = {k: s.spec for k, s in jaxmem.fsdp_shardings(tree, mesh).items()}
  assert specs == {"w": P(None, "fsdp"), "b": P(None, "fsdp"), "odd": P(), "step": P()}
  both = jaxmem.fsdp_shardings(tree, mesh, axis=("data", "fsdp"))
  assert both["w"].spec == P(None, ("data", "fsdp")) and both["b"].spec == P()
  with pytest.raises(JaxmemError, match="mesh has no axis 'model'"):
    jaxmem.fsdp_shardings(tree, mesh, axis="model")


def test_gpu_capacity_follows_the_allocator_fraction(monkeypatch):
  """XLA_CLIENT_MEM_FRACTION (jax 0.11's name), its old name, and mem_fraction / --mem-fraction
  each set capacity = fraction x device memory; the option wins over the environment."""
  for name in tg.MEM_FRACTION_VARIABLES:
    monkeypatch.delenv(name, raising=False)
  default = tg.get_target("gpu:h100x8")
  assert default.capacity_bytes == int(default.hbm_bytes * 0.75)
  monkeypatch.setenv("XLA_CLIENT_MEM_FRACTION", "0.94")
  t = tg.get_target("gpu:h100x8")
  assert t.capacity_bytes == int(t.hbm_bytes * 0.94) and "XLA_CLIENT_MEM_FRACTION" in t.capacity_note
  monkeypatch.delenv("XLA_CLIENT_MEM_FRACTION")
  monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")
  assert tg.get_target("gpu:h100x8").capacity_bytes == int(t.hbm_bytes * 0.9)
  assert tg.get_target("gpu:h100x8", mem_fraction=0.94).capacity_bytes == t.capacity_bytes
  with pytest.raises(JaxmemError, match="mem_fraction"):
    tg.get_target("gpu:h100x8", mem_fraction=1.5)
  with pytest.raises(JaxmemError, match="GPU targets only"):
    tg.get_target("tpu:v5p-8", mem_fraction=0.9)


def test_mem_fraction_flag_sets_the_plans_capacity(monkeypatch):
  from jaxmem.cli import build_parser
  from jaxmem.cli._common import workload

  for name in tg.MEM_FRACTION_VARIABLES:
    monkeypatch.delenv(name, raising=False)
  args = build_parser().parse_args(["compare", "--model", "tiny", "--target", "gpu:h100x8", "--mem-fraction", "0.94"])
  w = workload(args)
  assert w.mem_fraction == 0.94
  t = plan(w).target
  assert t.capacity_bytes == int(t.hbm_bytes * 0.94)
  assert plan(w.replace(mem_fraction=None)).target.capacity_bytes == int(t.hbm_bytes * 0.75)
