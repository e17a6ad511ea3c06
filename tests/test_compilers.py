"""Compiler releases as an axis (jaxmem.compilers, the ``compiler`` axis) and the compiler a row
names being the one loaded (jaxmem.versions.loaded). Nothing here downloads a wheel or compiles
under a foreign libtpu: the fetcher writes fake wheels and the workers are replaced; the real run
with libtpu 0.0.52 is benchmarks/compiler_versions.py (slow)."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import os
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

import benchmark_module
from jaxmem import compilers, versions
from jaxmem.cache import key
from jaxmem.errors import CompilerUnavailable, JaxmemError


def _record_line(rel: str, data: bytes) -> str:
  digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
  return f"{rel},sha256={digest},{len(data)}"


def fake_wheel_tree(root: Path, name: str, version: str, lib: str, data: bytes) -> Path:
  """A wheel's files as pip installs or unpacks them: the library and a dist-info whose RECORD
  lists it at its size. Returns the library's path."""
  path = root / lib
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_bytes(data)
  info = root / f"{name.replace('-', '_')}-{version}.dist-info"
  info.mkdir(parents=True, exist_ok=True)
  (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
  (info / "RECORD").write_text(_record_line(lib, data) + f"\n{info.name}/RECORD,,\n")
  return path


@pytest.fixture
def fresh(monkeypatch, tmp_path):
  """A private cache folder; the environments and identities found before are forgotten."""
  monkeypatch.setenv("JAXMEM_CACHE_DIR", str(tmp_path / "cache"))
  compilers.forget()
  versions._owner.cache_clear()
  yield tmp_path
  compilers.forget()


# --- the compiler loaded, not the one installed ---


def test_a_libtpu_no_wheel_claims_has_no_version_a_reason_and_a_cache_key_of_its_own(monkeypatch, fresh):
  installed_key = key({"model": "tiny"})
  installed = versions.compiler_versions("tpu").get("libtpu")
  fake = fresh / "image" / "libtpu.so"
  fake.parent.mkdir()
  fake.write_bytes(b"not the installed libtpu")
  monkeypatch.setenv("TPU_LIBRARY_PATH", str(fake))
  assert versions.compiler_versions("tpu")["libtpu"] is None
  (note,) = versions.compiler_notes("tpu")
  assert "TPU_LIBRARY_PATH" in note and str(fake) in note and "hash" in note
  assert versions.describe(versions.compiler_versions("tpu")).endswith("libtpu unknown")
  k = key({"model": "tiny"})
  assert k != installed_key
  fake.write_bytes(b"another library at the same path")  # the key follows the file, not its path
  assert key({"model": "tiny"}) not in (k, installed_key)
  monkeypatch.delenv("TPU_LIBRARY_PATH")
  assert key({"model": "tiny"}) == installed_key  # and the reverse: the installed one's rows again
  assert versions.compiler_versions("tpu").get("libtpu") == installed


def test_a_libtpu_from_another_wheel_is_named_by_that_wheels_version(monkeypatch, fresh):
  installed_key = key({"model": "tiny"})
  lib = fake_wheel_tree(fresh / "site", "libtpu", "0.0.52", "libtpu/libtpu.so", b"\0" * 64)
  monkeypatch.setenv("TPU_LIBRARY_PATH", str(lib))
  assert versions.compiler_versions("tpu")["libtpu"] == "0.0.52"
  assert versions.compiler_notes("tpu") == ()
  assert versions.cache_versions()["libtpu"] == "0.0.52"
  assert key({"model": "tiny"}) != installed_key


def test_a_library_replaced_beside_its_wheels_metadata_is_not_taken_for_the_wheels(monkeypatch, fresh):
  lib = fake_wheel_tree(fresh / "site", "libtpu", "0.0.52", "libtpu/libtpu.so", b"\0" * 64)
  lib.write_bytes(b"\0" * 65)  # not the size RECORD lists
  monkeypatch.setenv("TPU_LIBRARY_PATH", str(lib))
  assert versions.compiler_versions("tpu")["libtpu"] is None


def test_a_tpu_library_path_that_is_no_file_falls_back_to_the_installed_one_as_jax_does(monkeypatch):
  installed = versions.compiler_versions("tpu").get("libtpu")
  monkeypatch.setenv("TPU_LIBRARY_PATH", "/nonexistent/libtpu.so")
  assert versions.compiler_versions("tpu").get("libtpu") == installed


def test_the_cuda_plugin_first_on_the_path_is_the_one_named(monkeypatch, fresh):
  site = fresh / "plugin"
  fake_wheel_tree(site, "jax-cuda12-pjrt", "0.11.0", "jax_plugins/xla_cuda12/xla_cuda_plugin.so", b"\1" * 32)
  (site / "jax_plugins" / "xla_cuda12" / "__init__.py").write_text("")
  monkeypatch.syspath_prepend(str(site))
  # As a process that has not loaded a plugin yet finds it (one that has: the module it loaded).
  monkeypatch.delitem(sys.modules, "jax_plugins.xla_cuda12", raising=False)
  found = {lib.name: lib for lib in versions.loaded("gpu")}
  assert found["jax-cuda12-plugin"].version == "0.11.0"
  assert found["jax-cuda12-plugin"].path == str((site / "jax_plugins/xla_cuda12/xla_cuda_plugin.so").resolve())
  assert versions.compiler_versions("gpu")["jax-cuda12-plugin"] == "0.11.0"


def test_rows_of_several_releases_name_them_all():
  assert versions.merged([{"jax": "1", "libtpu": "0.0.50.1"}, {"jax": "1", "libtpu": "0.0.52"}]) == {
      "jax": "1", "libtpu": "0.0.50.1 / 0.0.52"}
  assert versions.merged([{"jax": "1"}, {"jax": "1"}]) == {"jax": "1"}


# --- the axis's values ---


def test_specs_are_read_and_whole_jax_stacks_refused_in_one_line():
  assert compilers.parse("libtpu==0.0.50.1, libtpu==0.0.52,libtpu==0.0.52") == ("libtpu==0.0.50.1", "libtpu==0.0.52")
  assert compilers.parse(["jax_cuda12_plugin==0.11.0"]) == ("jax-cuda12-plugin==0.11.0",)
  for bad, said in (("jax==0.10.2", "whole jax stacks"), ("libtpu>=0.0.50", "NAME==VERSION"), ("numpy==2.0", "not a compiler")):
    with pytest.raises(JaxmemError, match=said) as e:
      compilers.parse(bad)
    assert "\n" not in str(e.value)


def test_the_axis_is_declared_recorded_and_shown_where_given():
  from jaxmem.axes import AXES
  from jaxmem.records import Configuration
  from jaxmem.workload import Workload

  axis = AXES["compiler"]
  assert axis.column is not None and axis.flag == "--compiler"
  assert "compiler" in {f.name for f in dataclasses.fields(Configuration)}
  assert Workload(compiler="libtpu==0.0.50.1,libtpu==0.0.52").compiler == ("libtpu==0.0.50.1", "libtpu==0.0.52")


def test_a_task_under_a_release_is_keyed_on_that_release_not_on_the_loaded_one(monkeypatch, fresh):
  from jaxmem.resolve import Task
  from jaxmem.workload import Workload

  tasks = [Task(workload=Workload(model="tiny", remat=("full",), compiler=(c,))) for c in ("libtpu==0.0.50.1", "libtpu==0.0.52")]
  keys = [t.cache_key() for t in tasks]
  assert keys[0] != keys[1]
  fake = fresh / "libtpu.so"
  fake.write_bytes(b"x")
  monkeypatch.setenv("TPU_LIBRARY_PATH", str(fake))  # what this process loads does not change them
  assert [t.cache_key() for t in tasks] == keys


# --- fetching, once, before any compile ---


def _fake_fetch(calls, available=("libtpu==0.0.52",)):
  def fetch(requirement, folder):
    calls.append(requirement)
    if requirement not in available:
      raise CompilerUnavailable(f"`compiler` {requirement} is not installable here: no such release")
    name, version = requirement.split("==")
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as z:
      data = b"\0" * 16
      info = f"{name}-{version}.dist-info"
      z.writestr("libtpu/libtpu.so", data)
      z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
      z.writestr(f"{info}/RECORD", _record_line("libtpu/libtpu.so", data) + "\n")
  return fetch


def test_a_release_is_fetched_once_and_its_worker_loads_its_library(monkeypatch, fresh):
  calls = []
  monkeypatch.setattr(compilers, "FETCH", _fake_fetch(calls))
  env = compilers.environment("libtpu==0.0.52")
  (name, path), = env.variables
  assert name == "TPU_LIBRARY_PATH" and Path(path).is_file()
  compilers.forget()
  assert compilers.environment("libtpu==0.0.52") == env and calls == ["libtpu==0.0.52"]  # unpacked once
  monkeypatch.setenv("TPU_LIBRARY_PATH", path)  # what the worker does: it names that wheel's version
  assert versions.compiler_versions("tpu")["libtpu"] == "0.0.52"


def test_the_installed_release_is_not_fetched(monkeypatch, fresh):
  installed = versions.installed_version("libtpu")
  if installed is None:
    pytest.skip("libtpu is not installed")
  monkeypatch.setattr(compilers, "FETCH", _fake_fetch(calls := []))
  env = compilers.environment(f"libtpu=={installed}")
  assert calls == [] and dict(env.variables)["TPU_LIBRARY_PATH"] == versions.installed_libtpu()


def test_a_release_not_installable_is_one_line_exit_2_before_anything_compiles(monkeypatch, fresh, capsys):
  from jaxmem.cli import main
  from jaxmem.events import Compiling, listen

  installed = versions.installed_version("libtpu")
  if installed is None:
    pytest.skip("libtpu is not installed")
  monkeypatch.setattr(compilers, "FETCH", _fake_fetch([]))
  heard = []
  with listen(lambda e: heard.append(e) if isinstance(e, Compiling) else None):
    # The installed release needs no fetch; the fake fetcher has no other.
    code = main(["compare", "--model", "tiny", "--target", "tpu:v5e-4", "--batch", "8", "--seq", "64", "--remat", "full",
                 "--compiler", f"libtpu=={installed},libtpu==9.9.9"])
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and heard == []
  assert err[-1].endswith("--compiler libtpu==9.9.9 is not installable here: no such release")


def test_a_release_for_another_platform_is_refused(monkeypatch, fresh):
  from jaxmem.resolve import plan

  monkeypatch.setattr(compilers, "FETCH", _fake_fetch([]))
  with pytest.raises(JaxmemError, match="compiles for tpu targets; this target is cpu"):
    plan(model="tiny", target="cpu", batch=2, seq=16, remat="full", compiler="libtpu==0.0.52")


# --- each release's tasks in a worker of that release, rows side by side ---


def test_each_release_runs_in_its_own_workers_and_rows_sit_side_by_side(monkeypatch, fresh):
  from jaxmem.planning import runner, sweep

  monkeypatch.setattr(compilers, "FETCH", _fake_fetch([]))
  sent = []

  def pool(tasks, run, todo, jobs, done, environment=None):
    assert run is sweep.run_task  # the portable task, as jobs and Dask workers get it
    for i in todo:
      sent.append((tasks[i].compiler, environment))
      done(i, {"compiler": tasks[i].compiler, "remat": tasks[i].remat})

  monkeypatch.setattr(runner, "_run_pool", pool)
  installed = versions.installed_version("libtpu") or pytest.skip("libtpu is not installed")
  p = sweep.plan(model="tiny", target="tpu:v5e-4", batch=8, seq=64, remat="full", compiler=f"libtpu=={installed}")
  tasks = p.tasks()
  assert [(t.remat, t.compiler) for t in tasks] == [("none", f"libtpu=={installed}"), ("full", f"libtpu=={installed}")]
  rows = runner.run_tasks(tasks, sweep.runner(p, workers=True))
  assert [r["remat"] for r in rows] == ["none", "full"]
  assert {dict(e.variables)["TPU_LIBRARY_PATH"] for _, e in sent} == {versions.installed_libtpu()}


def _dying_pool(rows_first: int):
  """A worker pool that returns ``rows_first`` rows and then breaks, as one whose worker process
  died does (libtpu 0.0.20 under jax 0.12.0.1 crashes the worker as it compiles)."""
  from concurrent.futures.process import BrokenProcessPool

  def pool(tasks, run, todo, jobs, done, environment=None):
    for i in list(todo)[:rows_first]:
      done(i, {"compiler": tasks[i].compiler, "remat": tasks[i].remat})
    raise BrokenProcessPool("A process in the process pool was terminated abruptly")
  return pool


@pytest.mark.parametrize("rows_first, said", [(0, "died before it compiled anything"), (1, "died after 1 of 2 results")])
def test_a_release_whose_worker_dies_is_one_line_naming_it(monkeypatch, fresh, rows_first, said):
  from jaxmem.planning import runner, sweep

  monkeypatch.setattr(compilers, "FETCH", _fake_fetch([]))
  monkeypatch.setattr(runner, "_run_pool", _dying_pool(rows_first))
  p = sweep.plan(model="tiny", target="tpu:v5e-4", batch=8, seq=64, remat="full", compiler="libtpu==0.0.52")
  with pytest.raises(CompilerUnavailable) as e:
    runner.run_tasks(p.tasks(), sweep.runner(p, workers=True))
  (line,) = str(e.value).splitlines()
  assert line.startswith("`compiler` libtpu==0.0.52: ") and said in line


def test_a_release_whose_worker_dies_is_one_line_exit_2(monkeypatch, fresh, capsys):
  from jaxmem.cli import main
  from jaxmem.planning import runner

  monkeypatch.setattr(compilers, "FETCH", _fake_fetch([]))
  monkeypatch.setattr(runner, "_run_pool", _dying_pool(0))
  code = main(["compare", "--model", "tiny", "--target", "tpu:v5e-4", "--batch", "8", "--seq", "64", "--remat", "full",
               "--compiler", "libtpu==0.0.52", "--no-cache"])
  err = capsys.readouterr().err
  assert code == 2 and "Traceback" not in err
  last = err.strip().splitlines()[-1]
  assert "--compiler libtpu==0.0.52: the worker process that loads it died before it compiled anything" in last
  assert "docs/versions.md" in last


def test_a_worker_of_a_fake_release_that_really_dies_is_one_line(monkeypatch, fresh):
  from jaxmem.hardware.startup import in_worker

  monkeypatch.setattr(compilers, "FETCH", _fake_fetch([]))
  env = compilers.environment("libtpu==0.0.52")  # the fake wheel's library: the worker loads it, then aborts
  with pytest.raises(CompilerUnavailable, match=r"^`compiler` libtpu==0\.0\.52: the worker process that loads it died"):
    in_worker(os.abort, environment=env)


def test_the_release_axis_refuses_a_scheduler():
  from jaxmem.planning import runner
  from jaxmem.resolve import Task
  from jaxmem.workload import Workload

  t = Task(workload=Workload(model="tiny", remat=("full",), compiler=("libtpu==0.0.52",)))
  with pytest.raises(JaxmemError, match="drop `scheduler`"):
    runner.run_tasks([t], lambda t: {}, scheduler="tcp://localhost:8786")


def test_the_table_says_first_where_releases_disagree_on_the_verdict():
  from jaxmem.render.tables import release_disagreements

  def row(compiler, fits, remat="full"):
    return SimpleNamespace(model="22b", target="tpu:v4-128", batch=13, seq=2048, remat=remat, compiler=compiler,
                           fits=fits, error=None, verdict=None, mesh="fsdp=64")

  rows = [row("libtpu==0.0.50.1", False), row("libtpu==0.0.52", True),
          row("libtpu==0.0.50.1", True, "none"), row("libtpu==0.0.52", True, "none")]
  (line,) = release_disagreements(rows)
  assert line.startswith("the compiler releases disagree on remat full:")
  assert "does not fit under libtpu==0.0.50.1" in line and "fits under libtpu==0.0.52" in line
  assert release_disagreements(rows[2:]) == []
  assert release_disagreements(rows[:1]) == []


def test_a_release_that_could_not_compile_is_not_said_to_refuse():
  from jaxmem.render.tables import release_disagreements

  def row(compiler, fits, error=None):
    return SimpleNamespace(model="tiny", target="tpu:v5e-4", remat="full", compiler=compiler, fits=fits, error=error,
                           verdict=None)

  # libtpu 0.0.33 under jax 0.12.0.1: the splash kernel's bytecode, not the program's size.
  (line,) = release_disagreements([row("libtpu==0.0.33", None, "INVALID_ARGUMENT: Failed to parse the Mosaic module"),
                                   row("libtpu==0.0.50.1", True)])
  assert "did not compile under libtpu==0.0.33" in line and "refused" not in line


@dataclasses.dataclass(frozen=True)
class _Configured:
  compiler: str | None = None


@dataclasses.dataclass(frozen=True)
class _Explained:
  configuration: _Configured


def test_explain_under_a_release_runs_in_a_worker_of_it(monkeypatch, fresh):
  from jaxmem.buffers import explain as ex

  installed = versions.installed_version("libtpu") or pytest.skip("libtpu is not installed")
  seen = {}

  def worker(fn, w, *, environment, cpu_devices, **options):
    seen.update(workload=w, environment=environment)
    return _Explained(configuration=_Configured())

  monkeypatch.setattr(ex, "in_worker", worker)
  r = ex.explain_workload(model="tiny", target="tpu:v5e-4", batch=8, seq=64, remat="full", compiler=f"libtpu=={installed}")
  assert seen["workload"].compiler == () and r.configuration.compiler == f"libtpu=={installed}"
  assert dict(seen["environment"].variables)["TPU_LIBRARY_PATH"] == versions.installed_libtpu()


def test_an_environment_puts_a_plugin_first_on_the_path(monkeypatch):
  monkeypatch.setattr(sys, "path", list(sys.path))
  monkeypatch.setenv("PYTHONPATH", "/elsewhere")
  env = compilers.Environment(spec=compilers.parse_spec("jax-cuda12-plugin==0.11.0"), path=("/x/plugin",))
  env.apply()
  assert sys.path[0] == "/x/plugin" and os.environ["PYTHONPATH"] == os.pathsep.join(["/x/plugin", "/elsewhere"])


@pytest.mark.slow  # downloads libtpu 0.0.52's wheel once and compiles eight small programs in subprocesses
def test_a_real_second_libtpu():
  assert benchmark_module.load("compiler_versions").main() == 0


def test_validate_refuses_a_release(capsys):
  from jaxmem.cli import main

  assert main(["validate", "--model", "tiny", "--batch", "2", "--seq", "16", "--compiler", "libtpu==0.0.52"]) == 2
  assert "drop --compiler" in capsys.readouterr().err
