"""JAX starts safely whatever the user did first (issue 10 item 2, "Order of setup breaks GPU
targets"): each order runs in a fresh interpreter, without JAX_PLATFORMS, as a user's script
would on a machine with the CUDA plugin and libtpu installed and no accelerator."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from jaxmem.compiler import accelerators
from jaxmem.errors import JaxmemError

ANALYZE = """
def analyze(target):
  r = jaxmem.analyze(lambda a: jax.numpy.sin(a) @ a, jax.ShapeDtypeStruct((64, 64), jax.numpy.float32), target=target)
  print("OK", target, r.platform, r.num_devices, flush=True)
"""


def _run(*parts: str) -> subprocess.CompletedProcess:
  script = "\n".join(textwrap.dedent(p) for p in parts)
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "JAXMEM_VERBOSE")}
  return subprocess.run([sys.executable, "-P", "-c", script], env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.needs_gpu_compiler
@pytest.mark.needs_tpu_compiler
def test_user_array_first_then_gpu_and_tpu_targets():
  # A model built before jaxmem is imported: its PRNGKey starts every backend JAX can find.
  out = _run(
      """
      import jax
      key = jax.random.PRNGKey(0)
      import jaxmem
      """,
      ANALYZE,
      """
      analyze("gpu:h100x2")
      analyze("tpu:v5e-4")
      print("devices", jax.devices()[0].platform, jax.random.PRNGKey(1).shape)
      """
  )
  assert out.returncode == 0, out.stderr[-3000:]
  assert "OK gpu:h100x2 gpu 2" in out.stdout and "OK tpu:v5e-4 tpu 4" in out.stdout
  assert "devices cpu (2,)" in out.stdout  # the user's own arrays stay where JAX put them


@pytest.mark.needs_gpu_compiler
def test_jaxmem_first_then_user_array_then_gpu_target():
  out = _run(
      """
      import sys
      import jaxmem, jax
      print("imported", file=sys.stderr, flush=True)
      key = jax.random.PRNGKey(0)  # the user's first JAX call: on the CPU, quietly
      """,
      ANALYZE,
      """
      analyze("gpu:h100")
      """
  )
  assert out.returncode == 0, out.stderr[-3000:]
  assert "OK gpu:h100 gpu 1" in out.stdout
  after_import = out.stderr.split("imported", 1)[1]
  assert "Unable to load CUDA" not in after_import and "Traceback" not in after_import


def test_when_the_plugin_cannot_register_the_error_says_what_to_call_first(monkeypatch):
  def unavailable(**kwargs):
    raise NotImplementedError("topology not implemented for cuda")

  monkeypatch.setattr(accelerators.topologies, "get_topology_desc", unavailable)
  monkeypatch.setattr(accelerators, "_register_cuda_plugin_late", lambda: False)
  monkeypatch.setattr(accelerators, "_cuda_plugin_modules", lambda: ["jax_plugins.xla_cuda12"])
  with pytest.raises(JaxmemError, match="import jaxmem before anything else uses JAX") as e:
    accelerators.gpu_devices("a100-40gb", 3)  # a key no other test caches
  assert "\n" not in str(e.value)
