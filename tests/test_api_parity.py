"""The Python API answers as the CLI does: a target by name resolved once for every entry point
(capacity, verdict, the arguments' check, notes), and the attention note raised by what the
program computes (a batched dot of queries and keys, a softmax over it, a dot with the values),
not by a value's shape."""

from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import pytest

import jaxmem
from jaxmem.cli import main
from jaxmem.compiler.traps import attention_scores, kernel_note
from jaxmem.errors import JaxmemError
from jaxmem.hardware.targets import get_target, resolved_target
from jaxmem.resolve import resolve_target
from jaxmem.workload import Workload

D, HEADS = 32, 2


def _attention(x_btd, w):
  """Multi-head attention written as plain einsums, as a user would."""
  b, t, _ = x_btd.shape
  q, k, v = (jnp.einsum("btd,de->bte", x_btd, w[n]).reshape(b, t, HEADS, D // HEADS) for n in "qkv")
  s_bnts = jnp.einsum("btnh,bsnh->bnts", q, k) / jnp.sqrt(D // HEADS)
  p_bnts = jax.nn.softmax(s_bnts, axis=-1)
  return jnp.einsum("bnts,bsnh->btnh", p_bnts, v).reshape(b, t, D) @ w["o"]


def make_attention_step(*, batch, seq, remat):
  """A plain-einsum attention layer's gradient step (a factory as ``--step`` takes it)."""

  def train_step(w, x_btd):
    grads = jax.grad(lambda w: (_attention(x_btd, w) ** 2).mean())(w)
    return jax.tree.map(lambda p, g: p - 1e-3 * g, w, grads)

  w = {n: jax.ShapeDtypeStruct((D, D), jnp.float32) for n in "qkvo"}
  return train_step, (w, jax.ShapeDtypeStruct((batch, seq, D), jnp.float32)), {"donate_argnums": (0,)}


def make_square_mlp_step(*, batch, seq, remat):
  """An MLP as wide as the sequence is long: [batch, seq, seq] activations, no attention."""

  def train_step(ws, x_btd):
    def loss(ws):
      h = x_btd
      for w in ws:
        h = jax.nn.softmax(jnp.einsum("btd,de->bte", h, w), axis=-1)  # a softmax, but over a weight's product
      return (h**2).mean()

    return [w - 1e-3 * g for w, g in zip(ws, jax.grad(loss)(ws), strict=True)]

  ws = [jax.ShapeDtypeStruct((seq, seq), jnp.float32) for _ in range(2)]
  return train_step, (ws, jax.ShapeDtypeStruct((batch, seq, seq), jnp.float32)), {}


def _jaxpr(fn, *args):
  return jax.jit(fn).trace(*args).jaxpr.jaxpr


# ----------------------------------------------------------------------------- the pattern


Q = jax.ShapeDtypeStruct((2, 128, 4, 16), jnp.bfloat16)  # [B, T, N, H]


@pytest.mark.parametrize("attend", [
    lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True),
    lambda q, k, v: jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(jnp.einsum("btnh,bsnh->bnts", q, k), -1), v),
], ids=["dot_product_attention", "einsum"])
def test_plain_attention_is_found_forward_and_backward(attend):
  assert attention_scores(_jaxpr(attend, Q, Q, Q)) == (2, 4, 128, 128)
  loss = lambda q, k, v: attend(q, k, v).astype(jnp.float32).sum()  # noqa: E731
  assert attention_scores(_jaxpr(jax.grad(loss, argnums=(0, 1, 2)), Q, Q, Q)) == (2, 4, 128, 128)
  note = kernel_note(_jaxpr(attend, Q, Q, Q), "tpu")
  assert "[2,4,128,128] scores" in note and "splash" in note and "docs/examples.md" in note
  assert "cuDNN" in kernel_note(_jaxpr(attend, Q, Q, Q), "gpu")
  assert kernel_note(_jaxpr(attend, Q, Q, Q), "cpu") is None  # the CPU runs what it was given


def test_maxtexts_order_is_attention_and_a_blockwise_softmax_is_not():
  from models.attention_ops import chunked_attend, dot_attend

  q = jax.ShapeDtypeStruct((2, 512, 4, 16), jnp.bfloat16)
  # MaxText's order: the unnormalised exponentials times v, then divided by their sum.
  assert attention_scores(_jaxpr(dot_attend, q, q, q)) == (2, 4, 512, 512)
  assert attention_scores(_jaxpr(functools.partial(dot_attend, scores_dtype="float32"), q, q, q)) == (2, 4, 512, 512)
  # An online softmax over key blocks keeps no [T, S] scores, forward or backward.
  loss = lambda q, k, v: chunked_attend(q, k, v).astype(jnp.float32).sum()  # noqa: E731
  assert attention_scores(_jaxpr(chunked_attend, q, q, q)) is None
  assert attention_scores(_jaxpr(jax.grad(loss), q, q, q)) is None


def test_square_activations_without_attention_are_not_attention():
  fn, args, _ = make_square_mlp_step(batch=8, seq=256, remat=None)
  jaxpr = _jaxpr(fn, *args)
  # The shape the old test went by is there: [8, 256, 256] = [B, T, T].
  assert any(tuple(v.aval.shape) == (8, 256, 256) for e in jaxpr.eqns for v in e.outvars)
  assert attention_scores(jaxpr) is None and kernel_note(jaxpr, "tpu") is None


# ----------------------------------------------------------------------------- one target resolution


@pytest.mark.needs_tpu_compiler
def test_every_entry_point_resolves_a_target_name_alike():
  named = resolved_target("tpu:v5p-8")
  assert named.capacity_bytes is not None and named.capacity_bytes == jaxmem.target("tpu:v5p-8").capacity_bytes
  assert resolve_target(Workload(target="tpu:v5p-8")) == named
  assert resolved_target(get_target("tpu:v5p-8")) == named  # a Target made without its capacity gets it
  held = resolved_target("tpu:v5p-8", resident=1 << 30)
  assert held.capacity_bytes == named.capacity_bytes - (1 << 30) and resolved_target(held, resident=1 << 30) == held
  with pytest.raises(JaxmemError, match="already holds"):
    resolved_target(held, resident=1 << 20)


@pytest.mark.needs_tpu_compiler
def test_arguments_over_a_named_targets_capacity_are_refused_without_a_compile(monkeypatch):
  import jaxmem.compiler.figures as figures

  monkeypatch.setattr(figures, "compile_timed", lambda *a, **k: pytest.fail("compiled"))
  big = jax.ShapeDtypeStruct((1 << 36,), jnp.float32)  # 256 GiB on each of the devices it is replicated on
  with pytest.raises(JaxmemError, match="the arguments alone need"):
    jaxmem.analyze(lambda x: x * 2, big, target="tpu:v5p-8")
  with pytest.raises(JaxmemError, match="cannot fit"):
    jaxmem.explain(lambda x: x * 2, big, target="tpu:v5p-8")


@pytest.mark.needs_tpu_compiler
def test_analyze_and_explain_answer_as_explain_step_does_on_a_tpu(capsys):
  argv = ["explain", "--step", f"{__file__}:make_attention_step", "--target", "tpu:v5p-8", "--batch", "2",
          "--seq", "128", "--format", "json"]
  assert main(argv) == 0
  cli = json.loads(capsys.readouterr().out)
  fn, args, jit_kwargs = make_attention_step(batch=2, seq=128, remat=None)
  report = jaxmem.analyze(fn, *args, target="tpu:v5p-8", **jit_kwargs)
  explained = jaxmem.explain(fn, *args, target="tpu:v5p-8", **jit_kwargs)
  assert cli["capacity_bytes"] is not None and cli["verdict"] == "yes"
  for r in (report, explained):
    assert (r.capacity_bytes, r.fits, r.verdict) == (cli["capacity_bytes"], cli["fits"], cli["verdict"])
  assert list(explained.notes) == cli["notes"]
  assert set(report.notes) <= set(cli["notes"])  # explain adds what it reads of the buffers
  (attention,) = [n for n in cli["notes"] if n.startswith("attention:")]
  assert "[2,2,128,128] scores" in attention and attention in report.notes
  assert any(n.startswith("capacity_bytes:") for n in report.notes)
  # A step's explanation shows no step time, so it says nothing of its MFU.
  assert not any(n.startswith(("mfu:", "step time:", "step_time_s:")) for n in cli["notes"])


@pytest.mark.needs_tpu_compiler
def test_step_rows_get_the_attention_note_from_attention_alone():
  (attention,) = jaxmem.compare(step=make_attention_step, target="tpu:v5e-1", batch=2, seq=128, remat="none")
  (square,) = jaxmem.compare(step=make_square_mlp_step, target="tpu:v5e-1", batch=8, seq=256, remat="none")
  assert any(n.startswith("attention: the program materialises [2,2,128,128] scores") for n in attention.notes)
  assert not any(n.startswith("attention:") for n in square.notes)
