"""explain on a third-party style step: gradients attributed, the three peaks
said apart, buffers listed by kind, the traceback of a user's failure on request, a clean exit."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import optax
import pytest

import jaxmem
from jaxmem.buffers.analyse import KINDS, parse_kinds
from jaxmem.cli import main
from jaxmem.errors import JaxmemError
from jaxmem.render.explain import PEAKS_LINE, explain_json, render_explain

D, F, LAYERS, VOCAB = 256, 1024, 2, 2048


# Written as a user would, not like jaxmem's models: f32 master weights cast to bf16 for compute,
# a Python loop over layers, optax's clipping and AdamW.
def _block(p, x):
  h = x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * p["norm"]
  q, k, v = h @ p["q"], h @ p["k"], h @ p["v"]
  s = jnp.einsum("btd,bsd->bts", q, k) / jnp.sqrt(D).astype(x.dtype)
  a = jnp.einsum("bts,bsd->btd", jax.nn.softmax(s.astype(jnp.float32), -1).astype(x.dtype), v)
  x = x + a @ p["o"]
  return x + jax.nn.gelu(x @ p["up"]) @ p["down"]


def _loss(params, tokens):
  p = jax.tree.map(lambda w: w.astype(jnp.bfloat16), params)
  x = p["embed"][tokens]
  for layer in p["layers"]:
    x = _block(layer, x)
  logits = (x @ p["embed"].T).astype(jnp.float32)
  return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], tokens[:, 1:]).mean()


_TX = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-4))


def _train_step(params, opt_state, tokens):
  loss, grads = jax.value_and_grad(_loss)(params, tokens)
  updates, opt_state = _TX.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss


def _args(batch=1, seq=16):
  f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)  # noqa: E731
  layer = lambda: {"q": f32(D, D), "k": f32(D, D), "v": f32(D, D), "o": f32(D, D), "up": f32(D, F),  # noqa: E731
                   "down": f32(F, D), "norm": f32(D)}
  params = {"embed": f32(VOCAB, D), "layers": [layer() for _ in range(LAYERS)]}
  return params, jax.eval_shape(_TX.init, params), jax.ShapeDtypeStruct((batch, seq), jnp.int32)


@pytest.fixture(scope="module")
def optax_step():
  # A short sequence: the parameters outweigh the activations, so the peak is where the backward
  # pass has made every gradient and the clipping holds them all (the Gemma case of the issue).
  return jaxmem.explain(jax.jit(_train_step, donate_argnums=(0, 1)), *_args(), target="cpu", top=40)


def test_gradients_of_a_user_step_are_attributed(optax_step):
  r = optax_step
  params = r.arguments["params"]
  assert r.consumers["gradient"] >= params, r.consumers  # every f32 gradient is live (and some bf16 ones)
  assert r.consumers["gradient"] <= 3 * params, r.consumers
  assert r.consumers["temporary"] < r.consumers["gradient"] / 4, r.consumers
  assert sum(r.consumers.values()) == r.footprint_bytes
  grads = [b for b in r.peak_buffers if b.kind == "gradient"]
  shapes = {b.shape for b in grads if b.dtype == "f32"}
  assert {f"[{D},{F}]", f"[{F},{D}]", f"[{VOCAB},{D}]"} <= shapes, r.peak_buffers
  # Gradients are the backward pass's own (or the optimizer's clipped ones), named by the user's line.
  assert all("transpose(jvp(" in b.op_name or "optax" in b.module or b.phase == "optimizer" for b in grads), grads
  assert any(b.source and "test_explain_user.py:" in b.source for b in grads), grads


def test_phases_ignore_copies_and_follow_the_ops(optax_step):
  """The backward region starts after the loss and is most of the schedule after it; the forward
  region is not stretched over the backward pass by copies of forward values."""
  regions = {name: (a, b) for name, a, b in optax_step.timeline.regions}
  assert set(regions) == {"forward", "backward", "optimizer"}, regions
  fwd, bwd = regions["forward"], regions["backward"]
  assert bwd[0] == fwd[1] + 1 and bwd[1] - bwd[0] > 0.2 * optax_step.timeline.length, regions


def test_the_three_peaks_are_said_apart(optax_step):
  text = render_explain(optax_step, "table")
  assert PEAKS_LINE in text.splitlines()
  for name in ("sum = footprint", "peak_bytes", "live_bytes_at_peak"):
    assert name in PEAKS_LINE


def test_kinds_limit_the_listed_buffers(optax_step):
  r = jaxmem.explain(jax.jit(_train_step, donate_argnums=(0, 1)), *_args(), target="cpu", top=5, kinds="gradient,residual")
  assert r.kinds == ("saved residual", "gradient")
  assert r.peak_buffers and {b.kind for b in r.peak_buffers} <= {"saved residual", "gradient"}, r.peak_buffers
  # The whole live set is still counted; only the list is filtered.
  assert r.by_kind == optax_step.by_kind and r.consumers == optax_step.consumers
  # Without the filter the parameters and moments crowd the list.
  assert any(b.kind == "parameter" for b in optax_step.peak_buffers[:5])
  assert explain_json(r)["peak_buffer_kinds"] == ["saved residual", "gradient"]
  assert "buffers listed: the largest of kind saved residual, gradient only" in render_explain(r, "table")


def test_parse_kinds():
  assert parse_kinds(None) == ()
  assert parse_kinds("temporary, residual") == ("saved residual", "temporary")
  assert parse_kinds(["saved residual", "parameter"]) == ("parameter", "saved residual")
  assert set(parse_kinds(",".join(KINDS))) == set(KINDS)
  with pytest.raises(JaxmemError, match="unknown buffer kind 'activation'; valid: parameter"):
    parse_kinds("temporary,activation")


def test_a_bad_kind_is_refused_before_compiling():
  with pytest.raises(JaxmemError, match="unknown buffer kind"):
    jaxmem.explain(lambda x: x, object(), kinds="weights")  # the object would fail a compile


def test_cli_kind(capsys):
  rc = main(["explain", "--model", "tiny", "--target", "tpu:v5e-1", "--batch", "2", "--seq", "16", "--top", "3",
             "--kind", "temporary", "--format", "json"])
  assert rc == 0
  import json

  doc = json.loads(capsys.readouterr().out)
  assert doc["peak_buffer_kinds"] == ["temporary"]
  assert {b["kind"] for b in doc["peak_buffers"]} <= {"temporary"}
  assert main(["explain", "--model", "tiny", "--target", "cpu", "--kind", "nope"]) == 2
  assert "unknown buffer kind 'nope'" in capsys.readouterr().err


_FACTORY = '''
def helper_that_breaks(batch):
  return {"a": 1}["missing"]  # <- the line the traceback must show


def make_step(*, batch, seq, remat):
  return helper_that_breaks(batch)
'''


def _factory_failure(tmp_path, monkeypatch, capsys, traceback: str) -> tuple[int, str]:
  """``explain --step`` on a factory that raises, through the CLI's ``main`` (what ``python -m
  jaxmem`` runs): its exit status and stderr."""
  path = tmp_path / "broken_step.py"
  path.write_text(textwrap.dedent(_FACTORY))
  monkeypatch.setenv("JAXMEM_TRACEBACK", traceback)
  rc = main(["explain", "--step", f"{path}:make_step", "--target", "cpu", "--batch", "2", "--seq", "8"])
  return rc, capsys.readouterr().err


def test_a_factory_failure_is_one_line_with_a_hint(tmp_path, monkeypatch, capsys):
  rc, stderr = _factory_failure(tmp_path, monkeypatch, capsys, "0")
  err = stderr.strip().splitlines()
  assert rc == 2, stderr
  assert len(err) == 1 and "raised at batch 2, seq 8: KeyError" in err[0] and "JAXMEM_TRACEBACK=1" in err[0], err


def test_jaxmem_traceback_prints_the_users_traceback(tmp_path, monkeypatch, capsys):
  rc, stderr = _factory_failure(tmp_path, monkeypatch, capsys, "1")
  assert rc == 2, stderr
  assert "Traceback (most recent call last)" in stderr, stderr
  assert "helper_that_breaks" in stderr and "broken_step.py" in stderr, stderr
  assert "The above exception was the direct cause" in stderr, stderr
  assert stderr.strip().splitlines()[-1].startswith("jaxmem: error: step"), stderr


_EXIT_SCRIPT = '''
import jaxmem
r = jaxmem.explain(model="tiny", batch=2, seq=16, target="tpu:v5e-1")
print("peak", r.peak_bytes, flush=True)
'''


@pytest.mark.slow  # a fresh interpreter and a TPU compile; the test below holds the cause (no executable left)
@pytest.mark.needs_tpu_compiler
def test_a_script_that_explains_for_a_tpu_exits_0(tmp_path):
  """A script exited 2 at interpreter exit after explain (libtpu's teardown)."""
  script = tmp_path / "explain_and_exit.py"
  script.write_text(_EXIT_SCRIPT)
  p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False)
  assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
  assert p.stdout.startswith("peak ")


def test_the_executable_compiled_with_the_dump_is_not_kept(optax_step):
  """explain reads everything from the executable it compiled with XLA's dump on and releases it
  (it is not left for the interpreter's teardown); the report's figures are all there."""
  assert optax_step.report.compiled is None
  assert optax_step.report.temp_size_in_bytes and optax_step.report.flops
