"""The ``stage`` mesh axis: the layer stack pipelined over it, GPipe and
MaxText's circular schedule (jaxmem.models.pipeline), on tiny with 4 layers and simulated CPU
devices. The pipelined step computes the unpipelined step's loss and gradients; the rules put
1/stage of the decoder layers on each device; the rows carry the schedule and its figures.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxmem.hardware.targets import get_target
from jaxmem.errors import JaxmemError
from jaxmem.models import Transformer, get_config
from jaxmem.models.pipeline import Pipeline, bubble_fraction, in_flight_1f1b, storage_order
from jaxmem.resolve import plan
from jaxmem.planning.sweep import run_config
from jaxmem.program import sharding as shd
from jaxmem.program.optimizers import OPTIMIZERS
from jaxmem.program.pipelining import PipelineOptions, one_f_one_b
from jaxmem.program.remat import REMAT_POLICIES
from jaxmem.program.train import build_train_program, tree_bytes_per_device

DEEP = dataclasses.replace(get_config("tiny"), name="tiny-4", num_layers=4)


def _grads(mesh_spec: str, *, microbatches: int, repeats: int, remat=None, batch: int = 4):
  """Loss and gradients of tiny-4 (float32 compute) unpipelined and pipelined over ``mesh_spec``,
  the pipelined parameters in the pipeline's storage order and its gradients put back."""
  cfg = dataclasses.replace(DEEP, dtype="float32")
  mesh = get_target(f"cpu:{shd.mesh_size(shd.parse_mesh(mesh_spec))}").make_mesh(shd.parse_mesh(mesh_spec))
  graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param)
  tokens = jax.random.randint(jax.random.key(1), (batch, 8), 0, cfg.vocab_size)
  pipe = Pipeline(mesh=mesh, axes=shd.mesh_axes(mesh), microbatches=microbatches, repeats=repeats)
  constrain = shd.activation_constrainer(mesh)

  def loss(p, pipeline):
    return nnx.merge(graphdef, p).loss(tokens, tokens, constrain=constrain, pipeline=pipeline, remat=remat)

  order = storage_order(cfg.num_layers, pipe.stages, repeats)
  stored = jax.tree.map(lambda a: a, params)
  stored["blocks"] = jax.tree.map(lambda a: a[order], params["blocks"])
  plain = jax.jit(jax.value_and_grad(lambda p: loss(p, None)))(params)
  piped_loss, piped = jax.jit(jax.value_and_grad(lambda p: loss(p, pipe)))(stored)
  piped["blocks"] = jax.tree.map(lambda a: a[np.argsort(order)], piped["blocks"])
  return plain, (piped_loss, piped)


def _assert_same(plain, piped):
  (l0, g0), (l1, g1) = plain, piped
  np.testing.assert_allclose(l1, l0, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1), strict=True):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-4, atol=2e-6 * float(jnp.abs(a).max()))


@pytest.mark.slow  # two compiles, ~15 s of CPU; test_the_pipelined_vjp_is_one_scan_with_ppermutes traces the same code
def test_circular_pipeline_gradients_equal_the_unpipelined_steps():
  """stage=2, two repeats (each stage holds layers 0 and 2, or 1 and 3), two microbatches: the
  repeat gather, the last stage's outputs fed back to the first, and the VJP through the scan."""
  _assert_same(*_grads("stage=2", microbatches=2, repeats=2))


@pytest.mark.slow
def test_gpipe_gradients_equal_the_unpipelined_steps_under_remat_with_fsdp():
  _assert_same(*_grads(
      "stage=4,fsdp=2", microbatches=4, repeats=1, remat=jax.checkpoint_policies.nothing_saveable, batch=8
  ))


def test_storage_order_puts_each_repeat_on_its_stage():
  # 8 layers, 2 stages, 2 repeats: stage 0 holds groups 0 and 2 (layers 0,1 and 4,5).
  assert storage_order(8, 2, 2).tolist() == [0, 1, 4, 5, 2, 3, 6, 7]
  assert storage_order(8, 4, 1).tolist() == list(range(8))


def _program(mesh: str, **kw):
  spec = shd.parse_mesh(mesh)
  return build_train_program(
      DEEP, remat=REMAT_POLICIES["full"], optimizer=OPTIMIZERS["adamw"], batch=8, seq=16,
      target=get_target(f"cpu:{shd.mesh_size(spec)}"), mesh=spec, options={"attention": "chunked", **kw},
  )


def _layer_bytes(program) -> tuple[int, int]:
  """(decoder layers' bytes per device, all parameters' bytes per device) from the shardings."""
  params = program.args[0]
  shardings = jax.tree.map(lambda a: a.sharding, params)
  return tree_bytes_per_device(params["blocks"], shardings["blocks"]), tree_bytes_per_device(params, shardings)


@pytest.mark.parametrize("stages", [2, 4])
def test_layer_parameters_per_device_divide_by_the_stages(stages):
  piped = _program(f"stage={stages},fsdp=2", pipeline_microbatches=stages)
  flat = _program(f"data={stages},fsdp=2")
  (layers_p, all_p), (layers_f, all_f) = _layer_bytes(piped), _layer_bytes(flat)
  assert layers_p * stages == layers_f
  # The embeddings, final norm and head are not split over stage: the whole model divides less.
  assert all_f / stages < all_p < all_f
  assert piped.pipeline.stages == stages and flat.pipeline is None


def test_bubble_fraction_and_1f1b_in_flight():
  assert bubble_fraction(4, 4) == pytest.approx(3 / 7)
  assert bubble_fraction(4, 8, 2) == pytest.approx(3 / 19)
  assert bubble_fraction(1, 8) == 0
  # 1F1B: S microbatches of the stage's layers in flight; interleaved adds S - 1 groups.
  assert in_flight_1f1b(4, 16) == 4
  assert in_flight_1f1b(4, 16, 2) == 4 * 2 + 3
  # GPipe keeps M·R + S - 1 = 19 iterations; 1F1B 4: 15 stage activations fewer.
  assert one_f_one_b(1000, 10, 4, 16, 1) == 1000 - 15 * 10
  assert one_f_one_b(None, 10, 4, 16, 1) is None


@pytest.mark.parametrize(
    "fields, says",
    [
        (dict(mesh="stage=8", model=dataclasses.replace(DEEP, num_layers=6)), "does not divide"),
        (dict(mesh="stage=4,fsdp=2", pipeline_microbatches=2), "fewer than the 4 stages"),
        (dict(mesh="stage=2,fsdp=4", pipeline_microbatches=3, batch=8), "not divisible by 3 pipeline microbatches"),
        (dict(mesh="fsdp=8", pipeline_microbatches=2), "applies to meshes with a stage axis"),
        (dict(mesh="stage=2,fsdp=4", pipeline_repeats=4), "pipeline_repeats"),
        (dict(mesh="stage=2,fsdp=4", model="tiny-moe", moe_impl="dropless"), "use `moe_impl` capacity"),
    ],
)
def test_bad_pipelines_are_one_line_errors(fields, says):
  with pytest.raises(JaxmemError) as e:
    plan(**{"model": DEEP, "target": "cpu:8", "batch": 8, "seq": 16, "remat": "full", **fields})
  assert says in str(e.value) and "\n" not in str(e.value)


def test_pipeline_options_are_in_the_cache_key():
  meshes = ["stage=2,fsdp=4", "data=2,fsdp=4"]
  p = plan(model=DEEP, target="cpu:8", batch=16, seq=16, remat="full", mesh=meshes)
  q = plan(model=DEEP, target="cpu:8", batch=16, seq=16, remat="full", mesh=meshes, pipeline_microbatches=4)
  assert {t.cache_key() for t in p.tasks()}.isdisjoint(t.cache_key() for t in q.tasks())


def test_the_pipelined_vjp_is_one_scan_with_ppermutes():
  """The same program as the gradient tests, traced only (no compile): the gradients have the
  parameters' shapes, the forward and backward pipelines are scans of M·R + S - 1 iterations,
  and the stage inputs move by ppermute."""
  cfg = dataclasses.replace(DEEP, dtype="float32")
  mesh = get_target("cpu:2").make_mesh(shd.parse_mesh("stage=2"))
  graphdef, params = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))), nnx.Param)
  pipe = Pipeline(mesh=mesh, axes=shd.mesh_axes(mesh), microbatches=3, repeats=2)
  tokens = jax.ShapeDtypeStruct((6, 8), jnp.int32)

  def loss(p, t):
    return nnx.merge(graphdef, p).loss(t, t, constrain=shd.activation_constrainer(mesh), pipeline=pipe)

  jaxpr = jax.make_jaxpr(jax.grad(loss))(params, tokens)
  assert [a.shape for a in jaxpr.out_avals] == [a.shape for a in jax.tree.leaves(params)]
  text = str(jaxpr)
  assert text.count("length=7") >= 2 and "ppermute" in text  # 3 x 2 + 2 - 1 iterations, each way


def test_the_stash_reader_finds_what_a_scan_keeps_per_iteration():
  from jaxmem.hlo.stash import per_iteration_bytes

  def f(w, x):  # a scan of 5 iterations whose VJP keeps each iteration's [4, 8] f32 input (tanh')
    return jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), x, None, length=5)[0].sum()

  hlo = jax.jit(jax.grad(f)).lower(jnp.ones((8, 8)), jnp.ones((4, 8))).compile().as_text()
  assert per_iteration_bytes(hlo, 5) >= 4 * 8 * 4
  assert per_iteration_bytes(hlo, 6) is None


@pytest.fixture(scope="module")
def piped_row():
  p = plan(model=DEEP, target="cpu:2", batch=4, seq=16, remat="full", mesh="stage=2", pipeline_microbatches=2)
  mesh, opt, rp = p.configs()[-1]
  return run_config(p, mesh, opt, rp)


@pytest.mark.slow  # one compile of the whole step (~10 s of CPU); the pieces are tested above
def test_a_pipelined_row_carries_its_schedule_and_the_1f1b_estimate(piped_row):
  r = piped_row
  assert (r.stages, r.pipeline_microbatches, r.pipeline_repeats) == (2, 2, 1)
  assert r.bubble_fraction == pytest.approx(1 / 3)
  # Under full remat the loop keeps at least each iteration's stage input: 2 rows x 16 x 64 bf16.
  assert r.stage_activation_bytes >= 2 * 16 * 64 * 2
  assert r.required_1f1b_bytes < r.required_bytes
  assert any(n.startswith("required_1f1b_bytes: an estimate") for n in r.notes)


@pytest.mark.slow
def test_the_stash_grows_with_the_pipeline_microbatches_at_a_fixed_microbatch_size():
  def row(m):
    p = plan(model=DEEP, target="cpu:2", batch=2 * m, seq=16, remat="full", mesh="stage=2", pipeline_microbatches=m)
    return run_config(p, *p.configs()[-1])

  small, large = row(2), row(8)
  assert large.temp_size_in_bytes > small.temp_size_in_bytes
  assert large.stage_activation_bytes == small.stage_activation_bytes


def test_fit_and_scale_take_the_pipeline_options():
  from jaxmem.planning.fit import template
  from jaxmem.planning.scale import tasks
  from jaxmem.workload import Workload

  w = Workload(model=DEEP, target="cpu:8", seq=16, remat="full", mesh=("stage=2,fsdp=4", "data=2,fsdp=4"),
               pipeline_microbatches=4)
  # fit's smallest batch: the data axes (4) x the pipeline microbatches (4) on the stage mesh.
  assert template(w, "batch").batch == 16
  p, todo = tasks(w, {"batch": [16, 32]})
  assert PipelineOptions.of(p.options()) == PipelineOptions(microbatches=4)
  assert {t.workload.pipeline_microbatches for t in todo} == {4}


def test_infer_refuses_a_stage_axis_in_one_line():
  from jaxmem.inference.workload import plan_infer

  with pytest.raises(JaxmemError) as e:
    plan_infer(model="tiny", target="cpu:8", mesh="stage=2,fsdp=4", batch=8, context=64)
  assert "does not pipeline" in str(e.value) and "\n" not in str(e.value)


def test_dropout_with_a_stage_axis_is_refused_before_compiling():
  # The pipeline's iterations carry no dropout keys: dropping out there would silently do nothing.
  with pytest.raises(JaxmemError, match=r"`dropout` with a stage axis \(mesh stage=2,fsdp=4\) is not built"):
    plan(model="tiny", target="cpu:8", mesh="stage=2,fsdp=4", batch=8, seq=16, remat="none", dropout=0.1)
  assert plan(model="tiny", target="cpu:8", mesh="fsdp=8", batch=8, seq=16, remat="none", dropout=0.1).choices.dropout == 0.1
