"""Korthikanti et al. 2022 in jaxmem: Megatron sequence parallelism, selective
recomputation, dropout and the GPT-3 shapes. The compiled checks (comm kinds, temp) share one
module-scoped sweep on the tiny GPT-2 model (tpu:v5e-8, tensor=4: four compiles) and are slow;
the unmarked tests cover the same code paths by tracing or planning without compiling."""

from __future__ import annotations


import jax
import jax.numpy as jnp
import pytest

import jaxmem
from jaxmem.buffers.residuals import saved_residuals_for
from jaxmem.compiler.flops import jaxpr_flops
from jaxmem.errors import JaxmemError
from jaxmem.models import StepChoices, count_params, get_config
from jaxmem.resolve import plan
from jaxmem.program import sharding as shd
from jaxmem.program.remat import REMAT_POLICIES

WORK = dict(model="tiny-gpt2", target="tpu:v5e-8", mesh="tensor=4,fsdp=2", batch=4, seq=128, attention="dot")


@pytest.fixture(scope="module")
def rows():  # 4 TPU compiles: used by the slow tests only
  """(remat, sequence_parallel) -> row: none and selective, with and without sequence parallelism."""
  out = {}
  for sp in (False, True):
    for r in jaxmem.compare(**WORK, remat="none,selective", sequence_parallel=sp):
      assert r.error is None, r.error
      out[r.remat, sp] = r
  return out


@pytest.mark.slow
def test_sequence_parallel_trades_all_reduce_for_reduce_scatter_and_all_gather(rows):
  tp, sp = rows["none", False], rows["none", True]
  assert sp.sequence_parallel and not tp.sequence_parallel
  assert sp.comm_reduce_scatter_bytes > tp.comm_reduce_scatter_bytes
  assert sp.comm_all_gather_bytes > tp.comm_all_gather_bytes
  assert sp.comm_all_reduce_bytes < tp.comm_all_reduce_bytes / 2


@pytest.mark.slow
def test_selective_keeps_less_and_recomputes(rows):
  for sp in (False, True):
    none, sel = rows["none", sp], rows["selective", sp]
    assert sel.temp_size_in_bytes <= none.temp_size_in_bytes
    assert sel.recompute_overhead_pct > 0


def test_selective_recomputes_exactly_the_attention_core():
  """JAX's residual listing: selective keeps none of the [.., T, S] score-shaped tensors (scores,
  exponentials, the probabilities' dropout mask) and everything else none keeps."""
  cfg, choices = get_config("tiny-gpt2"), StepChoices(dropout=0.1)
  t = 32

  def listing(remat):
    r = saved_residuals_for(cfg, REMAT_POLICIES[remat], batch=2, seq=t, choices=choices)
    return [x for x in r.residuals if not x.is_input]

  def scores(rs):
    return [x for x in rs if len(x.shape) >= 4 and x.shape[-2:] == (t, t)]

  none, sel = listing("none"), listing("selective")
  assert scores(none) and not scores(sel)
  # The rest is kept as without remat: the norms' and the MLP's [B, T, *] tensors alike ...
  rest = lambda rs: sorted((x.shape, x.dtype) for x in rs if len(x.shape) == 3 and x.shape[:2] == (2, t))  # noqa: E731
  assert rest(sel) == rest(none)
  # ... and the core's inputs q, k, v are what its recomputation starts from.
  assert {"query_proj", "key_proj", "value_proj", "context"} <= {x.name for x in sel}


def _step(dropout: float = 0.0, *, remat: str = "none", sequence_parallel: bool = False, **fields):
  from jaxmem.program.optimizers import OPTIMIZERS
  from jaxmem.program.train import build_train_program

  w = {**dict(model="tiny-gpt2", target="cpu", batch=2, seq=16), **fields}
  p = plan(**w, remat="none", dropout=dropout, sequence_parallel=sequence_parallel)
  return build_train_program(
      p.cfg, choices=p.choices, remat=REMAT_POLICIES[remat], optimizer=OPTIMIZERS["adamw"], batch=p.batch,
      seq=p.seq, target=p.target, mesh=p.meshes[0], options={"attention": "dot", "sequence_parallel": sequence_parallel},
  )


def _step_jaxpr(dropout: float) -> tuple[str, int]:
  prog = _step(dropout)
  return str(prog.trace().jaxpr), len(prog.args)


def test_sequence_parallel_splits_the_stream_over_tensor_in_the_step():
  """The traced step's sharding constraints: [B, T, D] split (fsdp, tensor, -) only under
  sequence parallelism (the compiled comm kinds: the slow test above)."""
  split = "P('fsdp', 'tensor', None)"
  mesh = dict(target="cpu:8", mesh="tensor=4,fsdp=2", batch=4, seq=64)
  assert split not in str(_step(**mesh).trace().jaxpr)
  assert str(_step(sequence_parallel=True, **mesh).trace().jaxpr).count(split) >= 6  # stream, norms, outputs


def test_selective_recomputes_flops():
  none = jaxpr_flops(_step(0.1).trace().jaxpr.jaxpr)
  sel = jaxpr_flops(_step(0.1, remat="selective").trace().jaxpr.jaxpr)
  assert sel > none


def test_dropout_zero_leaves_the_step_as_it_was_and_dropout_draws_byte_masks():
  text0, nargs0 = _step_jaxpr(0.0)
  text1, nargs1 = _step_jaxpr(0.1)
  assert nargs0 == 4 and "random_bits" not in text0 and "threefry" not in text0
  assert nargs1 == 5 and ("random_bits" in text1 or "threefry" in text1)
  assert "bool" in text1


def test_dropout_masks_are_saved_one_byte_each():
  cfg = get_config("tiny-gpt2")
  from jaxmem.models.block import Block
  from flax import nnx
  block = nnx.eval_shape(lambda: Block(cfg, choices=StepChoices(dropout=0.1), rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(block)
  from jaxmem.models.dropout import Dropout
  from jax._src.ad_checkpoint import saved_residuals

  def layer(s, x, key):
    return nnx.merge(graphdef, s)(x, rope=(None, None), constrain=lambda x, _: x,
                                  dropout=Dropout(0.1, key))

  x = jax.ShapeDtypeStruct((2, 32, cfg.d_model), jnp.bfloat16)
  listing = saved_residuals(layer, state, x, jax.random.key(0))
  masks = [a for a, _ in listing if a.dtype == jnp.bool_]
  shapes = sorted(tuple(a.shape) for a in masks)
  assert shapes.count((2, 32, cfg.d_model)) == 2  # the attention and MLP outputs' masks
  assert any(len(s) == 5 and s[-2:] == (32, 32) for s in shapes)  # the attention probabilities'


@pytest.mark.parametrize(
    "fields,match",
    [
        (dict(mesh="fsdp=8", sequence_parallel=True), "has none; add tensor=N"),
        (dict(mesh="tensor=4,fsdp=2", seq=66, sequence_parallel=True), "not divisible by tensor=4; use a multiple of 4"),
        (dict(mesh="tensor=2,sequence=2,fsdp=2", seq=38, sequence_parallel=True), "x the sequence axes"),
        (dict(mesh="tensor=4,fsdp=2", dropout=1.0), r"probability in \[0, 1\)"),
        (dict(mesh="tensor=4,fsdp=2", dropout="x"), r"probability in \[0, 1\)"),
    ],
)
def test_bad_input_is_one_line(fields, match):
  with pytest.raises(JaxmemError, match=match) as info:
    plan(**{**dict(model="tiny-gpt2", target="cpu:8", batch=8, seq=64, remat="none"), **fields})
  assert "\n" not in str(info.value)


def test_sequence_parallel_rules_split_the_residual_stream_over_tensor():
  rules = shd.activation_rules(sequence_parallel=True)
  assert rules["norm_seq"][-1] == "tensor" and "tensor" not in rules["seq"]
  assert shd.activation_rules()["norm_seq"] == shd.ACTIVATION_RULES["seq"]  # off: the stream as before


@pytest.mark.parametrize("name,billions", [("gpt3-22b", 22), ("gpt3-175b", 175), ("gpt3-530b", 530), ("gpt3-1t", 1000)])
def test_gpt3_shapes_have_the_papers_sizes(name, billions):
  cfg = get_config(name)
  assert cfg.style == "gpt2" and cfg.max_seq_len == 2048 and cfg.d_ff == 4 * cfg.d_model
  assert abs(count_params(cfg) / 1e9 / billions - 1) < 0.01  # table 3: 22B, 175B, 530B, 1T


def test_validate_hands_the_options_to_its_measuring_process():
  from jaxmem.cli import build_parser, validate as validate_cli
  from jaxmem.planning import validate
  from jaxmem.workload import Workload

  w = Workload(model="tiny", batch=4, seq=32, mesh="tensor=2,fsdp=2", sequence_parallel=True, dropout=0.1)
  args = build_parser().parse_args(["_measure", *validate.argv(w)])
  assert validate_cli._workload(args) == w.replace(target="attached")


def test_the_options_key_the_row_cache_and_show_in_the_heading():
  from jaxmem.render.tables import _dtypes

  w = dict(model="tiny-gpt2", target="cpu:8", mesh="tensor=4,fsdp=2", batch=8, seq=64, remat="none")
  keys = {plan(**w, **extra).tasks()[0].cache_key()
          for extra in ({}, {"sequence_parallel": True}, {"dropout": 0.1})}
  assert len(keys) == 3
  from types import SimpleNamespace as Row

  row = dict(param_dtype="float32", dtype="bfloat16", sequence_parallel=True, dropout=0.1, master_dtype=None,
             moments_dtype=None, grad_reduce_dtype=None)
  assert "sequence parallel" in _dtypes(Row(**row)) and "dropout 0.1" in _dtypes(Row(**row))
  assert "sequence" not in _dtypes(Row(**{**row, "sequence_parallel": False, "dropout": 0.0}))
