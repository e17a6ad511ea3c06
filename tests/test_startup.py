"""JAX starts safely whatever the user did first ("Order of setup breaks GPU
targets"), and ``import jaxmem`` changes nothing in the user's process: each
case runs in a fresh interpreter, without JAX_PLATFORMS, as a user's script would on a machine
with the CUDA plugin and libtpu installed and no accelerator."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from jaxmem.hardware import cuda_plugin, gpu
from jaxmem.errors import JaxmemError

ANALYZE = """
def analyze(target):
  r = jaxmem.analyze(lambda a: jax.numpy.sin(a) @ a, jax.ShapeDtypeStruct((64, 64), jax.numpy.float32), target=target)
  print("OK", target, r.platform, r.num_devices, flush=True)
"""


def _run(*parts: str, **env: str) -> subprocess.CompletedProcess:
  script = "\n".join(textwrap.dedent(p) for p in parts)
  env = {**{k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "JAXMEM_VERBOSE", "XLA_FLAGS")}, **env}
  return subprocess.run([sys.executable, "-P", "-c", script], env=env, capture_output=True, text=True, timeout=600)


def test_import_changes_neither_the_environment_nor_jax_config():
  out = _run(
      """
      import os, jax
      e = dict(os.environ); c = jax.config.jax_platforms; n = jax.config.jax_num_cpu_devices
      import jaxmem
      assert dict(os.environ) == e and jax.config.jax_platforms == c, (c, jax.config.jax_platforms)
      assert jax.config.jax_num_cpu_devices == n
      from jax._src import xla_bridge
      assert not xla_bridge.backends_are_initialized()
      print("OK")
      """
  )
  assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-3000:]


# Records the platform list JAX's backends first start with, and fails if they start with every
# platform allowed (what would try CUDA and make the plugin print its errors) on this machine,
# which has no accelerator; the environment is the user's after the call too (libtpu's
# ALLOW_MULTIPLE_LIBTPU_LOAD is set only while it loads).
SPY = """
import os
env = dict(os.environ)
import jax
from jax._src import xla_bridge
first = []
_backends = xla_bridge.backends
def _spy(*a, **k):
  if not first:
    first.append(jax.config.jax_platforms)
  return _backends(*a, **k)
xla_bridge.backends = _spy
import jaxmem
"""
CHECK = """
assert first == ["cpu"], first
assert dict(os.environ) == env, set(os.environ.items()) ^ set(env.items())
print("OK", flush=True)
"""

# One cheap call per public entry point that compiles; each is the first JAX use of its process.
# fit is left out: it runs compare's tasks (planning/sweep.run_task), and its search over a
# capacity compiles for minutes.
ENTRY_POINTS = {
    "analyze": 'jaxmem.analyze(lambda a: a @ a, jax.ShapeDtypeStruct((8, 8), "float32"), target="cpu:2")',
    "compare": 'jaxmem.compare(model="tiny", batch=2, seq=16, target="cpu", remat="none", cache=jaxmem.RowCache(enabled=False))',
    "explain": 'jaxmem.explain(model="tiny", batch=2, seq=16, target="cpu")',
    "infer": 'jaxmem.infer(model="tiny", target="cpu", batch=1, context=[32])',
    "scale": 'jaxmem.scale(model="tiny", over=["batch=2,4"], seq=16, target="cpu", remat="none", cache=jaxmem.RowCache(enabled=False))',
    "target": 'jaxmem.target("tpu:v5e-1").capacity_bytes; jaxmem.target("gpu:h100x2").mesh({"data": 2})',
}
SLOW = ("compare", "explain", "infer", "scale")  # below them, Target.devices and the topologies start JAX too


@pytest.mark.parametrize(
    "entry", [pytest.param(e, marks=pytest.mark.slow) if e in SLOW else e for e in ENTRY_POINTS]
)
def test_every_entry_point_starts_jax_on_the_cpu_quietly(entry):
  if entry == "target":
    from jaxmem.hardware.tpu import tpu_compiler_available

    if not tpu_compiler_available():
      pytest.skip("needs libtpu")
  out = _run(SPY, ENTRY_POINTS[entry], CHECK)
  assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-3000:]
  assert "Unable to load" not in out.stderr and "Traceback" not in out.stderr, out.stderr[-3000:]


def test_validation_starts_no_backend():
  # plan() checks a sweep without JAX where nothing needs it (a TPU target's capacity probe does).
  out = _run(
      """
      import jaxmem
      from jax._src import xla_bridge
      from jaxmem.resolve import plan
      plan(model="tiny", target="cpu:2", batch=4, seq=16)
      plan(model="tiny", target="gpu:h100x2", batch=4, seq=16)
      assert not xla_bridge.backends_are_initialized()
      print("OK")
      """
  )
  assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-3000:]


@pytest.mark.slow  # worker processes that each start JAX
def test_workers_start_with_the_parents_platforms(tmp_path):
  # A spawned worker inherits the environment, not jax.config: the platform list the user chose
  # in config goes to it explicitly. TPU_ACCELERATOR_TYPE makes the worker believe a TPU is
  # attached, so left to itself it would start with JAX's default platforms instead.
  (tmp_path / "platform_probe.py").write_text(
      "import jax\n\ndef run(task):\n  return {'platforms': jax.config.jax_platforms}\n"
  )
  out = _run(
      """
      import jax, jaxmem
      import platform_probe
      from jaxmem.planning import runner
      from jaxmem.resolve import plan
      jax.config.update("jax_platforms", "cpu")  # the user's choice, in config only
      tasks = plan(model="tiny", batch=2, seq=16, target="cpu", remat="none,full").tasks()
      print("OK", [r["platforms"] for r in runner.run_tasks(tasks, platform_probe.run, jobs=2)])
      """,
      PYTHONPATH=str(tmp_path), TPU_ACCELERATOR_TYPE="v5litepod-1",
  )
  assert out.returncode == 0 and "OK ['cpu', 'cpu']" in out.stdout, out.stderr[-3000:]


@pytest.mark.parametrize("flags, said", [
    ("--xla_bogus_flag", "Unknown flag in XLA_FLAGS: --xla_bogus_flag"),
    # XLA follows this one with the usage of every flag, hundreds of lines.
    pytest.param("--xla_gpu_autotune_level=abc", "Couldn't interpret value abc for flag xla_gpu_autotune_level.",
                 marks=pytest.mark.slow),  # a second interpreter; the unknown flag above takes the same path
])
def test_a_bad_xla_flag_is_one_line_before_anything_compiles(flags, said):
  # XLA exits the process from C++ on a flag it cannot read; its message used to be swallowed by
  # the silenced start-up, and the process ended with status 1 and nothing printed.
  out = subprocess.run(
      [sys.executable, "-P", "-m", "jaxmem", "compare", "--model", "tiny", "--target", "cpu", "--no-cache"],
      env={**{k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}, "XLA_FLAGS": flags},
      capture_output=True, text=True, timeout=600,
  )
  lines = [line for line in out.stderr.splitlines() if line.strip()]
  assert out.returncode == 2 and lines == [f"jaxmem: error: XLA_FLAGS={flags!r} is refused by XLA: {said}"], out.stderr[-3000:]
  assert out.stdout == ""  # nothing compiled


def test_good_xla_flags_pass_the_check(monkeypatch):
  from jaxmem.hardware import startup

  monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_autotune_level=2")
  startup.check_xla_flags()  # no error; and a library caller gets the error as an exception:
  monkeypatch.setenv("XLA_FLAGS", "--xla_bogus_flag")
  with pytest.raises(JaxmemError, match="Unknown flag in XLA_FLAGS: --xla_bogus_flag"):
    startup.check_xla_flags()
