"""Compile-only TPU and GPU devices: names, topologies, sharded compiles, out-of-memory parsing."""

import os

# The CLI's process model: no accelerator attached, CPU backend only. Set before jax is imported,
# and only if the runner (conftest.py) has not chosen already.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxmem.hardware.availability import CompilerAvailability
from jaxmem.hardware.capacity import usable_hbm_bytes
from jaxmem.hardware.gpu import GPU_SPECS, gpu_compiler_available, gpu_devices, gpu_target_config
from jaxmem.hardware.oom import OutOfMemory, parse_oom
from jaxmem.hardware.tpu import TPU_GENERATIONS, tpu_compiler_available, tpu_devices, tpu_topology_name
from jaxmem.compiler.report import Refusal
from jaxmem.errors import JaxmemError

GiB = 1 << 30
TPU_MESSAGE = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
               "temporaries (66.79G) exceeds available HBM (15.75G).")


tpu = pytest.mark.needs_tpu_compiler
gpu = pytest.mark.needs_gpu_compiler("h100")
ARGUMENT_BYTES = (1024 * 512 + 512 * 256) * 4  # x and w of _sharded_compile, whole
OUTPUT_BYTES = 1024 * 256 * 4


def _sharded_compile(devices):
  """x @ w with both arguments split by rows over every device; returns the memory analysis."""
  mesh = Mesh(np.array(devices), ("d",))
  rows = NamedSharding(mesh, P("d", None))
  x = jax.ShapeDtypeStruct((1024, 512), jnp.float32, sharding=rows)
  w = jax.ShapeDtypeStruct((512, 256), jnp.float32, sharding=rows)
  f = jax.jit(lambda x, w: jnp.tanh(x @ w), in_shardings=(rows, rows), out_shardings=rows)
  return f.lower(x, w).compile().memory_analysis()


# -- names (no compiler needed) -------------------------------------------------------------------

@pytest.mark.parametrize("generation, size, expected", [
    ("v5e", 1, "v5e:1x1"), ("v5e", 8, "v5e:2x4"), ("v5e", 256, "v5e:16x16"),
    ("v6e", 8, "v6e:2x4"), ("v6e", 256, "v6e:16x16"),
    ("v4", 8, "v4:2x2x1"), ("v4", 4096, "v4:8x16x16"),
    ("v5p", 8, "v5p:2x2x1"), ("v5p", 128, "v5p:4x4x4"), ("v5p", 17920, "v5p:16x20x28"),
    ("v7x", 8, "tpu7x:2x2x1"), ("v5litepod", 16, "v5e:4x4"),
])
def test_topology_names(generation, size, expected):
  assert tpu_topology_name(generation, size) == expected


def test_tables_are_consistent():
  for gen in TPU_GENERATIONS.values():
    assert gen.sizes == tuple(sorted(gen.sizes))
    assert gen.hbm_bytes_per_device * gen.devices_per_chip == gen.hbm_bytes_per_chip
  assert TPU_GENERATIONS["v5p"].chips(8) == 4  # Cloud counts TensorCores for v4/v5p
  assert TPU_GENERATIONS["v5e"].chips(8) == 8  # and chips for v5e/v6e
  for spec in GPU_SPECS.values():
    text = gpu_target_config(spec)
    assert f"device_memory_size: {spec.hbm_bytes}" in text
    assert f'device_description_str: "{spec.description}"' in text


def test_unknown_names_list_the_valid_ones():
  with pytest.raises(JaxmemError, match="v5e.*v6e"):
    tpu_topology_name("v9z", 8)
  with pytest.raises(JaxmemError, match=r"1, 4, 8, 16, 32, 64, 128, 256"):
    tpu_topology_name("v5e", 12)
  with pytest.raises(JaxmemError, match=r"TensorCores\): 2, 8, 16"):
    tpu_devices("v5p", 4)
  with pytest.raises(JaxmemError, match="a100-40gb.*h100.*b200"):
    gpu_devices("rtx4090", 1)
  with pytest.raises(JaxmemError, match="a100-40gb.*h100.*b200"):
    gpu_compiler_available("rtx4090")
  with pytest.raises(JaxmemError, match="num_slices"):
    tpu_devices("v5e", 4, num_slices=0)
  with pytest.raises(JaxmemError, match="devices_per_host"):
    gpu_devices("h100", 0)


def test_parse_oom_messages():
  assert parse_oom(TPU_MESSAGE) == OutOfMemory(
      required_bytes=round(66.79 * GiB), available_bytes=round(15.75 * GiB))
  assert parse_oom("XLA:TPU compile permanent error. Ran out of memory in memory space hbm. "
                       "Used 17.12G of 15.48G hbm. Exceeded hbm capacity by 1.64G.") == OutOfMemory(
      required_bytes=round(17.12 * GiB), available_bytes=round(15.48 * GiB))
  assert parse_oom("RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to "
                       "allocate 8.00G. That was not possible. There are 5.14G free.") == OutOfMemory(
      required_bytes=8 * GiB, available_bytes=round(5.14 * GiB))
  assert parse_oom("E gpu_hlo_schedule.cc:968] The byte size of input/output arguments "
                       "(274878955520) exceeds the base limit (67954383257).") == OutOfMemory(
      required_bytes=274878955520, available_bytes=67954383257)
  assert parse_oom("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 123456 "
                       "bytes.") == OutOfMemory(
      required_bytes=123456, available_bytes=None)
  assert parse_oom("INVALID_ARGUMENT: shapes do not match") is None
  assert parse_oom("") is None


def test_a_refused_compile_says_what_it_needed():
  oom = Refusal.of(jax.errors.JaxRuntimeError(TPU_MESSAGE + "\n\nmore detail"))
  assert (oom.fits, oom.required_bytes, oom.error) == (False, round(66.79 * GiB), TPU_MESSAGE)
  assert (oom.verdict, oom.margin_bytes) == ("NO", round(15.75 * GiB) - round(66.79 * GiB))
  other = Refusal.of(jax.errors.JaxRuntimeError("UNIMPLEMENTED: no such op"))
  assert (other.fits, other.required_bytes, other.error) == (None, None, "UNIMPLEMENTED: no such op")
  assert (other.verdict, other.margin_bytes) == (None, None)


# jaxlib 0.10.2's refusal of GPT-3 22B's attention output projection for gpu:a100-80gbx8, tensor=8.
NO_TILING = (
    "INTERNAL: Couldn't find output tile sizes that satisfy hlo: %dot.91 = bf16[8192,6144]{1,0} "
    "dot(%bitcast.419, %parameter_1.5), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="
    '"jit(train_step)/jvp()/while/body/closed_call/btnh,nhd->btd/dot_general" stack_frame_id=104}, '
    'backend_config={"sizes":["128"]}'
)


def test_a_triton_tiling_refusal_says_which_matmul_and_what_to_do():
  r = Refusal.of(jax.errors.JaxRuntimeError(NO_TILING))
  assert r.fits is None and "\n" not in r.error
  assert "no Triton tile sizes for the bf16[8192,6144] matmul btnh,nhd->btd (dot.91)" in r.error
  assert "--xla_gpu_enable_triton_gemm=false" in r.error


def _heads_96_wide_step(x, wo, wq):
  """A scanned attention layer's gradient with 8 heads 96 wide: the smallest program found whose
  backward query projection, bf16[512,768], jaxlib 0.10.2 cannot tile for sm_80 (the
  same as GPT-3 22B's [8192,6144] at tensor=8)."""

  def loss(x, wo, wq):
    def layer(h, ws):
      wo, wq = ws
      q = jnp.einsum("btd,dnh->btnh", h, wq.astype(jnp.bfloat16))
      p = jax.nn.softmax(jnp.einsum("btnh,bsnh->bnts", q, q).astype(jnp.float32), axis=-1)
      o = jnp.einsum("bnts,bsnh->btnh", p.astype(jnp.bfloat16), q)
      return h + jnp.einsum("btnh,nhd->btd", o, wo.astype(jnp.bfloat16)), None

    return jax.lax.scan(layer, x, (wo, wq))[0].astype(jnp.float32).sum()

  return jax.grad(loss, argnums=(1, 2))(x, wo, wq)


@pytest.mark.needs_gpu_compiler("a100-80gb")
def test_a100_compiles_96_wide_heads_through_cublas_where_triton_cannot_tile_them():
  from jaxmem.compiler.analysis import lower_for_target

  args = (jax.ShapeDtypeStruct((2, 256, 768), jnp.bfloat16), jax.ShapeDtypeStruct((2, 8, 96, 768), jnp.float32),
          jax.ShapeDtypeStruct((2, 768, 8, 96), jnp.float32))
  outcome = lower_for_target(_heads_96_wide_step, *args, target="gpu:a100-80gb").figures()
  assert not isinstance(outcome, Refusal), outcome.error
  retried = [n for n in outcome.notes if n.startswith("compiled with xla_gpu_enable_triton_gemm=false")]
  if jax.__version_info__ < (0, 12):  # jaxlib 0.10.2's Triton GEMM cannot tile it: compiled again through cuBLAS
    assert retried and "no Triton tile sizes for the bf16[512,768] matmul btd,dnh->btnh" in retried[0]
  report = outcome.report
  assert report.temp_size_in_bytes > 0 and report.argument_size_in_bytes == sum(
      np.prod(a.shape) * a.dtype.itemsize for a in args)


def test_compiler_availability_is_true_only_when_available():
  no = CompilerAvailability(ok=False, why="libtpu missing")
  assert not no and bool(CompilerAvailability(ok=True))
  ok, why = no
  assert (ok, why) == (False, "libtpu missing") and no[1] == "libtpu missing"


# -- TPU ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("generation", list(TPU_GENERATIONS))
@tpu
def test_every_slice_size_is_accepted_by_libtpu(generation):
  gen = TPU_GENERATIONS[generation]
  for size in gen.sizes:
    devices = tpu_devices(generation, size)
    assert len(devices) == gen.chips(size) * gen.devices_per_chip, f"{generation}-{size}"
    assert devices[0].device_kind == gen.device_kind
    assert devices[0].platform == "tpu"


@tpu
def test_tpu_devices_are_cached_and_multislice():
  assert tpu_devices("v5e", 4) == tpu_devices("v5e", 4)
  assert tpu_devices("v5e", 4)[0] is tpu_devices("v5e", 4)[0]
  two = tpu_devices("v5e", 4, num_slices=2)
  assert len(two) == 8
  assert sorted({d.slice_index for d in two}) == [0, 1]


@tpu
def test_sharded_compile_on_v5e_4():
  stats = _sharded_compile(tpu_devices("v5e", 4))
  assert stats.argument_size_in_bytes == ARGUMENT_BYTES // 4
  assert stats.output_size_in_bytes == OUTPUT_BYTES // 4


@tpu
def test_real_tpu_out_of_memory_is_parsed():
  devices = tpu_devices("v5e", 1)
  sharding = NamedSharding(Mesh(np.array(devices), ("d",)), P())
  x = jax.ShapeDtypeStruct((1 << 16,), jnp.float32, sharding=sharding)
  big = jax.jit(lambda v: jnp.cumsum(jnp.outer(v, v), axis=0)[-1])  # 16 GiB that must exist at once
  with pytest.raises(Exception) as info:
    big.lower(x).compile()
  oom = parse_oom(str(info.value))
  assert oom is not None, str(info.value)
  assert oom.required_bytes > 16 * GiB - 1
  assert 15 * GiB < oom.available_bytes < 16 * GiB


@tpu
def test_usable_hbm_is_read_from_the_compiler():
  assert abs(usable_hbm_bytes("v5e") - 15.75 * GiB) < 6 << 20
  assert usable_hbm_bytes("h100") == GPU_SPECS["h100"].hbm_bytes


# -- GPU ------------------------------------------------------------------------------------------

@gpu
def test_sharded_compile_on_h100_x2():
  devices = gpu_devices("h100", 2)
  assert [d.device_kind for d in devices] == ["NVIDIA H100 80GB HBM3"] * 2
  stats = _sharded_compile(devices)
  assert stats.argument_size_in_bytes == ARGUMENT_BYTES // 2
  assert stats.output_size_in_bytes == OUTPUT_BYTES // 2


@gpu
def test_gpu_multi_host_and_cache():
  devices = gpu_devices("h100", 4, hosts=2)
  assert [d.process_index for d in devices] == [0] * 4 + [1] * 4
  assert gpu_devices("h100", 4, hosts=2)[0] is devices[0]


@pytest.mark.parametrize("name", list(GPU_SPECS))
@gpu
def test_gpu_compiler_available_answers_per_gpu(name):
  # The answer must agree with compiling for that GPU, tried here another way (a sharded matmul
  # with tanh, which needs ptxas and libdevice): available exactly when it compiles, and a
  # reason exactly when it does not. (b200, sm_100, needs ptxas 12.8 or later.)
  answer = gpu_compiler_available(name)
  try:
    stats = _sharded_compile(gpu_devices(name, 1))
  except jax.errors.JaxRuntimeError as e:
    assert not answer and answer.why, f"{name} did not compile ({e}) but was said to be available"
    assert f"sm_{''.join(map(str, GPU_SPECS[name].compute_capability))}" in answer.why or "toolkit" in answer.why
  else:
    assert answer and answer.why == "", f"{name} compiled but was said to be unavailable: {answer.why}"
    assert stats.argument_size_in_bytes == ARGUMENT_BYTES


@tpu
@gpu
def test_both_targets_in_one_process():
  # Per device: each argument and the output are split by rows over the four devices.
  for devices in (tpu_devices("v6e", 4), gpu_devices("a100-80gb", 4), tpu_devices("v5p", 8)):
    stats = _sharded_compile(devices)
    assert stats.argument_size_in_bytes == ARGUMENT_BYTES // len(devices), devices[0].device_kind
    assert stats.output_size_in_bytes == OUTPUT_BYTES // len(devices)


@pytest.mark.slow  # a fresh interpreter; test_startup's entry points hold a quiet start the same way
@tpu
def test_nothing_reaches_stderr(tmp_path):
  # A fresh process, because libtpu's start-up noise comes once per process.
  script = textwrap.dedent("""
      import os, sys
      os.environ["JAX_PLATFORMS"] = "cpu"
      import jax  # its own import noise is the caller's business
      print("MARK", file=sys.stderr, flush=True)
      from jaxmem.hardware.capacity import usable_hbm_bytes
      from jaxmem.hardware.gpu import gpu_compiler_available, gpu_devices
      from jaxmem.hardware.tpu import tpu_compiler_available, tpu_devices
      from jaxmem.errors import JaxmemError
      tpu_compiler_available(); gpu_compiler_available()
      tpu_devices("v5e", 4); tpu_devices("v4", 8); usable_hbm_bytes("v5e")
      try:
        gpu_devices("h100", 2)
      except JaxmemError:
        pass
      try:
        tpu_devices("v5e", 3)
      except JaxmemError:
        pass
  """)
  env = {k: v for k, v in os.environ.items() if k != "JAXMEM_VERBOSE"}
  # cwd elsewhere: `-c` puts the working directory first on sys.path, and the checkout's jaxmem/
  # must not shadow the installed one (which maps jaxmem.models to models/).
  out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                       timeout=120, cwd=tmp_path)
  assert out.returncode == 0, out.stderr
  assert out.stderr.split("MARK\n", 1)[1] == ""
