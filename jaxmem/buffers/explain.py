"""``jaxmem.explain``: what fills the memory of a compiled step, for any jittable function of
yours or for a preset train step.

One function serves both, told apart by its first argument: a callable is explained as a
function of the arguments that follow (:func:`explain_function`); anything else is a
:class:`~jaxmem.workload.Workload` (or nothing) with keyword fields, a preset train step
(:func:`explain_workload`, a thin caller of :func:`explain_function` that names its arguments
``params`` and ``opt_state`` and regroups the consumers as params / gradients / optimizer_state
/ activations / workspace). Both compile once with XLA's dump on (text and HloProto), read it
(:func:`jaxmem.buffers.analyse.analyse`) and keep the optimized module for XProf
(:meth:`~jaxmem.buffers.analyse.Explanation.to_xprof`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import jax

from jaxmem import compilers
from jaxmem.axes import one_value_each
from jaxmem.buffers.analyse import Explanation, analyse, parse_kinds
from jaxmem.buffers.xprof import DUMP_AS_PROTO, OptimizedHlo, read_optimized_hlo
from jaxmem.compiler.analysis import Lowering, lower_for_target
from jaxmem.compiler.figures import Figures
from jaxmem.compiler.report import Refusal
from jaxmem.hardware.startup import in_worker
from jaxmem.hardware.targets import Target
from jaxmem.errors import CompilerRefused, JaxmemError
from jaxmem.events import Compiling, emit
from jaxmem.hlo.dump import Dump, read_dump
from jaxmem.options import RunOptions
from jaxmem.program.step import call_step, step_notes
from jaxmem.resolve import build_program, configuration, for_task, plan
from jaxmem.program import sharding as shd
from jaxmem.records import Configuration
from jaxmem.workload import Workload

# A preset's consumers, in the order they are shown.
CONSUMERS = ("params", "gradients", "optimizer_state", "activations", "workspace", "generated_code")
ESTIMATED = ("gradients", "activations", "workspace")


def explain(
    fn_or_workload: Any = None, /, *args: Any, target: str | Target | None = None, top: int = 10,
    kinds: str | Sequence[str] | None = None, framework_packages: str | Sequence[str] = (),
    run: RunOptions | None = None, **kwargs: Any,
) -> Explanation:
  """What fills the memory of a compiled step, per device: the budget by consumer (summing to
  the compiler's total), the ``top`` buffers live at the peak with the line of your code that
  made each, the live set by module and kind, and the timeline.

  ``kinds`` limits the listed buffers to some kinds (``"temporary,saved residual"``, or
  ``["temporary", "residual"]``; the kinds are ``parameter``, ``output``, ``saved residual``,
  ``gradient``, ``temporary``): the ``top`` largest of those; the consumers, ``by_module`` and
  ``by_kind`` stay the whole live set's.

  A buffer's ``source`` is the innermost line outside the framework packages (jax, flax, optax,
  keras, haiku, equinox, and ``framework_packages``: a comma list or a sequence of package names
  whose frames are library code to you), its ``framework`` the framework's line that one called.

  ``explain(fn, *args, target=None, top=10, **jit_kwargs)`` explains any jittable function:
  ``args`` may be ``jax.ShapeDtypeStruct`` (nothing is allocated) or arrays; ``target`` and the
  handling of unsharded inputs are :func:`jaxmem.analyze`'s; ``jit_kwargs`` go to ``jax.jit``
  (a function already jitted is used as it is when none are given). Its consumers are the
  argument groups (``params``, ``opt_state.mu``, ``batch``: the function's argument names and
  their pytree paths) and, for everything else, ``output``, ``saved residual``, ``gradient``,
  ``temporary`` and ``generated_code``.

  ``explain(workload=None, *, top=10, **fields)`` explains a preset train step: a
  :class:`~jaxmem.workload.Workload` (or its fields as keywords) naming one mesh, optimizer and
  remat policy (``none`` unless another is named); its consumers are ``params``, ``gradients``,
  ``optimizer_state``, ``activations``, ``workspace`` and ``generated_code``.

  ``run`` (:class:`jaxmem.options.RunOptions`, or its fields as keywords): ``on_start`` is told
  of the one compile, ``on_row`` given the explanation; ``jobs``, ``scheduler`` and ``cache``
  are refused (one compile in this process, nothing cached). Listeners
  (:func:`jaxmem.events.listen`) hear a :class:`~jaxmem.events.Compiling` event before the step
  is traced and compiled, as compare's do.

  A target by name is resolved as the CLI's ``--target`` (:func:`jaxmem.analyze`'s), so the
  explanation's ``capacity_bytes``, ``fits``, ``verdict`` and notes are the command's.

  >>> import jax, jax.numpy as jnp, jaxmem
  >>> def step(w, x):
  ...   return jax.grad(lambda w: jnp.tanh(x @ w).sum())(w)
  >>> w = jax.ShapeDtypeStruct((512, 512), jnp.float32)
  >>> x = jax.ShapeDtypeStruct((128, 512), jnp.float32)
  >>> r = jaxmem.explain(step, w, x, target="cpu")
  >>> r.arguments
  {'w': 1048576, 'x': 262144}
  >>> sum(r.consumers.values()) == r.footprint_bytes
  True
  >>> r = jaxmem.explain(model="tiny", batch=2, seq=16, target="cpu")
  >>> list(r.consumers)
  ['params', 'gradients', 'optimizer_state', 'activations', 'workspace', 'generated_code']
  """
  packages = framework_names(framework_packages)
  run = RunOptions.of(run, kwargs)
  run.refuse("explain", "it compiles one configuration, in this process, and keeps no rows", "jobs", "scheduler", "cache")
  if callable(fn_or_workload):
    run.start(1)
    result = explain_function(
        fn_or_workload, *args, target=target, top=top, kinds=kinds, framework_packages=packages, **kwargs
    )
  elif args or not (fn_or_workload is None or isinstance(fn_or_workload, Workload)):
    raise JaxmemError(
        f"explain takes a function to explain and its arguments, or a Workload and keyword fields "
        f"(got {type(fn_or_workload).__name__} first); for a preset write explain(model='gpt2-small', ...)"
    )
  else:
    run.start(1)
    result = explain_workload(fn_or_workload, target=target, top=top, kinds=kinds, framework_packages=packages, **kwargs)
  run.row(result)
  return result


def framework_names(packages: str | Sequence[str]) -> tuple[str, ...]:
  """Package names from a comma list or a sequence, each a dotted Python name (else one line)."""
  names = [n.strip() for n in (packages.split(",") if isinstance(packages, str) else packages) if n.strip()]
  for n in names:
    if not all(part.isidentifier() for part in n.split(".")):
      raise JaxmemError(f"`framework_packages`: {n!r} is not a Python package name")
  return tuple(names)


def explain_function(
    fn: Callable, *args: Any, target: str | Target | None = None, top: int = 10, kinds: str | Sequence[str] | None = None,
    framework_packages: Sequence[str] = (), notes: Sequence[str] = (), always_compile: bool = False, **jit_kwargs: Any,
) -> Explanation:
  """:func:`explain` for a function: compiles ``jax.jit(fn, **jit_kwargs)`` for ``args`` on
  ``target`` with XLA's dump on and explains it (``always_compile``: as the workload field)."""
  _check_top(top)
  parse_kinds(kinds)  # a bad kind is an error before the compile
  where = target if isinstance(target, str) or target is None else target.name
  _compiling(f"{_function_name(fn)}" + (f" for {where}" if where else ""))
  return explain_lowering(
      lower_for_target(fn, *args, target=target, **jit_kwargs), function=_function_name(fn), top=top, kinds=kinds,
      framework_packages=framework_packages, notes=notes, always_compile=always_compile,
  )


def explain_lowering(
    lowering: Lowering, *, function: str, top: int = 10, kinds: str | Sequence[str] | None = None,
    framework_packages: Sequence[str] = (), notes: Sequence[str] = (), always_compile: bool = False,
    kernel_named: bool = False,
) -> Explanation:
  """:func:`explain_function` from a traced and lowered program (``notes`` added to its own;
  ``kernel_named`` as :meth:`~jaxmem.compiler.analysis.Lowering.figures` takes it)."""
  figures, dump, optimized = compile_with_dump(lowering, notes=notes, always_compile=always_compile,
                                               kernel_named=kernel_named)
  # Everything is read from the executable here, and it is not kept (report.compiled is None):
  # the executable compiled with the dump options is released now, while the backend that made
  # it is alive, not among the interpreter's last objects at exit.
  report = dataclasses.replace(figures.report, compiled=None)  # with the jaxpr: FLOPs per device, arguments by name
  mesh = _mesh_of(figures.compiled)
  verdict = dict(capacity_bytes=figures.capacity_bytes, required_bytes=figures.required_bytes,
                 judgement=figures.verdict)
  # The caller's, the capacity's, the verdict's: not the step-time estimate's, which an
  # explanation does not show.
  extra = tuple(n for n in figures.memory_notes if n not in report.notes)
  del figures
  target_name = lowering.target.name if lowering.target is not None else report.platform
  r = analyse(
      dump, report, top=top, function=function, optimized_hlo=optimized,
      target=target_name, mesh=mesh, kinds=kinds, framework_packages=framework_packages,
  )
  return dataclasses.replace(r, **verdict, notes=r.notes + extra)


def explain_workload(
    workload: Workload | None = None, /, *, top: int = 10, kinds: str | Sequence[str] | None = None,
    framework_packages: Sequence[str] = (), **fields: Any,
) -> Explanation:
  """:func:`explain` for a preset train step: ``workload`` with ``fields`` replaced (a workload
  with a ``step`` factory: that step, :func:`explain_step`)."""
  w = Workload.of(workload, {"remat": "none"}, **fields)
  _check_top(top)
  parse_kinds(kinds)
  if w.step:
    return explain_step(w, top=top, kinds=kinds, framework_packages=framework_packages)
  one_value_each(w, "explain")
  p = plan(w)  # the compiler release, if one is named, is fetched here, before anything compiles
  if w.compiler:
    return _under_release(w, p.tasks()[-1].cpu_devices, top=top, kinds=kinds, framework_packages=framework_packages)
  # The remat list starts with "none"; the last configuration is the one named.
  one, m, opt, rp = for_task(p, p.tasks()[-1])
  _compiling(f"{p.cfg.name} for {p.target.name}: mesh {shd.format_mesh(m)}, remat {rp.name}, optimizer {opt.name}, "
             f"batch {p.batch}, seq {p.seq}")
  prog = build_program(one, m, opt, rp)
  with prog.attention.lowering() if prog.attention is not None else contextlib.nullcontext():
    # Its attention is the implementation named in the configuration: no note on the kernel.
    r = explain_lowering(lower_for_target(prog.step, *prog.args, target=p.target), function=_function_name(prog.step),
                         top=top, kinds=kinds, framework_packages=framework_packages, always_compile=w.always_compile,
                         kernel_named=True)
  params, state = list(inspect.signature(prog.step).parameters)[:2]
  return dataclasses.replace(
      r, target=p.target.name, mesh=shd.format_mesh(m), configuration=Configuration(**configuration(one, m, opt, rp, prog)),
      consumers=preset_consumers(r.consumers, params=params, optimizer_state=state), estimated=ESTIMATED,
      notes=prog.notes + r.notes,
  )


def _under_release(w: Workload, cpu_devices: int, **options: Any) -> Explanation:
  """:func:`explain_workload` of ``w`` in a worker process that loads its compiler release
  (:mod:`jaxmem.compilers`); the explanation records the release it was compiled under."""
  (spec,) = w.compiler
  r = in_worker(explain_workload, w.replace(compiler=()), environment=compilers.environment(spec),
                cpu_devices=cpu_devices, **options)
  return dataclasses.replace(r, configuration=dataclasses.replace(r.configuration, compiler=spec))


def explain_step(
    w: Workload, *, top: int = 10, kinds: str | Sequence[str] | None = None, framework_packages: Sequence[str] = ()
) -> Explanation:
  """A user's step factory (``w.step``) at the workload and the one remat policy named, explained
  as the function it returns (``explain(fn, *args, target=..., **jit_kwargs)``)."""
  if len(w.remat) > 1:
    raise JaxmemError(f"explain takes one remat (got {', '.join(w.remat)}); run it once per remat")
  if len(w.mesh) > 1:
    raise JaxmemError("explain takes one mesh; run it once per mesh")
  p = plan(w)
  mesh, _, rp = p.configs()[-1]  # the remat list starts with "none"; the last is the one named
  one = p.tasks()[-1].workload  # the configuration's own values (MaxText's step reads its names there)
  _compiling(f"{p.workload.model_name} for {p.target.name}: mesh {shd.format_mesh(mesh)}, remat {rp.name}, "
             f"batch {p.batch}, seq {p.seq}")
  fn, fargs, jit_kwargs = call_step(
      p.workload.step, batch=p.batch, seq=p.seq, remat=rp.policy, mesh=p.target.make_mesh(mesh), target=p.target,
      workload=one,
  )
  lowering = lower_for_target(fn, *fargs, target=p.target, **jit_kwargs)
  return explain_lowering(
      lowering, function=_function_name(fn), top=top, kinds=kinds, framework_packages=framework_packages,
      notes=step_notes(lowering.traced, rp), always_compile=w.always_compile, kernel_named=bool(w.maxtext),
  )


def preset_consumers(consumers: dict[str, int | None], *, params: str, optimizer_state: str) -> dict[str, int | None]:
  """A train step's consumers as the presets show them: the argument groups of argument
  ``params`` and of ``optimizer_state``, saved residuals as activations, gradients, and the rest
  (the token batch, other temporaries, outputs not written in place) as workspace."""
  if any(v is None for v in consumers.values()):
    return dict.fromkeys(CONSUMERS)

  def of(argument: str) -> int:
    return sum(v for k, v in consumers.items() if k == argument or k.startswith(f"{argument}."))

  out = dict(
      params=of(params), gradients=consumers["gradient"], optimizer_state=of(optimizer_state),
      activations=consumers["saved residual"], generated_code=consumers["generated_code"],
  )
  out["workspace"] = sum(consumers.values()) - sum(out.values())
  return {k: out[k] for k in CONSUMERS}


def compile_with_dump(
    lowering: Lowering, *, notes: Sequence[str] = (), always_compile: bool = False, kernel_named: bool = False,
) -> tuple[Figures, Dump, OptimizedHlo]:
  """Compiles with XLA's text and HloProto dumps on and reads them; a refused compile (or
  arguments alone over the target's capacity, when nothing is compiled, unless
  ``always_compile``) is a :class:`~jaxmem.errors.CompilerRefused` saying what the compiler needed."""
  with tempfile.TemporaryDirectory(prefix="jaxmem-explain-") as d:
    # The three backends honour these options alike (checked on jaxlib 0.10.2 and 0.12.0.1).
    outcome = lowering.figures(
        notes=notes, compiler_options={"xla_dump_to": d, "xla_dump_hlo_as_text": True, **DUMP_AS_PROTO},
        always_compile=always_compile, kernel_named=kernel_named,
    )
    if isinstance(outcome, Refusal):
      need = "" if outcome.required_bytes is None else f" (needs {outcome.required_bytes:,} bytes)"
      who = "the compiler refused this configuration" if outcome.cause is not None else "this configuration cannot fit"
      raise CompilerRefused(f"{who}{need}, so there is no plan to explain: {outcome.error}",
                            required_bytes=outcome.required_bytes, capacity_bytes=outcome.capacity_bytes,
                            out_of_memory=outcome.fits is False, compiled=outcome.cause is not None,
                            reason=outcome.error)
    dump = read_dump(d)
    optimized = read_optimized_hlo(d, module_name=dump.hlo.name or None)
  return outcome, dump, optimized


def _compiling(label: str) -> None:
  """Tells listeners the one compile is about to start (the CLI prints a line: a step's trace and
  compile can take minutes)."""
  emit(Compiling(index=1, total=1, label=label))


def _check_top(top: int) -> None:
  if top < 1:
    raise JaxmemError(f"`top` must be at least 1 (got {top})")


def _function_name(fn: Callable) -> str:
  inner = getattr(fn, "__wrapped__", fn)  # a jax.jit-wrapped function's own
  while isinstance(inner, functools.partial):
    inner = inner.func
  return getattr(inner, "__qualname__", None) or getattr(inner, "__name__", None) or type(inner).__name__


def _mesh_of(compiled: jax.stages.Compiled) -> str:
  """The inputs' mesh as ``axis=size,...`` (``devices=N`` when jaxmem replicated them); empty
  for inputs on single devices."""
  for s in jax.tree_util.tree_leaves(compiled.input_shardings):
    mesh = getattr(s, "mesh", None)
    if mesh is not None and getattr(mesh, "shape", None):
      return shd.format_mesh(tuple(mesh.shape.items()))
  return ""
