"""`jaxmem.analyze` reports exactly what the compiler says."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

import jaxmem
from jaxmem.errors import JaxmemError

FIELDS = (
    "argument_size_in_bytes",
    "output_size_in_bytes",
    "alias_size_in_bytes",
    "temp_size_in_bytes",
    "generated_code_size_in_bytes",
    "host_temp_size_in_bytes",
)


def _step(w, x):
  h = jnp.tanh(x @ w)
  return (h @ w.T).sum()


def _args():
  return jax.ShapeDtypeStruct((256, 512), jnp.float32), jax.ShapeDtypeStruct((64, 256), jnp.float32)


def test_analyze_equals_raw_memory_analysis():
  args = _args()
  raw = jax.jit(jax.grad(_step)).lower(*args).compile().memory_analysis()
  report = jaxmem.analyze(jax.grad(_step), *args)
  for f in FIELDS:
    assert getattr(report, f) == getattr(raw, f), f
  assert report.total_bytes == (
      raw.argument_size_in_bytes + raw.output_size_in_bytes - raw.alias_size_in_bytes + raw.temp_size_in_bytes
  )
  assert report.flops and report.flops > 0
  assert report.compile_seconds is not None and report.compile_seconds >= 0


def test_analyze_concrete_args_and_jit_kwargs():
  w = jnp.ones((128, 128), jnp.float32)
  x = jnp.ones((32, 128), jnp.float32)
  donated = jaxmem.analyze(lambda w, x: w + x.sum(), w, x, donate_argnums=0)
  raw = jax.jit(lambda w, x: w + x.sum(), donate_argnums=0).lower(w, x).compile().memory_analysis()
  assert donated.alias_size_in_bytes == raw.alias_size_in_bytes == 128 * 128 * 4


def test_cpu_peak_is_null_with_a_reason():
  report = jaxmem.analyze(_step, *_args())
  assert report.platform == "cpu"
  assert report.peak_memory_in_bytes is None
  assert any("peak_memory_in_bytes" in n for n in report.notes)


def test_target_cpu_n_replicates_unsharded_inputs():
  args = _args()
  one = jaxmem.analyze(_step, *args)
  four = jaxmem.analyze(_step, *args, target="cpu:4")
  assert four.num_devices == 4
  assert four.argument_size_in_bytes == one.argument_size_in_bytes  # replicated: every device holds all


def test_target_keeps_explicit_shardings():
  devices = np.array(jax.devices("cpu")[:4])
  mesh = jax.sharding.Mesh(devices, ("d",))
  w = jax.ShapeDtypeStruct((256, 512), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec("d", None)))
  x = jax.ShapeDtypeStruct((64, 256), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec()))
  report = jaxmem.analyze(_step, w, x, target="cpu:4")
  assert report.argument_size_in_bytes == 256 * 512 * 4 // 4 + 64 * 256 * 4


def test_unknown_target():
  with pytest.raises(JaxmemError, match="unknown target 'tpu:v9'"):
    jaxmem.analyze(_step, *_args(), target="tpu:v9")


def test_too_many_cpu_devices_says_how_to_fix():
  with pytest.raises(JaxmemError, match="jax_num_cpu_devices"):
    jaxmem.analyze(_step, *_args(), target="cpu:64")
