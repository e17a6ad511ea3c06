"""Test set-up: CPU only, with 8 simulated devices so meshes can be tried without hardware.

JAX_PLATFORMS=cpu keeps JAX from initialising the TPU and CUDA plugins as backends (there is
no such hardware in CI); their compilers stay usable for compile-only targets.

Markers for tests that compile for an accelerator without one (the check runs once per session,
when the first such test is set up, and a test without its compiler is skipped with the reason):

- ``@pytest.mark.needs_tpu_compiler``: libtpu is installed and makes a topology.
- ``@pytest.mark.needs_gpu_compiler`` or ``needs_gpu_compiler("b200")``: a program compiles for
  that GPU (default h100) through the CUDA plugin.

A module-scoped fixture that compiles for the target is not set up for a test the marker skips.
"""

import os
from importlib.metadata import version

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAXMEM_NO_PROGRESS", "1")
# The CPU compiler's LLVM back end at its lowest optimisation level: about a third less time per
# CPU compile of the tiny model (jax 0.10.2, 2 cores), and the same figures, since buffer
# assignment and cost analysis run on the HLO before LLVM sees it (temp, argument and FLOPs of
# tiny, remat none and full, were identical with and without). Workers and subprocesses inherit it.
_FAST_LLVM = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
# jax < 0.11 only: its CPU compiler's MLIR fusion emitters take about three quarters of a tiny
# compile (3 CPU compiles of tiny, 2 cores: 11.1 s with them, 2.6 s with the older emitters).
# The older emitters schedule the same HLO: on tiny, temp moved by 192 bytes of 12.3 MB (a
# fusion's scratch) and argument bytes and FLOPs not at all; the tests compare rows compiled
# alike, and the whole suite passes with them. jax 0.11 removed the flag (the emitters are the
# only ones), so the newest environment compiles with XLA's defaults but for LLVM's level.
_OLD_JAX = tuple(int(p) for p in version("jax").split(".")[:2]) < (0, 11)
_OLD_EMITTERS = "--xla_cpu_use_fusion_emitters=false"
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_backend_optimization_level" not in _flags:
  _flags = f"{_flags} {_FAST_LLVM}"
if "xla_cpu_use_fusion_emitters" not in _flags and _OLD_JAX:
  _flags = f"{_flags} {_OLD_EMITTERS}"
os.environ["XLA_FLAGS"] = _flags.strip()

import jax  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# The property-based tests' profiles (tests/test_inputs_properties.py): ``default`` runs in CI,
# 200 generated examples per property and no deadline (a CLI run's first example starts JAX);
# ``slow`` ten times as many, by JAXMEM_HYPOTHESIS_PROFILE=slow (docs/speed.md).
settings.register_profile("default", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("slow", parent=settings.get_profile("default"), max_examples=2000)
settings.load_profile(os.environ.get("JAXMEM_HYPOTHESIS_PROFILE", "default"))

jax.config.update("jax_num_cpu_devices", 8)

import re  # noqa: E402
import tempfile  # noqa: E402

import pytest  # noqa: E402

# Each test session gets its own row cache, so no test is answered from an earlier run's rows.
# pytest-xdist's workers inherit the controller's environment (this module is imported there
# first): each worker takes a directory of its own below the session's, so which tests share a
# worker cannot change what a test reads from the cache.
_SESSION_CACHE = os.environ.setdefault("JAXMEM_CACHE_DIR", tempfile.mkdtemp(prefix="jaxmem-test-cache-"))
if os.environ.get("PYTEST_XDIST_WORKER"):
  os.environ["JAXMEM_CACHE_DIR"] = os.path.join(_SESSION_CACHE, os.environ["PYTEST_XDIST_WORKER"])


def pytest_xdist_auto_num_workers(config):
  """``-n auto``: a worker per core, and one more with jax < 0.11 on small machines. Most of a
  test is one XLA compile; jax 0.10.2's leave a core idle about 15% of the time with a worker per
  core (its suite on 2 cores: 10 min 15 s with two workers, 8 min 54 s with three), while jax
  0.12's compiles keep both cores busy and a third worker slowed its suite down."""
  cores = os.cpu_count() or 1
  return min(4, cores + 1) if _OLD_JAX and cores <= 2 else cores


def pytest_configure(config):
  config.addinivalue_line("markers", "needs_tpu_compiler: skipped (with the reason) where libtpu cannot compile")
  config.addinivalue_line("markers", "needs_gpu_compiler(name='h100'): skipped (with the reason) where that GPU's compiler is missing")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
  # Before fixtures are set up, so a skipped test never starts its module's compile.
  from jaxmem.hardware.gpu import gpu_compiler_available
  from jaxmem.hardware.tpu import tpu_compiler_available

  if item.get_closest_marker("needs_tpu_compiler") is not None:
    ok, why = tpu_compiler_available()
    if not ok:
      pytest.skip(f"TPU compiler unavailable: {why}")
  gpu = item.get_closest_marker("needs_gpu_compiler")
  if gpu is not None:
    name = gpu.args[0] if gpu.args else gpu.kwargs.get("name", "h100")
    ok, why = gpu_compiler_available(name)
    if not ok:
      pytest.skip(f"GPU compiler for {name} unavailable: {why}")


_GTE = re.compile(r"^\s*%([\w.\-]+) = \S+ get-tuple-element\(%([\w.\-#]+)\), index=(\d+).*\n", re.M)


@pytest.fixture(scope="session")
def compile_one():
  """``compile_one(remat=..., **fields)``: the one configuration of ``plan(**fields)`` under that
  remat policy, compiled without the no-remat baseline ``compare`` adds beside it."""
  from jaxmem.planning import sweep
  from jaxmem.resolve import plan

  def run(*, remat: str, **fields):
    p = plan(**fields, remat=remat)
    ((mesh, opt, rp),) = [c for c in p.configs() if c[2].name == remat]
    return sweep.run_config(p, mesh, opt, rp)

  return run


@pytest.fixture(scope="session")
def elide_get_tuple_elements():
  """HLO text as jaxlib 0.10.2's dumps print it -> as 0.12.0.1's do: no get-tuple-element
  instructions, their readers naming the element in place (``%t#2``)."""

  def convert(text: str) -> str:
    reads = {m.group(1): (m.group(2), m.group(3)) for m in _GTE.finditer(text)}

    def spelled(name):  # an element of an element: %t#1#2
      source, index = reads[name]
      return f"{spelled(source) if source in reads else source}#{index}"

    reads = {name: spelled(name) for name in reads}
    text = _GTE.sub("", text)
    # Longest names first, and whole names only: %x.1 must not rewrite %x.10.
    for name in sorted(reads, key=len, reverse=True):
      text = re.sub(rf"%{re.escape(name)}(?![\w.\-])", "%" + reads[name], text)
    return text

  return convert


@pytest.fixture(scope="session")
def decode_matches_forward():
  """``check(cfg, *, upto, context=32) -> cache``: ``cfg``'s model prefilled with 12 tokens
  through its KV cache, then decoding one token at a time up to ``upto``, gives the training
  forward pass's logits (within float32 rounding); returns the empty cache it started from, for
  the caller's shape checks. The windows, shared layers and ring buffers are what it exercises."""
  from flax import nnx
  import jax.numpy as jnp

  import jaxmem.models

  def check(cfg, *, upto: int, context: int = 32):
    graph, state = nnx.split(jaxmem.models.Transformer(cfg, rngs=nnx.Rngs(0)))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (1, 20), 0, cfg.vocab_size)
    full = jax.jit(lambda s, t: nnx.merge(graph, s)(t))(state, tokens)
    empty = jaxmem.models.cache_class(cfg).zeros(cfg, batch=1, context=context)
    prefill = jax.jit(lambda s, t, c: nnx.merge(graph, s).cached(t, c, pos=0, last_only=False))
    logits, cache = prefill(state, tokens[:, :12], empty)
    assert jnp.allclose(logits, full[:, :12], atol=1e-5)
    decode = jax.jit(lambda s, t, c, p: nnx.merge(graph, s).cached(t, c, pos=p))
    for t in range(12, upto):
      logits, cache = decode(state, tokens[:, t : t + 1], cache, t)
      assert jnp.allclose(logits[:, 0], full[:, t], atol=1e-5), t
    return empty

  return check


@pytest.fixture
def no_compile(monkeypatch):
  """Any compile, or JAX's backends starting, fails the test: what is checked before compiling
  (inputs, output paths) must not get that far. A test file may hold its own narrower one."""
  import jax

  import jaxmem

  def refuse(*a, **k):
    raise AssertionError("compiled, or started JAX, before the input and output paths were checked")

  monkeypatch.setattr(jax.stages.Lowered, "compile", refuse)
  monkeypatch.setattr(jaxmem, "start_jax", refuse)
