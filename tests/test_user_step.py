"""Sweeps over a user's own step: ``compare``, ``fit`` and ``scale`` with
``step=make_step``, the CLI's ``--step``, the examples, and the errors a factory can make."""

from __future__ import annotations

import json
import math
import pathlib
import textwrap

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec

import jaxmem
from jaxmem.cli import main
from jaxmem.errors import JaxmemError
from jaxmem.resolve import plan
from jaxmem.program.remat import REMAT_POLICIES
from jaxmem.program.step import step_fingerprint, step_spec

ROOT = pathlib.Path(__file__).resolve().parent.parent
CALLS: list = []  # the remat argument of every factory call, for the test that checks it

D, LAYERS = 128, 4


def _mlp(params, x_bd, remat):
  def layer(h_bd, w_dd):
    return jnp.tanh(h_bd @ w_dd)

  layer = layer if remat is None else jax.checkpoint(layer, policy=remat)
  for w_dd in params["w"]:
    x_bd = layer(x_bd, w_dd)
  return (x_bd**2).mean()


def make_step(*, batch, seq, remat, mesh=None):
  """A plain-JAX MLP step, sharded FSDP-style when given a mesh."""
  CALLS.append(remat)

  def train_step(params, opt_state, x_bsd):
    loss, grads = jax.value_and_grad(lambda p: _mlp(p, x_bsd.reshape(-1, D), remat))(params)
    new = jax.tree.map(lambda p, g, m: p - 1e-3 * (m + g), params, grads, opt_state)
    return new, jax.tree.map(lambda m, g: 0.9 * m + g, opt_state, grads), loss

  params = {"w": [jax.ShapeDtypeStruct((D, D), jnp.float32) for _ in range(LAYERS)]}
  x = jax.ShapeDtypeStruct((batch, seq, D), jnp.float32)
  if mesh is not None:
    sh = jaxmem.fsdp_shardings(params, mesh)
    params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), params, sh)
    x = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, PartitionSpec("fsdp")))
  return train_step, (params, params, x), {"donate_argnums": (0, 1)}


def returns_two(*, batch, seq, remat):
  return (lambda x: x), (jax.ShapeDtypeStruct((batch,), jnp.float32),)


def raises(*, batch, seq, remat):
  raise KeyError("no such layer")


def fails_to_trace(*, batch, seq, remat):
  def step(x):
    return x @ x  # a rank-1 matmul of mismatched size fails as JAX traces it

  return step, (jax.ShapeDtypeStruct((batch, seq), jnp.float32),), {}


def wrong_signature(batch, seq):
  return None


@pytest.fixture(scope="module")
def remat_rows():
  CALLS.clear()
  return {r.remat: r for r in jaxmem.compare(step=make_step, target="cpu:4", batch=8, seq=16, remat="full")}


def test_compare_runs_the_step_per_remat_policy(remat_rows):
  assert list(remat_rows) == ["none", "full"]
  # The factory gets the policy itself: None for no remat, jax.checkpoint's policy for full.
  assert CALLS[:2] == [None, REMAT_POLICIES["full"].policy]
  none, full = remat_rows["none"], remat_rows["full"]
  assert none.model == full.model == "step:test_user_step:make_step"
  # What jaxmem did not choose is unknown (None, shown as -), not a value it never decided.
  assert none.optimizer is None and none.dtype is None and none.param_dtype == "float32"
  assert none.microbatches is None and none.qk_dtype is None
  # Parameter bytes follow from the shapes: four float32 D x D weights over fsdp=4.
  assert none.param_bytes == none.optimizer_state_bytes == LAYERS * D * D * 4 // 4
  assert none.param_bytes_global == LAYERS * D * D * 4
  assert full.flops > none.flops and full.recompute_overhead_pct > 0  # remat recomputes the layers
  assert none.comm_bytes > 0 and none.error is None


def test_step_rows_are_cached_by_source(remat_rows, tmp_path):
  p = plan(step=make_step, target="cpu:4", batch=8, seq=16, remat="full")
  keys = {t.cache_key() for t in p.tasks()}
  assert None not in keys and len(keys) == 2
  # A lambda has no import path: it runs here, and is never cached.
  local = plan(step=lambda **kw: make_step(**kw), target="cpu:4", batch=8, seq=16, remat="none")
  assert [t.cache_key() for t in local.tasks()] == [None]


def test_editing_the_model_changes_the_fingerprint(tmp_path):
  (tmp_path / "mymodel.py").write_text("WIDTH = 1\n")
  (tmp_path / "factory.py").write_text("import mymodel\n\ndef make_step(*, batch, seq, remat):\n  pass\n")
  spec = step_spec(f"{tmp_path / 'factory.py'}:make_step")
  before = step_fingerprint(spec)
  (tmp_path / "mymodel.py").write_text("WIDTH = 2\n")  # the model beside the factory, not the factory
  assert step_fingerprint(spec) != before


def test_local_factory_refuses_worker_processes():
  with pytest.raises(JaxmemError, match="worker processes cannot import it"):
    jaxmem.compare(step=lambda **kw: make_step(**kw), target="cpu", batch=8, seq=16, remat="none", jobs=2)


def test_scale_over_a_step():
  s = jaxmem.scale(step=make_step, target="cpu", seq=16, over=["batch=8,16"])
  growth = {g.component: g for g in s.growth}
  assert growth["param_bytes"].batch_exponent == 0  # the parameters do not grow with the batch
  assert 0.5 < growth["temp_size_in_bytes"].batch_exponent < 1.5


@pytest.mark.parametrize(
    "step, message",
    [
        ("no_such_module_xyz:make_step", "cannot import step module 'no_such_module_xyz'"),
        ("test_user_step:nothing_here", "has no 'nothing_here'"),
        ("make_step", "--step must be an import path package.module:make_step"),
        ("test_user_step:returns_two", r"must return \(fn, args, jit_kwargs\); it returned a tuple of 2"),
        ("test_user_step:raises", "raised at batch 8, seq 16: KeyError"),
        ("test_user_step:fails_to_trace", "failed to trace at batch 8, seq 16, remat none: TypeError"),
        ("test_user_step:wrong_signature", "must take the keywords batch, seq and remat"),
    ],
)
def test_factory_errors_are_one_line(step, message, capsys):
  rc = main(["compare", "--step", step, "--target", "cpu", "--batch", "8", "--seq", "16", "--remat", "none", "--no-cache"])
  err = capsys.readouterr().err.strip()
  assert rc == 2
  assert len(err.splitlines()) == 1 and err.startswith("jaxmem: error:")
  assert __import__("re").search(message, err), err


def test_step_flags_that_need_a_model_are_refused(capsys):
  rc = main(["compare", "--step", "test_user_step:make_step", "--with-estimate", "--target", "cpu"])
  assert rc == 2 and "--with-estimate needs a model of jaxmem's own" in capsys.readouterr().err


@pytest.mark.slow  # two worker processes; test_planning's jobs=2 covers the workers, the CLI examples the file import
def test_jobs_import_a_file_factory_by_path(tmp_path, capsys):
  (tmp_path / "stepfile.py").write_text(
      textwrap.dedent(
          """
          import jax, jax.numpy as jnp

          def make_step(*, batch, seq, remat):
            def layer(x):
              return jnp.tanh(x @ x.T) @ x
            f = layer if remat is None else jax.checkpoint(layer, policy=remat)
            return jax.grad(lambda x: f(x).sum()), (jax.ShapeDtypeStruct((batch, seq), jnp.float32),), {}
          """
      )
  )
  argv = ["compare", "--step", f"{tmp_path}/stepfile.py:make_step", "--target", "cpu", "--batch", "8", "--seq", "32",
          "--remat", "full", "--no-cache", "--format", "json"]
  assert main([*argv, "--jobs", "2"]) == 0
  parallel = json.loads(capsys.readouterr().out)["rows"]
  assert main(argv) == 0
  serial = json.loads(capsys.readouterr().out)["rows"]
  assert [r["model"] for r in parallel] == ["step:stepfile:make_step"] * 2
  for a, b in zip(parallel, serial, strict=True):
    assert a["temp_size_in_bytes"] == b["temp_size_in_bytes"] and a["flops"] == b["flops"]


@pytest.mark.parametrize("example", ["linen_step", "nnx_step"])
def test_examples_compare_through_the_cli(example, capsys):
  argv = ["compare", "--step", f"{ROOT}/examples/{example}.py:make_tiny_step", "--target", "cpu", "--batch", "2",
          "--seq", "16", "--remat", "none", "--no-cache", "--format", "json"]
  assert main(argv) == 0
  (row,) = json.loads(capsys.readouterr().out)["rows"]
  assert row["model"] == f"step:{example}:make_tiny_step" and row["error"] is None
  # params and opt_state are the factories' argument names: AdamW keeps two moments per parameter.
  assert row["optimizer_state_bytes"] == pytest.approx(2 * row["param_bytes"], abs=64)
  assert row["argument_size_in_bytes"] >= row["param_bytes"] + row["optimizer_state_bytes"]


# Slow (five GPU compiles, the fast suite's heaviest test at 31-54 s on 2 cores): fit's boundary
# search is in the fast suite through tests/test_fit_search.py and tests/test_boundary.py.
@pytest.mark.slow
@pytest.mark.needs_gpu_compiler
def test_fit_finds_a_batch_that_compare_confirms(capsys, monkeypatch):
  # Done-when: `fit --step examples/...:make_step --target gpu:h100` finds a batch
  # that compare confirms fits. The tiny step keeps a real vocabulary, so its logits fill an H100;
  # JAX's allocator is given 1.5% of the H100 (1.19 GiB), so the boundary is near batch 11 and the
  # search compiles small programs (about 35 s here, against 60 s at the default 75%).
  monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.015")
  step = f"{ROOT}/examples/linen_step.py:make_tiny_step"
  common = ["--step", step, "--target", "gpu:h100", "--seq", "512", "--remat", "none", "--format", "json"]
  assert main(["fit", *common]) == 0
  (result,) = json.loads(capsys.readouterr().out)["rows"]
  best = result["max_batch"]
  assert best and best >= 8 and result["fit_note"] is None  # the search closed its bracket
  # compare answers from the rows fit compiled where the configuration is the same one (the
  # cache key is the whole workload and the compilers' versions), and compiles it otherwise.
  assert main(["compare", *common, "--batch", str(best)]) == 0
  (fits,) = json.loads(capsys.readouterr().out)["rows"]
  assert fits["fits"] is True and fits["required_bytes"] <= fits["capacity_bytes"]
  assert main(["compare", *common, "--batch", str(best + 1)]) == 0  # the search's own probe, cached
  (over,) = json.loads(capsys.readouterr().out)["rows"]
  assert over["fits"] is False and over["required_bytes"] > over["capacity_bytes"]
  assert math.isclose(over["param_bytes"], fits["param_bytes"])
  assert fits["capacity_bytes"] == over["capacity_bytes"] == result["capacity_bytes"]
  assert 1.1 * 2**30 < fits["capacity_bytes"] < 1.3 * 2**30  # the allocator's share the environment set


def test_explain_step_uses_the_function_explain(capsys):
  # explain --step explains the factory's function with jaxmem.explain(fn, *args, target=...).
  argv = ["explain", "--step", "test_user_step:make_step", "--target", "cpu", "--batch", "8", "--seq", "16"]
  assert main([*argv, "--top", "3"]) == 0
  assert "test_user_step.py" in capsys.readouterr().out  # the buffers' source is the user's file
