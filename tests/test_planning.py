"""Planning at speed: fit, scale, the row cache, resuming, parallel and Dask sweeps."""

import contextlib
import dataclasses
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from pathlib import Path

from jaxmem.cli import main
from jaxmem.errors import JaxmemError
from jaxmem.models import get_config
from jaxmem.planning import fit, scale, sweep
from jaxmem.cache import KEYED_ENVIRONMENT, RowCache, cache_dir
from jaxmem.resolve import plan
from jaxmem.planning.runner import run_tasks

TINY = dict(model="tiny", batch=2, seq=16, target="cpu")


def _strip(rows):
  """Rows as dicts without the one field that differs between two runs of the same compile."""
  return [{k: v for k, v in r.as_dict().items() if k != "compile_seconds"} for r in rows]


@pytest.fixture(scope="module")
def serial_rows():
  """TINY without remat, sgd and adamw (two compiles, no baseline beside them), compiled once
  in this process: what the cache, parallel and Dask paths must reproduce."""
  return sweep.compare(**TINY, remat="none", optimizer="sgd,adamw")


def test_the_session_row_cache_is_this_workers_own():
  # conftest.py: a fresh directory per session, and one per pytest-xdist worker below it.
  d = Path(os.environ["JAXMEM_CACHE_DIR"])
  assert cache_dir() == d
  worker = os.environ.get("PYTEST_XDIST_WORKER")
  if worker:
    assert d.name == worker


def test_cache_returns_identical_rows(tmp_path):
  cache = RowCache(tmp_path)
  first = sweep.compare(**TINY, remat="none", optimizer="sgd", cache=cache)  # one compile
  assert cache.hits == 0
  again = sweep.compare(**TINY, remat="none", optimizer="sgd", cache=cache)
  assert cache.hits == len(first) == 1
  # The same row, but for saying where it came from.
  assert [r.cached for r in first] == [False] and [r.cached for r in again] == [True]
  same = lambda rows: [{k: v for k, v in r.as_dict().items() if k != "cached"} for r in rows]  # noqa: E731
  assert same(again) == same(first)


# Run in a subprocess over a copy of the package: which jaxmem it imported, and the sweep's cache hits.
_COPY_RUN = """
import jaxmem, jaxmem.models
from jaxmem.cache import RowCache
from jaxmem.planning.sweep import compare
cache = RowCache()
hits = []
for _ in range({runs}):
  compare(model="tiny", target="cpu", batch=2, seq=16, remat="none", optimizer="sgd", cache=cache)
  hits.append(cache.hits)
print(jaxmem.__file__, jaxmem.models.__file__, *hits)
"""


@pytest.mark.slow  # subprocess sweeps before and after a model file changes
def test_cache_misses_when_a_model_file_changes(tmp_path):
  # A copy of the package laid out as a wheel installs it (models/ inside jaxmem/), imported
  # ahead of the editable install through PYTHONPATH: its rows are keyed on its own source.
  import jaxmem.models  # binds jaxmem too

  ignore = shutil.ignore_patterns("__pycache__")
  copy = tmp_path / "site"
  shutil.copytree(Path(jaxmem.__file__).parent, copy / "jaxmem", ignore=ignore)
  shutil.rmtree(copy / "jaxmem" / "models", ignore_errors=True)
  shutil.copytree(Path(jaxmem.models.__file__).parent, copy / "jaxmem" / "models", ignore=ignore)
  env = {**os.environ, "PYTHONPATH": str(copy), "JAXMEM_CACHE_DIR": str(tmp_path / "cache"), "JAX_PLATFORMS": "cpu"}

  def run(runs):
    out = subprocess.run([sys.executable, "-c", _COPY_RUN.format(runs=runs)], env=env, cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout.split()
    assert all(f.startswith(str(copy)) for f in out[:2]), out  # the copy ran, not the checkout
    return [int(h) for h in out[2:]]

  assert run(2) == [0, 1]  # the second sweep in the copy is answered from the cache
  model = copy / "jaxmem" / "models" / "transformer.py"
  model.write_text(model.read_text() + "\n# an edit that changes no figure still changes the code\n")
  assert run(1) == [0]  # the edited code recompiles
  assert len(list((tmp_path / "cache" / "rows").glob("*.json"))) == 2


@pytest.mark.parametrize("name", KEYED_ENVIRONMENT)
def test_cache_misses_when_a_keyed_variable_changes(name, monkeypatch):
  # A GPU row's capacity and fits follow XLA_PYTHON_CLIENT_MEM_FRACTION; the flags change the program.
  task = plan(**{**TINY, "target": "gpu:h100"}, remat="none").tasks()[0]
  monkeypatch.delenv(name, raising=False)
  unset = task.cache_key()
  monkeypatch.setenv(name, "0.5")
  half = task.cache_key()
  monkeypatch.setenv(name, "0.6")
  assert len({unset, half, task.cache_key()}) == 3  # each value its own rows
  monkeypatch.delenv(name)
  assert task.cache_key() == unset


@pytest.mark.parametrize(
    "change",
    [
        dict(batch=4),
        dict(seq=32),
        dict(remat="dots_saveable"),
        dict(optimizer="lion"),
        dict(mesh="data=2", target="cpu:2"),
        dict(mesh="fsdp=2", target="cpu:2"),
        dict(param_dtype="bfloat16"),
        dict(model="tiny-gpt2"),
    ],
)
def test_cache_misses_when_any_key_part_changes(change):
  base = plan(**TINY, remat="full", optimizer="sgd").tasks()[-1]
  kwargs = {**TINY, "remat": "full", "optimizer": "sgd", **change}
  other = plan(**kwargs).tasks()[-1]
  assert base.cache_key() != other.cache_key()
  assert base.cache_key() == plan(**TINY, remat="full", optimizer="sgd").tasks()[-1].cache_key()


@pytest.mark.slow  # a sweep killed and rerun in subprocesses; test_cache_returns_identical_rows covers the cache's reading back
def test_killed_sweep_resumes_without_recompiling(tmp_path, monkeypatch, capsys):
  env = {**os.environ, "JAXMEM_CACHE_DIR": str(tmp_path), "JAX_PLATFORMS": "cpu"}
  argv = ["compare", "--model", "tiny", "--batch", "2", "--seq", "16", "--target", "cpu"]
  argv += ["--remat", "full,dots_saveable,save_qkv_proj,save_out_proj", "--format", "json"]
  # The sweep that is killed is a process of its own; the rerun is main() in this one.
  proc = subprocess.Popen([sys.executable, "-m", "jaxmem", *argv], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  rows_dir = tmp_path / "rows"
  deadline = time.time() + 120
  while time.time() < deadline and len(list(rows_dir.glob("*.json"))) < 2:
    time.sleep(0.2)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  finished = len(list(rows_dir.glob("*.json")))
  assert 2 <= finished < 5, "kill the sweep midway"
  monkeypatch.setenv("JAXMEM_CACHE_DIR", str(tmp_path))
  assert main(argv) == 0
  out = capsys.readouterr()
  assert f"{finished} of 5 configurations from the cache" in out.err
  assert len(json.loads(out.out)["rows"]) == 5


def test_parallel_jobs_give_the_same_rows(serial_rows):
  parallel = sweep.compare(**TINY, remat="none", optimizer="sgd,adamw", jobs=2)
  assert _strip(parallel) == _strip(serial_rows)


@pytest.mark.slow  # a local Dask cluster's worker start and compiles; test_parallel_jobs_give_the_same_rows covers the parallel path
def test_dask_path_gives_the_same_rows(serial_rows):
  distributed = pytest.importorskip("distributed")
  with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
    remote = sweep.compare(**TINY, remat="none", optimizer="sgd", scheduler=cluster.scheduler_address)
  assert _strip(remote) == _strip([r for r in serial_rows if r.optimizer == "sgd"])


@pytest.mark.parametrize(
    "address,match",
    [
        ("tcp://127.0.0.1:1", "cannot reach the Dask scheduler at tcp://127.0.0.1:1: connection refused"),
        ("127.0.0.1", "missing port number"),
        ("tls://127.0.0.1:1", "cannot use the Dask scheduler address tls://127.0.0.1:1"),
    ],
)
def test_unreachable_scheduler_is_one_line(address, match, capsys):
  argv = ["compare", "--model", "tiny", "--batch", "2", "--seq", "16", "--target", "cpu", "--no-cache"]
  assert main([*argv, "--scheduler", address]) == 2
  err = capsys.readouterr().err
  assert match in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def _fit_agrees_with_compare(cfg, *, seq, target):
  """fit's largest batch fits when compiled on its own, and one more does not."""
  # dot attention: its T x T scores make memory linear in the batch at long sequences, the case
  # the search's secant is for (a fused kernel's step grows slowly, and the search walks further).
  p = plan(model=cfg, remat="full", optimizer="adamw", batch=1, seq=seq, target=target, attention="dot")
  p = dataclasses.replace(p, remats=p.remats[1:])  # search `full` only
  (found,) = fit.search(p)
  assert found.remat == "full" and found.max_batch and found.row.fits and found.note is None
  mesh, opt, rp = p.configs()[0]
  at = sweep.run_config(dataclasses.replace(p, batch=found.max_batch), mesh, opt, rp)
  above = sweep.run_config(dataclasses.replace(p, batch=found.max_batch + 1), mesh, opt, rp)
  assert at.fits is True and at.required_bytes == found.row.required_bytes
  assert above.fits is False
  return found


# About 140 s of a 2-core machine: under slow, with the TPU case below. In the fast suite,
# tests/test_user_step.py checks the same agreement for a user's step on gpu:h100.
@pytest.mark.slow
@pytest.mark.needs_gpu_compiler("h100")
def test_fit_agrees_with_compare():
  # GPU: compiling the tiny model costs the same at any batch (about 4 s of CPU here), where the
  # TPU compiler's time grows with the shapes (20-50 s per probe near 16 GiB): the TPU case is
  # the slow test below and benchmarks/fit_search.py. At 2048 positions the attention scores
  # make memory linear in the batch, so the secant lands in few compiles.
  found = _fit_agrees_with_compare(get_config("tiny"), seq=2048, target="gpu:h100")
  assert found.compiles <= 10 and found.max_batch > 2  # 8 on jax 0.12.0.1, 9 on 0.10.2


# Big enough that the largest batch is some hundreds, small enough to compile in seconds.
MID = get_config("tiny", d_model=256, d_ff=1024, num_heads=4, num_kv_heads=2, head_dim=64, vocab_size=8192, num_layers=2)


@pytest.mark.slow
@pytest.mark.needs_tpu_compiler
def test_fit_agrees_with_compare_on_tpu():
  # About 100 s on a quiet 2-core machine: run with -m slow, or benchmarks/fit_search.py.
  found = _fit_agrees_with_compare(MID, seq=1024, target="tpu:v5e-1")
  assert found.compiles <= 12


def test_fit_needs_a_capacity():
  with pytest.raises(JaxmemError, match="needs a target with a memory capacity"):
    fit.search(plan(**TINY))


@pytest.mark.slow  # a ranked fit over several TPU compiles; tests/test_cli_io.py runs fit at a fixed workload
@pytest.mark.needs_tpu_compiler
def test_fit_with_a_workload_ranks_and_recommends(capsys):
  # A TPU: a tiny step compiles in about 1 s there (6-10 s for a GPU); 128 positions take splash.
  argv = ["fit", "--model", "tiny", "--batch", "8", "--seq", "128", "--target", "tpu:v5e-1", "--remat", "full"]
  assert main(argv) == 0
  out = capsys.readouterr().out
  first = out.splitlines()[0]
  assert first.startswith("recommendation: mesh fsdp=1, adamw, attention splash, remat ")
  # All fit a tiny model: the cheapest recompute (no remat) is recommended.
  assert "remat none" in first


@pytest.fixture(scope="module")
def scale_doc(tmp_path_factory):
  """`scale` over three sequence lengths through the CLI, on the host CPU's compiler (a third of
  a GPU compile's time): its JSON document and plot, shared by the two tests below."""
  plot = tmp_path_factory.mktemp("scale") / "scale.png"
  argv = ["scale", "--model", "tiny", "--batch", "4", "--target", "cpu", "--over", "seq=128,256,512"]
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    assert main([*argv, "--remat", "none", "--format", "json", "--plot", str(plot)]) == 0
  return json.loads(out.getvalue()), plot


def test_fit_and_compare_give_one_recompute_overhead():
  # fit's search fills the overhead from baseline_flops (the no-remat program traced at the
  # row's workload); compare from its own no-remat row. The same steps as written: one figure.
  p = plan(**TINY, remat="full", optimizer="sgd")
  rows = sweep.compare(**TINY, remat="full", optimizer="sgd")
  full = next(r for r in rows if r.remat == "full")
  assert full.recompute_overhead_pct > 0
  found = fit.FitResult(
      over="batch", mesh=full.mesh, optimizer=full.optimizer, remat=full.remat, max_batch=full.batch, max_seq=None,
      compiles=1, row=dataclasses.replace(full, recompute_overhead_pct=None),
  )
  task = next(t for t in p.tasks() if t.remat == "full")
  result = fit.with_recompute(found, p, task)
  assert result.row.recompute_overhead_pct == pytest.approx(full.recompute_overhead_pct, rel=1e-9)


def test_scale_temporaries_grow_with_sequence(scale_doc):
  doc, plot = scale_doc
  rows = sorted(doc["rows"], key=lambda r: r["seq"])
  assert [r["seq"] for r in rows] == [128, 256, 512]
  temps = [r["temp_size_in_bytes"] for r in rows]
  assert temps[0] < temps[1] < temps[2]  # activations grow with the sequence
  assert len({r["param_bytes"] for r in rows}) == 1  # parameters do not
  growth = {g["component"]: g for g in doc["growth"]}
  assert growth["temp_size_in_bytes"]["seq_exponent"] > 0.5
  assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_scale_exponents_from_rows(scale_doc):
  rows = [sweep.row_from_dict(d) for d in scale_doc[0]["rows"]]
  growth = {g.component: g for g in scale.growth_exponents(rows, {"seq": [128, 256, 512]})}
  assert growth["temp_size_in_bytes"].seq_exponent > 0.8  # activations grow with the sequence
  assert abs(growth["param_bytes"].seq_exponent) < 0.01  # parameters do not
  assert growth["param_bytes"].batch_exponent is None


@pytest.mark.parametrize("spec,match", [(["seq=1024"], "at least two"), (["len=1,2"], "seq=1024")])
def test_bad_over(spec, match):
  with pytest.raises(JaxmemError, match=match):
    scale.parse_over(spec)


def test_run_tasks_answers_from_the_cache_without_running(tmp_path, serial_rows):
  cache = RowCache(tmp_path)
  tasks = plan(**TINY, remat="full", optimizer="sgd,adamw").tasks()
  assert [(t.optimizer, t.remat) for t in tasks] == [("sgd", "none"), ("sgd", "full"), ("adamw", "none"), ("adamw", "full")]
  assert [(r.optimizer, r.remat) for r in serial_rows] == [("sgd", "none"), ("adamw", "none")]
  cache.put(tasks[0].cache_key(), serial_rows[0].as_dict())
  cache.put(tasks[2].cache_key(), serial_rows[1].as_dict())
  ran, seen = [], []

  def run(task):  # stands in for the compile: the rows not in the cache
    ran.append(task)
    return {"ran": task.remat}

  rows = run_tasks(tasks, run, cache=cache, on_row=lambda i, row, cached: seen.append((i, cached)))
  assert ran == [tasks[1], tasks[3]]
  assert sorted(seen) == [(0, True), (1, False), (2, True), (3, False)]
  assert rows == [serial_rows[0].as_dict(), {"ran": "full"}, serial_rows[1].as_dict(), {"ran": "full"}]
  assert cache.hits == 2 and cache.get(tasks[1].cache_key()) == {"ran": "full"}  # stored as it finished
