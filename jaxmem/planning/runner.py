"""Running many configurations: from the cache, in this process, in parallel processes, or on
a Dask cluster.

:func:`run_tasks` takes the tasks (:class:`jaxmem.resolve.Task`: plain values, picklable
and hashable for the cache) and the function that runs one (``run(task) -> row dict``, a
module-level function so that worker processes can import it: the sweep's
:func:`jaxmem.planning.sweep.run_task`). Workers start JAX the way the CLI does
(:func:`jaxmem.hardware.startup.start_jax`). Every finished row goes to the cache at once, so an
interrupted sweep resumes where it stopped.

A task with a ``compiler`` (a release other than the one this process loads:
:mod:`jaxmem.compilers`) runs in a worker process that loads that release, one pool per release,
the same portable task a ``jobs`` worker gets; ``run`` must then be importable by workers.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import multiprocessing
import socket
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from jaxmem import compilers
from jaxmem.axes import labels
from jaxmem.hardware.startup import chosen_platforms, init_worker
from jaxmem.errors import JaxmemError
from jaxmem.cache import RowCache
from jaxmem.events import Compiling, emit
from jaxmem.resolve import Task
from jaxmem.program.step import is_local

Run = Callable[[Task], dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class Counting:
  """Where one call's tasks stand in what the user sees as one run (a search makes several
  calls): ``before`` tasks came before them, of ``total`` in all (``None``: not known until the
  run ends, as in a search)."""

  before: int = 0
  total: int | None = None


def release(t: Task) -> str | None:
  """The compiler release a task is compiled under (``None``: this process's)."""
  return getattr(t, "compiler", None)


def run_tasks(
    tasks: Sequence[Task],
    run: Run,
    *,
    jobs: int = 1,
    scheduler: str | None = None,
    cache: RowCache | None = None,
    on_row: Callable[[int, dict[str, Any], bool], None] | None = None,
    key: Callable[[Task], str | None] | None = None,
    check: Callable[[dict[str, Any]], bool] | None = None,
    counting: Counting | None = None,
) -> list[dict[str, Any]]:
  """Rows for ``tasks`` (``run(task)`` for each that the cache does not answer), in task order.
  ``on_row(index, row, from_cache)`` is called as each finishes (in completion order).

  ``key(task)`` is a task's cache key (``task.cache_key()`` unless given: a user's step is keyed
  on what it traced, which needs the sweep's plan), and ``check`` says whether a cached dict
  reads back as a row. In this process each key is taken just before its task would run, so a
  key that traces the step hands its trace on to the run; before each run a
  :class:`jaxmem.events.Compiling` event is sent (before the first compile starts), numbered
  within ``counting`` (default: these tasks alone, of as many)."""
  cache = cache or RowCache(enabled=False)
  key = key or Task.cache_key
  if jobs < 1:
    raise JaxmemError(f"`jobs` must be at least 1 (got {jobs})")
  if (jobs > 1 or scheduler) and any(t.target == "attached" for t in tasks):
    raise JaxmemError("the attached target runs in this process only; drop `jobs` and `scheduler`")
  foreign = any(release(t) for t in tasks)
  if foreign and scheduler:
    raise JaxmemError("`compiler` compiles each release in a worker process of this machine that loads it; drop "
                      "`scheduler`")
  if foreign and any(t.target == "attached" for t in tasks):
    raise JaxmemError("`compiler` compiles for a compile-only target; the attached target runs this process's compiler")
  if (jobs > 1 or scheduler or foreign) and any(is_local(t.workload.step) for t in tasks):
    raise JaxmemError(
        "this step factory has no import path (a lambda, a closure or a notebook's function), so worker "
        "processes cannot import it; define make_step in a module and pass 'module:make_step', or drop jobs"
    )
  results: dict[int, dict[str, Any]] = {}
  keys: dict[int, str | None] = {}
  counting = counting or Counting(total=len(tasks))

  def compiling(i: int) -> None:
    emit(Compiling(index=counting.before + i + 1, total=counting.total, label=task_label(tasks[i])))

  def lookup(i: int) -> bool:
    keys[i] = key(tasks[i])
    row = cache.get(keys[i], check=check)
    if row is None:
      return False
    results[i] = row
    if on_row:
      on_row(i, row, True)
    return True

  def done(i: int, row: dict[str, Any]) -> None:
    cache.put(keys[i], row)
    results[i] = row
    if on_row:
      on_row(i, row, False)

  if foreign:
    _run_releases(tasks, run, [i for i in range(len(tasks)) if not lookup(i)], jobs, done, compiling)
    return [results[i] for i in range(len(tasks))]
  if not scheduler and jobs == 1:
    for i, t in enumerate(tasks):
      if not lookup(i):
        compiling(i)
        done(i, run(t))
    return [results[i] for i in range(len(tasks))]
  todo = [i for i in range(len(tasks)) if not lookup(i)]
  for i in todo:
    compiling(i)
  if todo:
    if scheduler:
      _run_dask(tasks, run, todo, scheduler, done)
    elif len(todo) > 1:
      _run_pool(tasks, run, todo, jobs, done)
    else:
      for i in todo:
        done(i, run(tasks[i]))
  return [results[i] for i in range(len(tasks))]


def task_label(t: Task) -> str:
  """A task's configuration in a few words (its mesh, remat policy, batch and sequence, and each
  other axis's words where it says something: :func:`jaxmem.axes.labels`)."""
  w = t.workload
  words = [w.mesh[0] if w.mesh else "", f"remat {t.remat}"]
  if t.optimizer not in ("-",):
    words.append(t.optimizer)
  if t.attention != "auto":
    words.append(f"attention {t.attention}")
  words += labels(t)
  words += [f"batch {w.batch}", f"seq {w.seq}"]
  return " ".join(x for x in words if x)


def _run_releases(tasks: Sequence[Task], run: Run, todo: list[int], jobs: int, done, compiling) -> None:
  """Each release's tasks in worker processes that load it (``jobs`` of them), one release after
  another; a task without one in a worker of this process's compiler. Every release is had (its
  wheel fetched) before the first compile."""
  by_release: dict[str | None, list[int]] = {}
  for i in todo:
    by_release.setdefault(release(tasks[i]), []).append(i)
  environments = {r: compilers.environment(r) if r else None for r in by_release}
  for r, todo_r in by_release.items():
    for i in todo_r:
      compiling(i)
    returned: list[int] = []
    try:
      _run_pool(tasks, run, todo_r, min(jobs, len(todo_r)), lambda i, row: (returned.append(i), done(i, row)),
                environment=environments[r])
    except BrokenProcessPool:
      # A worker of a release died (the library crashed as it loaded, or the process was killed):
      # one line naming the release, not the pool's traceback.
      if r is None:
        raise
      raise compilers.worker_died(r, returned=len(returned), total=len(todo_r)) from None


def _run_pool(tasks: Sequence[Task], run: Run, todo: Iterable[int], jobs: int, done,
              environment: compilers.Environment | None = None) -> None:
  # spawn, not fork: JAX's runtime threads do not survive a fork.
  ctx = multiprocessing.get_context("spawn")
  cpu = max(t.cpu_devices for t in tasks)
  pool = cf.ProcessPoolExecutor(
      max_workers=jobs, mp_context=ctx, initializer=init_worker, initargs=(cpu, chosen_platforms(), environment)
  )
  try:
    futures = {pool.submit(run, tasks[i]): i for i in todo}
    for f in cf.as_completed(futures):
      done(futures[f], f.result())
  finally:
    pool.shutdown(wait=True, cancel_futures=True)


def _run_dask(tasks: Sequence[Task], run: Run, todo: Iterable[int], address: str, done) -> None:
  try:  # an optional dependency (the dask extra): imported only when asked for
    from distributed import Client, as_completed
  except ImportError:
    raise JaxmemError("`scheduler` needs Dask: pip install 'jaxmem[dask]'") from None
  _check_scheduler_address(address)
  try:
    client = Client(address, timeout="10s")
  except OSError as e:
    raise JaxmemError(f"cannot reach the Dask scheduler at {address}: {e}") from None
  except (TypeError, ValueError) as e:  # an address Dask cannot use (tls:// without its security settings)
    raise JaxmemError(f"cannot use the Dask scheduler address {address}: {e}") from None
  try:
    futures = {client.submit(run, tasks[i], pure=False): i for i in todo}
    for f in as_completed(list(futures)):
      done(futures[f], f.result())
  finally:
    client.close()


def _check_scheduler_address(address: str) -> None:
  """A TCP address without a port, or one whose connection is refused, is a final answer: say
  so at once rather than after the Dask client's 10 s of retries (an unanswered one, e.g. a
  firewalled host, still waits for them)."""
  from distributed.comm import parse_address, parse_host_port  # Dask's own reading of the address

  scheme, location = parse_address(address)
  if scheme != "tcp":
    return  # another protocol (tls://, inproc://, ucx://): the client decides
  try:
    host, port = parse_host_port(location)
  except ValueError as e:
    raise JaxmemError(f"`scheduler` {address}: {e}; write tcp://HOST:PORT (a scheduler listens on 8786)") from None
  try:
    socket.create_connection((host, port), timeout=2).close()
  except ConnectionRefusedError:
    raise JaxmemError(
        f"cannot reach the Dask scheduler at {address}: connection refused (is `dask scheduler` running there?)"
    ) from None
  except OSError:
    return  # unresolved or unanswered: the client's own timeout and message
