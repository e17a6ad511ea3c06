"""`jaxmem.analyze` reports exactly what the compiler says."""

import json

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
    "host_argument_size_in_bytes",
    "host_output_size_in_bytes",
    "host_alias_size_in_bytes",
    "host_temp_size_in_bytes",
    "host_generated_code_size_in_bytes",
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


# --- targets, devices and the richer report -----------------------------


def _train_like(params, opt_state, x):
  loss, grads = jax.value_and_grad(lambda p: jnp.tanh(x @ p["w1"] @ p["w2"]).sum())(params)
  return jax.tree.map(lambda p, g, m: p - g * m, params, grads, opt_state), loss


def _train_args(mesh=None):
  params = {"w1": jax.ShapeDtypeStruct((256, 512), jnp.float32), "w2": jax.ShapeDtypeStruct((512, 64), jnp.float32)}
  x = jax.ShapeDtypeStruct((32, 256), jnp.float32)
  if mesh is None:
    return params, params, x
  sh = jaxmem.fsdp_shardings(params, mesh)
  params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), params, sh)
  return params, params, jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, PartitionSpec("fsdp")))


def test_bytes_per_argument_and_leaf():
  report = jaxmem.analyze(_train_like, *_train_args())
  param_bytes = (256 * 512 + 512 * 64) * 4
  assert report.argument_bytes == {"params": param_bytes, "opt_state": param_bytes, "x": 32 * 256 * 4}
  assert report.argument_leaf_bytes["params.w1"] == 256 * 512 * 4
  assert sum(report.argument_leaf_bytes.values()) == sum(report.argument_bytes.values()) == report.argument_size_in_bytes


def test_a_typed_prng_key_argument_counts_its_key_data():
  # MaxText's train step takes a typed key (key<urbg>), which has no item size: it holds its key
  # data, which the compiler counts in argument_size_in_bytes like any other argument.
  key = jax.eval_shape(lambda: jax.random.key(0, impl="rbg"))
  x = jax.ShapeDtypeStruct((64, 256), jnp.float32)
  report = jaxmem.analyze(lambda k, x: x * jax.random.uniform(k, x.shape), key, x)
  assert report.argument_bytes["k"] == jax.random.key_data(jax.random.key(0, impl="rbg")).nbytes > 0
  assert sum(report.argument_bytes.values()) == report.argument_size_in_bytes


def test_sharded_arguments_per_device_and_communication():
  mesh = jaxmem.target("cpu:4").mesh({"fsdp": 4})
  sharded = jaxmem.analyze(_train_like, *_train_args(mesh), target="cpu:4")
  replicated = jaxmem.analyze(_train_like, *_train_args(), target="cpu:4")
  assert sharded.argument_bytes["params"] * 4 == replicated.argument_bytes["params"]
  assert replicated.argument_bytes["params"] == (256 * 512 + 512 * 64) * 4  # every device holds all
  kinds = [k for k in vars(sharded) if k.startswith("comm_") and k.endswith("_bytes") and k != "comm_bytes"]
  assert sharded.comm_bytes > 0 and sharded.comm_bytes == sum(getattr(sharded, k) for k in kinds)
  assert jaxmem.analyze(_train_like, *_train_args()).comm_bytes == 0  # one device sends nothing


def test_report_keeps_the_compiled_out_of_as_dict():
  report = jaxmem.analyze(_step, *_args())
  assert isinstance(report.compiled, jax.stages.Compiled)
  assert report.compiled.memory_analysis().temp_size_in_bytes == report.temp_size_in_bytes
  d = report.as_dict()
  assert "compiled" not in d and d["argument_bytes"] == {"w": 256 * 512 * 4, "x": 64 * 256 * 4}
  json.dumps(d)


def test_static_arguments_are_not_arguments():
  report = jaxmem.analyze(lambda n, x: x * n, 3, jax.ShapeDtypeStruct((8,), jnp.float32), static_argnums=0)
  assert report.argument_bytes == {"x": 32}


def test_inputs_on_a_subset_of_the_target_devices_are_one_line():
  mesh = jax.sharding.Mesh(np.array(jax.devices("cpu")[:2]), ("d",))
  w = jax.ShapeDtypeStruct((256, 512), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec("d")))
  with pytest.raises(JaxmemError, match=r"args\[0\] is sharded on 2 cpu devices .*some of target cpu:4's 4 cpu devices") as e:
    jaxmem.analyze(_step, w, _args()[1], target="cpu:4")
  assert "\n" not in str(e.value)


def test_inputs_on_different_device_sets_are_one_line_without_a_target():
  four = jax.sharding.Mesh(np.array(jax.devices("cpu")[:4]), ("d",))
  two = jax.sharding.Mesh(np.array(jax.devices("cpu")[4:6]), ("d",))
  w = jax.ShapeDtypeStruct((256, 512), jnp.float32, sharding=NamedSharding(four, PartitionSpec("d")))
  x = jax.ShapeDtypeStruct((64, 256), jnp.float32, sharding=NamedSharding(two, PartitionSpec()))
  with pytest.raises(JaxmemError, match=r"args\[0\] is sharded on 4 cpu devices .* but args\[1\] on 2 cpu devices"):
    jaxmem.analyze(_step, w, x)


def test_a_function_without_array_inputs_compiles_on_the_target():
  report = jaxmem.analyze(lambda: jnp.zeros((64, 64)) + 1, target="cpu:4")
  assert report.num_devices == 4 and report.output_size_in_bytes == 64 * 64 * 4


@pytest.mark.needs_gpu_compiler
def test_user_step_on_an_h100x8_fsdp_mesh_holds_an_eighth():
  # Done-when: a step sharded with jaxmem.target("gpu:h100x8").mesh({"fsdp": 8})
  # reports about one eighth of the replicated argument bytes; sharded on jax.devices() of
  # another platform, it is a one-line error.
  target = jaxmem.target("gpu:h100x8")
  sharded = jaxmem.analyze(_train_like, *_train_args(target.mesh({"fsdp": 8})), target=target)
  replicated = jaxmem.analyze(_train_like, *_train_args(), target="gpu:h100x8")
  assert sharded.platform == "gpu" and sharded.num_devices == 8
  assert sharded.argument_size_in_bytes / replicated.argument_size_in_bytes == pytest.approx(1 / 8, rel=0.01)
  cpu_mesh = jax.sharding.Mesh(np.array(jax.devices()), ("fsdp",))
  with pytest.raises(JaxmemError) as e:
    jaxmem.analyze(_train_like, *_train_args(cpu_mesh), target="gpu:h100x8")
  message = str(e.value)
  assert "\n" not in message
  assert "8 cpu devices" in message and "not on target gpu:h100x8's 8 gpu devices (NVIDIA H100 80GB HBM3)" in message


class _CrossCompile:
  """tokamax.config.cross_compile as the kernel library has it: a context manager taking a bool."""

  def __init__(self):
    self.value = False

  def __call__(self, value):
    import contextlib

    @contextlib.contextmanager
    def scope():
      before, self.value = self.value, value
      try:
        yield
      finally:
        self.value = before

    return scope()


def _fake_tokamax(monkeypatch):
  import types

  cross = _CrossCompile()
  monkeypatch.setitem(__import__("sys").modules, "tokamax", types.SimpleNamespace(config=types.SimpleNamespace(
      cross_compile=cross)))
  return cross


def _traced_under(cross, target):
  from jaxmem.compiler.analysis import lower_for_target

  seen = []

  def step(w, x):
    seen.append(cross.value)  # read at trace time, where tokamax's ops check the device
    return _step(w, x)

  lower_for_target(step, *_args(), target=target)
  return seen


@pytest.mark.needs_tpu_compiler
def test_a_kernel_library_is_told_it_cross_compiles_for_a_tpu_traced_on_this_host(monkeypatch):
  cross = _fake_tokamax(monkeypatch)
  assert _traced_under(cross, "tpu:v5e-4") == [True]  # tokamax refused such a trace: "Not supported on cpu"
  assert cross.value is False  # only for the trace


def test_a_kernel_library_is_not_told_so_for_the_host_itself(monkeypatch):
  cross = _fake_tokamax(monkeypatch)
  assert _traced_under(cross, "cpu:2") == [False]
  assert _traced_under(cross, None) == [False]
