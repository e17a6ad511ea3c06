"""One description of the mesh's axes: the sharding rules say which mesh axes split
the batch, sequence, heads, experts and layers, ``mesh_axes`` turns them into the
:class:`~jaxmem.models.MeshAxes` of one mesh, and every ``shard_map`` in ``models/`` takes its
specs from it. A new batch axis added to the rules alone reaches every one of them.
"""

from __future__ import annotations

import ast
import pathlib

import jax
import pytest
from jax.sharding import PartitionSpec as P

from jaxmem import mesh as mesh_description
from jaxmem.hardware.targets import get_target
from jaxmem.models import get_config
from jaxmem.models.attention_kernels import cudnn_version
from jaxmem.models.mesh_axes import MeshAxes
from jaxmem.program import sharding as shd
from jaxmem.program.optimizers import OPTIMIZERS
from jaxmem.program.remat import REMAT_POLICIES
from jaxmem.program.train import build_train_program

MODELS = pathlib.Path(__file__).resolve().parent.parent / "models"


def test_mesh_axes_follow_the_rules():
  axes = shd.mesh_axes({"data": 2, "fsdp": 1, "tensor": 2, "expert": 2})
  # fsdp=1 splits nothing; expert splits the batch after data, as the activation rule says.
  assert (axes.batch, axes.seq, axes.heads, axes.experts, axes.mlp, axes.layers) == (
      ("data", "expert"), (), ("tensor",), ("expert",), ("tensor",), ()
  )
  assert axes.ways("batch") == 4 and axes.ways("seq") == 1
  assert axes.spec("batch", "seq", None) == P(("data", "expert"), None, None)
  # An axis serves the first dimension that takes it, as logical_to_spec does.
  assert axes.spec("experts", "batch") == P("expert", "data")
  assert axes.describe("batch") == "data=2 x expert=2"
  assert shd.data_parallel_size((("data", 2), ("expert", 2), ("tensor", 2))) == 4


def test_mesh_axes_refuse_axes_the_mesh_does_not_split():
  with pytest.raises(ValueError, match="size > 1"):
    MeshAxes(sizes=(("data", 2),), batch=("fsdp",), seq=(), heads=(), experts=(), mlp=(), layers=())
  with pytest.raises(ValueError, match="unknown MeshAxes dimension"):
    shd.mesh_axes({"data": 2}).spec("embed")


@pytest.fixture
def pod_rules(monkeypatch):
  """The rules with one more mesh axis, ``pod``, that splits the batch (first, as a slower
  outer data-parallel axis would); nothing else changed."""
  monkeypatch.setattr(mesh_description, "MESH_AXES", ("pod", *mesh_description.MESH_AXES))
  monkeypatch.setitem(shd.ACTIVATION_RULES, "batch", ("pod", *shd.ACTIVATION_RULES["batch"]))


@pytest.fixture
def shard_maps(monkeypatch):
  """Every ``jax.shard_map`` built while the test runs: (mesh axis names, in_specs, out_specs)."""
  calls: list[tuple[tuple[str, ...], tuple, object]] = []
  real = jax.shard_map

  def recording(f, *, mesh, in_specs, out_specs, **kwargs):
    calls.append((tuple(mesh.axis_names), tuple(in_specs), out_specs))
    return real(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, **kwargs)

  monkeypatch.setattr(jax, "shard_map", recording)
  return calls


def _first_axes(spec: P) -> tuple[str, ...]:
  entry = spec[0]
  return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


# Each shard_map in models/: the MoE layer's dropless experts (moe_parallel) and the fused
# attention kernels (attention_kernels), traced in a whole train step (not compiled).
CASES = {
    "dropless-experts": dict(model="tiny-moe", target="cpu:8", mesh="pod=2,data=2,expert=2", attention="dot", batch=8, seq=32),
    "splash": dict(model="tiny", target="tpu:v5e-4", mesh="pod=2,tensor=2", attention="splash", batch=4, seq=128),
    "cudnn": dict(model="tiny", target="gpu:h100x4", mesh="pod=2,tensor=2", attention="cudnn", batch=4, seq=128),
    "triton": dict(model="tiny", target="gpu:h100x4", mesh="pod=2,tensor=2", attention="triton", batch=4, seq=128),
    # Attention across a context-sharded sequence (context_attention), both strategies.
    "context-all-gather": dict(model="tiny", target="cpu:8", mesh="pod=2,context=4", attention="chunked", batch=2, seq=64),
    "context-ring": dict(model="tiny", target="cpu:8", mesh="pod=2,context=4", attention="chunked", batch=2, seq=64,
                         context_strategy="ring"),
}
MARKS = {
    "splash": [pytest.mark.needs_tpu_compiler],
    "cudnn": [pytest.mark.needs_gpu_compiler("h100"), pytest.mark.skipif(cudnn_version() is None, reason="cuDNN not installed")],
    "triton": [pytest.mark.needs_gpu_compiler("h100")],
}


@pytest.mark.parametrize("case", [pytest.param(k, marks=MARKS.get(k, [])) for k in CASES])
def test_a_new_batch_axis_reaches_every_shard_map(case, pod_rules, shard_maps):
  c = CASES[case]
  mesh = shd.parse_mesh(c["mesh"])
  program = build_train_program(
      get_config(c["model"]), remat=REMAT_POLICIES["none"], optimizer=OPTIMIZERS["sgd"], batch=c["batch"],
      seq=c["seq"], target=get_target(c["target"]), mesh=mesh,
      options={"attention": c["attention"], "context_strategy": c.get("context_strategy")},
  )
  if c["attention"] != "dot":
    assert program.attention.name == c["attention"]
  program.trace()
  assert shard_maps, f"{case}: no shard_map traced"
  for names, in_specs, out_specs in shard_maps:
    assert names[0] == "pod"
    # The first three operands are the tokens, their router weights and chosen experts (MoE)
    # or q, k, v (attention): their batch dimension is split by pod first, then the rest of
    # the rule; so is the output. pod splits nothing else: expert weights enter whole over it.
    for spec in (*in_specs[:3], out_specs):
      assert _first_axes(spec)[:1] == ("pod",), (case, in_specs, out_specs)
    for spec in in_specs[3:]:
      assert "pod" not in _axes(spec), (case, spec)


def _axes(spec: P) -> set[str]:
  return {a for e in spec if e is not None for a in ((e,) if isinstance(e, str) else e)}


def test_every_shard_map_in_models_goes_through_mesh_axes():
  """``jax.shard_map`` is called only by ``mesh_axes.shard_map`` (which checks the MeshAxes
  against the mesh), and only the modules the test above traces call that: a new shard_map
  site must be added to its cases."""
  direct, wrapped = set(), set()
  for path in MODELS.glob("*.py"):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Call):
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "shard_map":
          direct.add(path.name)
        elif isinstance(f, ast.Name) and f.id == "shard_map":
          wrapped.add(path.name)
  assert direct == {"mesh_axes.py"}
  # pipeline.py's shard_maps (the stage rotation and the first stage's outputs) split the stage
  # axis first: their specs come from MeshAxes too, and tests/test_pipeline.py runs them.
  assert wrapped == {"attention_kernels.py", "context_attention.py", "moe_parallel.py", "pipeline.py"}
