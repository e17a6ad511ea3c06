"""The one compile-to-figures step (jaxmem.compiler.figures): one call of the compiler,
every command's rows through it (infer's with communication and the refusal's FLOPs note), the
check of the arguments against the device before compiling, one
communication record, and an inference workload without a train step's fields."""

import ast
import dataclasses
import pathlib
import resource
import time

import jax
import pytest

import jaxmem
from jaxmem.compiler import figures
from jaxmem.compiler.figures import NOT_COMPILED, SPLIT_EVENLY, shape_argument_bytes
from jaxmem.errors import JaxmemError
from jaxmem.inference import infer as inf
from jaxmem.planning import sweep
from jaxmem.resolve import plan
from jaxmem.program.train import build_train_program
from jaxmem.records import Communication
from jaxmem.render.inference import render_infer
from jaxmem.workload import BaseWorkload, Workload

ROOT = pathlib.Path(jaxmem.__file__).parent
HUGE = 10**12  # a batch whose tokens alone are petabytes: nothing may compile or allocate it


def _compile_calls(path: pathlib.Path) -> list[int]:
  """Lines of ``path`` that call ``<something>.compile(...)`` (not ``re.compile``)."""
  lines = []
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "compile":
      if not (isinstance(node.func.value, ast.Name) and node.func.value.id == "re"):
        lines.append(node.lineno)
  return lines


def test_the_compiler_is_called_from_one_module():
  calls = {str(p.relative_to(ROOT.parent)): _compile_calls(p) for p in ROOT.rglob("*.py")}
  calls = {p: lines for p, lines in calls.items() if lines}
  assert list(calls) == ["jaxmem/xla.py"], calls


def _no_compile(monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError("compiled a program whose arguments exceed the device")

  monkeypatch.setattr(figures, "compile_timed", refuse)


@pytest.mark.needs_tpu_compiler
def test_tracing_a_huge_batch_allocates_nothing():
  # The check below relies on it: a trillion-sequence batch traces with abstract shapes only.
  p = plan(model="tiny", target="tpu:v5e-1", batch=HUGE, remat="none")
  m, opt, rp = p.configs()[0]
  before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  prog = build_train_program(p.cfg, remat=rp, optimizer=opt, batch=p.batch, seq=p.seq, target=p.target, mesh=m)
  prog.trace()
  grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
  assert grown_kib < 512 * 1024
  assert shape_argument_bytes(prog.args, 1) > HUGE * p.seq * 4  # tokens and targets, int32


@pytest.mark.needs_tpu_compiler
@pytest.mark.filterwarnings("ignore:Explicitly requested dtype int64")  # decode's positions past int32, traced only
def test_arguments_over_capacity_are_refused_without_compiling(monkeypatch):
  _no_compile(monkeypatch)
  start = time.perf_counter()
  (row,) = jaxmem.compare(model="tiny", target="tpu:v5e-1", batch=HUGE, remat="none")
  assert time.perf_counter() - start < 60
  assert row.fits is False and row.capacity_bytes and row.required_bytes > row.capacity_bytes
  assert row.error.startswith("not compiled: the arguments alone need")
  assert row.compile_seconds is None and row.argument_size_in_bytes is None
  assert row.program_flops and row.flops == row.program_flops  # one device: its FLOPs are the program's
  (irow,) = jaxmem.infer(model="tiny", target="tpu:v5e-1", batch=HUGE, phase="decode", context=64)
  assert irow.fits is False and irow.error.startswith("not compiled") and irow.required_bytes > irow.capacity_bytes
  with pytest.raises(JaxmemError, match="cannot fit.*not compiled"):
    jaxmem.explain(model="tiny", target="tpu:v5e-1", batch=HUGE)


@pytest.mark.needs_tpu_compiler
def test_always_compile_asks_the_compiler_where_the_shapes_alone_refuse(capsys):
  # A capacity of 1 MiB beside the resident bytes: tiny's arguments alone are over it.
  from jaxmem.cli import main
  from jaxmem.hardware.targets import target

  resident = target("tpu:v5e-1").capacity_bytes - (1 << 20)
  w = dict(model="tiny", target="tpu:v5e-1", batch=8, seq=128, remat="none", resident=resident, cache=False)
  (shapes,) = jaxmem.compare(**w)
  assert shapes.error.startswith("not compiled") and shapes.judged_figure == "argument bytes from shapes"
  (row,) = jaxmem.compare(**w, always_compile=True)
  assert row.fits is False and row.judged_figure == "compiler refusal" and "RESOURCE_EXHAUSTED" in row.error
  assert row.required_bytes > shapes.required_bytes  # the compiler's figure counts more than the arguments
  argv = ["compare", "--model", "tiny", "--target", "tpu:v5e-1", "--batch", "8", "--seq", "128", "--remat", "none",
          "--resident", str(resident), "--no-cache", "--format", "json", "--always-compile"]
  assert main(argv) == 0 and "compiler refusal" in capsys.readouterr().out
  # explain honours it too: the compiler's refusal, not the shapes'
  explain = {k: v for k, v in w.items() if k != "cache"}
  with pytest.raises(JaxmemError, match="cannot fit"):
    jaxmem.explain(**explain)
  with pytest.raises(JaxmemError, match="the compiler refused"):
    jaxmem.explain(**explain, always_compile=True)


@pytest.mark.needs_tpu_compiler
def test_arguments_over_capacity_on_several_devices_split_the_flops(monkeypatch):
  _no_compile(monkeypatch)
  (row,) = jaxmem.compare(model="tiny", target="tpu:v5e-4", batch=HUGE, remat="none")
  assert row.fits is False and NOT_COMPILED in row.notes and row.flops == pytest.approx(row.program_flops / 4)


def test_shape_bytes_bound_the_compiled_arguments(compile_one):
  # The check must never refuse what fits: from the shapes it is at most the compiler's figure,
  # replicated and sharded alike (fsdp divides the parameters and optimizer state).
  for mesh in ("fsdp=1", "fsdp=8"):
    target = "cpu:8" if mesh == "fsdp=8" else "cpu"
    p = plan(model="tiny", target=target, mesh=mesh, batch=8, seq=32, remat="none")
    m, opt, rp = p.configs()[0]
    prog = build_train_program(p.cfg, remat=rp, optimizer=opt, batch=p.batch, seq=p.seq, target=p.target, mesh=m)
    row = compile_one(model="tiny", target=target, mesh=mesh, batch=8, seq=32, remat="none")
    known = shape_argument_bytes(prog.args, p.target.num_devices)
    assert 0 < known <= row.argument_size_in_bytes
    assert known >= row.param_bytes + row.optimizer_state_bytes


def _refusing(monkeypatch):
  def refuse(*args, **kwargs):
    raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
                                     "temporaries (20.00G) exceeds available HBM (15.75G).")

  monkeypatch.setattr(figures, "compile_timed", refuse)


def test_every_command_refuses_alike(monkeypatch):
  # compare's and infer's rows come from one function: a refused compile on several devices has
  # the same fields and the same FLOPs note in both (infer's lacked the note before).
  _refusing(monkeypatch)
  (row,) = jaxmem.compare(model="tiny", target="cpu:8", batch=8, seq=32, remat="none")
  (irow,) = jaxmem.infer(model="tiny", target="cpu:8", batch=8, phase="decode", context=32)
  for r in (row, irow):
    assert r.error.startswith("RESOURCE_EXHAUSTED") and r.fits is False and r.required_bytes > 19 * 2**30
    assert SPLIT_EVENLY in r.notes
    assert r.program_flops and r.flops == pytest.approx(r.program_flops / 8)
    assert r.comm_bytes is None


@pytest.fixture(scope="module")
def infer_rows():
  return jaxmem.infer(model="tiny", target="cpu:8", batch=8, phase="decode", context=32, mesh="fsdp=8")


def test_infer_rows_carry_communication(infer_rows):
  (r,) = infer_rows
  assert r.comm_bytes and r.comm_all_gather_bytes  # fsdp gathers the weights every step
  assert r.comm_bytes >= r.comm_all_gather_bytes
  assert r.program_flops and r.flops < r.program_flops  # a share of the program per device
  d = r.as_dict()
  assert {f.name for f in dataclasses.fields(Communication)} <= set(d)  # flat, as compare's rows
  every = frozenset({"all"})  # the comm columns are not of the default set
  assert "comm" in render_infer(infer_rows, "table", columns=every).splitlines()[2]  # the table's header
  one = render_infer(jaxmem.infer(model="tiny", target="cpu", batch=1, phase="decode", context=32), "table", columns=every)
  assert "comm" not in one.splitlines()[2]  # one device: nothing to communicate, no column


def test_communication_is_declared_once():
  names = {f.name for f in dataclasses.fields(Communication)}
  for cls in (sweep.Row, inf.InferRow, jaxmem.MemoryReport):
    # A composed row carries them through its compiler figures, flat in its dict and attributes.
    flat = cls.flat_fields() if hasattr(cls, "flat_fields") else [f.name for f in dataclasses.fields(cls)]
    assert names <= set(flat)
    assert not names & set(vars(cls).get("__annotations__", {})), cls  # inherited, not redeclared


def test_row_with_communication_round_trips(compile_one):
  row = compile_one(model="tiny", target="cpu:8", mesh="fsdp=8", batch=8, seq=32, remat="none")
  assert row.comm_bytes and row.communication().comm_bytes == row.comm_bytes
  assert sweep.row_from_dict(row.as_dict()) == row
  assert "communication" not in row.as_dict()  # JSON stays flat: comm_bytes, comm_all_gather_bytes, ...


def test_inference_workload_has_no_training_fields():
  shared = {f.name for f in dataclasses.fields(BaseWorkload)}
  training = {f.name for f in dataclasses.fields(Workload)} - shared
  inference = {f.name for f in dataclasses.fields(inf.InferWorkload)}
  assert {"remat", "optimizer", "microbatches", "step", "seq", "vocab_tiles", "param_dtype"} <= training
  assert not training & inference
  assert shared <= inference
  w = inf.InferWorkload.of(Workload(model="tiny", remat="full", mesh="data=2,fsdp=4"))
  assert w.model == "tiny" and w.mesh == ("data=2,fsdp=4",) and not hasattr(w, "remat")


def test_a_functions_explanation_has_no_configuration():
  # No zeros or empty strings standing in for a train step's fields: the function has none.
  import jax.numpy as jnp

  w = jax.ShapeDtypeStruct((64, 64), jnp.float32)
  r = jaxmem.explain(lambda w, x: jnp.tanh(x @ w).sum(), w, w, target="cpu")
  assert r.configuration is None and r.model is None and r.remat is None and r.batch is None
  d = r.as_dict()
  assert d["model"] is None and d["target"] == "cpu" and d["num_devices"] == 1 and "configuration" not in d
  with pytest.raises(AttributeError):
    r.no_such_field  # noqa: B018


def test_arguments_in_host_memory_are_not_the_devices():
  mesh = jaxmem.target("cpu").mesh({"data": 1})
  dev = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  try:
    host = dev.with_memory_kind("pinned_host")
  except ValueError as e:  # a jaxlib whose CPU client has no pinned host memory
    pytest.skip(str(e))
  a = jax.ShapeDtypeStruct((1024, 1024), jax.numpy.float32, sharding=dev)
  b = jax.ShapeDtypeStruct((1024, 1024), jax.numpy.float32, sharding=host)
  assert shape_argument_bytes((a, b), 1) == shape_argument_bytes((a,), 1) == 4 * 2**20
