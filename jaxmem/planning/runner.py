"""Running many configurations: from the cache, in this process, in parallel processes, or on
a Dask cluster.

A :class:`Task` is one configuration, described by plain values so it can be pickled to another
process or machine and hashed for the cache. Workers start JAX the way the CLI does
(:func:`jaxmem.targets.start_jax`) and compile with :func:`jaxmem.sweep.run_config`. Every
finished row goes to the cache at once, so an interrupted sweep resumes where it stopped.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import multiprocessing
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from jaxmem.planning.cache import RowCache, key
from jaxmem.errors import JaxmemError
from jaxmem.models import ModelConfig
from jaxmem.program.sharding import MeshSpec, format_mesh


@dataclasses.dataclass(frozen=True, kw_only=True)
class Task:
  cfg: ModelConfig
  target: str
  slices: int
  mesh: MeshSpec
  remat: str
  optimizer: str
  batch: int
  seq: int
  cpu_devices: int = 1  # simulated CPU devices the worker must start JAX with

  def cache_key(self) -> str:
    parts = dataclasses.asdict(self)
    parts.pop("cpu_devices")
    parts["mesh"] = format_mesh(self.mesh)
    return key(parts)


def run_task(task: Task) -> dict[str, Any]:
  """Compiles one task and returns its row as a dict (picklable, JSON-able)."""
  from jaxmem.planning import sweep
  from jaxmem.compiler import targets

  targets.start_jax(task.cpu_devices)
  p = sweep.plan(
      model=task.cfg,
      remat=task.remat,
      optimizer=task.optimizer,
      batch=task.batch,
      seq=task.seq,
      target=task.target,
      mesh=format_mesh(task.mesh),
      slices=task.slices,
  )
  (config,) = [c for c in p.configs() if c[2].name == task.remat]
  return sweep.run_config(p, *config).as_dict()


def _init_worker(cpu_devices: int) -> None:
  from jaxmem.compiler import targets

  targets.start_jax(cpu_devices)


def run_tasks(
    tasks: Sequence[Task],
    *,
    jobs: int = 1,
    scheduler: str | None = None,
    cache: RowCache | None = None,
    on_row: Callable[[int, dict[str, Any], bool], None] | None = None,
) -> list[dict[str, Any]]:
  """Rows for ``tasks``, in task order. ``on_row(index, row, from_cache)`` is called as each
  finishes (in completion order). Cached rows are not recompiled."""
  cache = cache or RowCache(enabled=False)
  if jobs < 1:
    raise JaxmemError(f"--jobs must be at least 1 (got {jobs})")
  if (jobs > 1 or scheduler) and any(t.target == "attached" for t in tasks):
    raise JaxmemError("the attached target runs in this process only; drop --jobs and --scheduler")
  results: dict[int, dict[str, Any]] = {}
  todo: list[int] = []
  for i, t in enumerate(tasks):
    row = cache.get(t.cache_key())
    if row is not None:
      results[i] = row
      if on_row:
        on_row(i, row, True)
    else:
      todo.append(i)

  def done(i: int, row: dict[str, Any]) -> None:
    cache.put(tasks[i].cache_key(), row)
    results[i] = row
    if on_row:
      on_row(i, row, False)

  if todo:
    if scheduler:
      _run_dask(tasks, todo, scheduler, done)
    elif jobs > 1 and len(todo) > 1:
      _run_pool(tasks, todo, jobs, done)
    else:
      for i in todo:
        done(i, run_task(tasks[i]))
  return [results[i] for i in range(len(tasks))]


def _run_pool(tasks: Sequence[Task], todo: Iterable[int], jobs: int, done) -> None:
  # spawn, not fork: JAX's runtime threads do not survive a fork.
  ctx = multiprocessing.get_context("spawn")
  cpu = max(t.cpu_devices for t in tasks)
  pool = cf.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_init_worker, initargs=(cpu,))
  try:
    futures = {pool.submit(run_task, tasks[i]): i for i in todo}
    for f in cf.as_completed(futures):
      done(futures[f], f.result())
  finally:
    pool.shutdown(wait=True, cancel_futures=True)


def _run_dask(tasks: Sequence[Task], todo: Iterable[int], address: str, done) -> None:
  try:
    from distributed import Client, as_completed
  except ImportError:
    raise JaxmemError("--scheduler needs Dask: pip install 'jaxmem[dask]'") from None
  try:
    client = Client(address, timeout="10s")
  except OSError as e:
    raise JaxmemError(f"cannot reach the Dask scheduler at {address}: {e}") from None
  try:
    futures = {client.submit(run_task, tasks[i], pure=False): i for i in todo}
    for f in as_completed(list(futures)):
      done(futures[f], f.result())
  finally:
    client.close()
