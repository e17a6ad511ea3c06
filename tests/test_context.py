"""The ``context`` mesh axis: context parallelism as MaxText's rules have it.
It splits the sequence of activations (as ``sequence`` does) and every weight's ``embed``
dimension (as ``fsdp`` does), so ``context=8`` alone divides parameters, gradients and
optimizer state by 8. Compared here against ``sequence=8`` on the same 8 simulated CPU
devices: the activations are split alike, the model state is not.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from jaxmem.hardware.targets import get_target
from jaxmem.errors import JaxmemError
from jaxmem.models import choose_attention, get_config
from jaxmem.models.attention_registry import AttentionShapes
from jaxmem.program import sharding as shd
from jaxmem.program.optimizers import OPTIMIZERS
from jaxmem.program.remat import REMAT_POLICIES
from jaxmem.program.train import abstract_model, build_train_program

# tiny, widened so the vectors no mesh axis splits (the norms' scales, 1280 floats) are 0.2% of
# the parameters and the 1% test below is about the rules, not about them.
WIDE = dataclasses.replace(
    get_config("tiny"), name="tiny-wide", d_model=256, num_heads=4, num_kv_heads=4, head_dim=64, d_ff=512
)
SEQ = 256  # a global batch of one sequence: context splits the sequence, never the batch
MESHES = ("sequence=8", "context=8")


def _program(mesh: str):
  return build_train_program(
      WIDE, remat=REMAT_POLICIES["none"], optimizer=OPTIMIZERS["adamw"], batch=1, seq=SEQ,
      target=get_target("cpu:8"), mesh=shd.parse_mesh(mesh), options={"attention": "chunked"},
  )


def _gradient_bytes(program) -> int:
  """Bytes per device of the gradients alone, by the compiler: ``jax.grad`` of the step's loss
  over the program's sharded parameters, the gradients laid out as the parameters they update
  (as in the train step, where the optimizer's elementwise update consumes them; left to
  itself, a gradient-only program returns them replicated)."""
  graphdef, _, _ = abstract_model(WIDE)
  mesh = program.args[2].sharding.mesh
  constrain = shd.activation_constrainer(mesh)

  def loss(p, tokens_bt):
    return nnx.merge(graphdef, p).loss(tokens_bt, tokens_bt, constrain=constrain, attend=program.attention.attend)

  with program.lowering_context():
    param_sh = jax.tree.map(lambda a: a.sharding, program.args[0])
    compiled = jax.jit(jax.grad(loss), out_shardings=param_sh).trace(program.args[0], program.args[2]).lower().compile()
  return compiled.memory_analysis().output_size_in_bytes


@pytest.fixture(scope="module")
def compiled():
  """Each mesh's program, its compiled step and the gradients' bytes: four CPU compiles."""
  out = {}
  for mesh in MESHES:
    program = _program(mesh)
    out[mesh] = (program, program.lower().compile(), _gradient_bytes(program))
  return out


@pytest.mark.slow  # four cpu:8 compiles; context meshes compile in the fast suite through test_context_attention
def test_context_divides_parameters_gradients_and_optimizer_state_by_its_size(compiled):
  (seq_p, seq_c, seq_g), (ctx_p, ctx_c, ctx_g) = compiled["sequence=8"], compiled["context=8"]
  assert seq_p.param_bytes == seq_p.param_bytes_global  # sequence: every device holds all
  for what, one, eight in (
      ("parameters", seq_p.param_bytes, ctx_p.param_bytes),
      ("optimizer state", seq_p.optimizer_state_bytes, ctx_p.optimizer_state_bytes),
      ("gradients", seq_g, ctx_g),
      ("arguments (compiler)", seq_c.memory_analysis().argument_size_in_bytes, ctx_c.memory_analysis().argument_size_in_bytes),
  ):
    assert one / eight == pytest.approx(8, rel=0.01), what


@pytest.mark.slow  # shares the compiles above
def test_context_splits_the_sequence_of_activations(compiled):
  (seq_p, seq_c, _), (ctx_p, ctx_c, _) = compiled["sequence=8"], compiled["context=8"]
  assert ctx_p.args[2].sharding.spec == P(None, "context")  # the tokens
  d = WIDE.d_model
  for c in (seq_c, ctx_c):
    hlo = c.as_text()
    # The residual stream is [1, SEQ/8, d] on each device and never whole.
    assert re.search(rf"\[1,{SEQ // 8},{d}\]", hlo)
    assert not re.search(rf"\[1,{SEQ},{d}\]", hlo)
  # Less on each device than with every weight whole: the gradients are split too.
  assert ctx_c.memory_analysis().temp_size_in_bytes < seq_c.memory_analysis().temp_size_in_bytes


def test_context_rules():
  axes = shd.mesh_axes({"fsdp": 2, "sequence": 2, "context": 2})
  assert axes.seq == ("sequence", "context") and axes.batch == ("fsdp",)
  mesh = jax.sharding.Mesh(np.array(jax.devices("cpu")[:8]).reshape(2, 2, 2), ("fsdp", "sequence", "context"))
  # Weights: embed over fsdp and context together (MaxText's order), never over sequence.
  spec = shd.logical_to_spec(("embed", "mlp"), (256, 512), mesh, shd.PARAM_RULES, what="w")
  assert spec == P(("fsdp", "context"), None)
  assert shd.logical_to_spec(("batch", "seq", "embed"), (2, 64, 256), mesh, shd.ACTIVATION_RULES, what="x") == P(
      "fsdp", ("sequence", "context"), None
  )
  with pytest.raises(JaxmemError, match="embed=6 is not divisible by mesh fsdp=2 x context=2 = 4"):
    shd.logical_to_spec(("embed",), (6,), mesh, shd.PARAM_RULES, what="w")


@pytest.mark.parametrize("mesh,seq,nearest", [("context=8", 1001, 1000), ("context=8", 1005, 1008),
                                              ("sequence=2,context=4", 3, 8)])
def test_a_sequence_the_context_axis_cannot_divide_names_the_nearest(mesh, seq, nearest):
  with pytest.raises(JaxmemError) as err:
    shd.check_seq(shd.parse_mesh(mesh), seq)
  msg = str(err.value)
  assert "\n" not in msg and f"seq {seq}" in msg and f"nearest {nearest}" in msg and "context=" in msg


def test_splash_takes_a_context_sharded_sequence_in_whole_blocks_and_auto_falls_back_otherwise():
  # Over context=8, splash runs each device's two load-balanced chunks (models/context_attention.py):
  # 256 tokens are chunks of 16, less than its 128-lane block, so auto takes chunked and says why.
  shapes = AttentionShapes.of(get_config("tiny"), batch=2, seq=256)
  axes = shd.mesh_axes({"context": 8})
  choice = choose_attention("auto", platform="tpu", shapes=shapes, axes=axes)
  assert choice.name == "chunked"
  (note,) = [n for n in choice.notes if n.startswith("attention auto:")]
  assert "8 context shards" in note and "nearest 2048" in note
  with pytest.raises(JaxmemError, match="8 context shards"):
    choose_attention("splash", platform="tpu", shapes=shapes, axes=axes)
  assert choose_attention("auto", platform="tpu", shapes=dataclasses.replace(shapes, seq=2048, kv_seq=2048), axes=axes).name == "splash"
  # The sequence axis alone (activations only) still refuses the fused kernels.
  with pytest.raises(JaxmemError, match="sequence=8"):
    choose_attention("splash", platform="tpu", shapes=shapes, axes=shd.mesh_axes({"sequence": 8}))
