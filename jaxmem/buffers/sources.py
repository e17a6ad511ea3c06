"""Which line and which module of the user's code made a buffer, from the HLO's metadata.

Every instruction of the optimized module carries jax's ``op_name`` (the transformations and
named scopes it was traced under, then the primitive) and a stack of Python frames
(:meth:`jaxmem.hlo.text.Module.stack`). Library frames are the framework packages' (jax,
jaxlib, flax, optax, keras, haiku, equinox: :data:`FRAMEWORK_PACKAGES`, and any the caller adds,
by the installed packages' directories) and the standard library's; every other frame is the
user's model code, wherever it lives, ``site-packages`` included (a model library installed from
PyPI, such as keras_hub, is model code to its user). Frames of jaxmem's entry points (everything in the jaxmem package
but the train step in ``jaxmem/program``) are where the program was traced *from*, not part of it:
the stack is cut there.

- ``source``: ``file:line`` of the innermost user frame.
- ``framework``: ``file:line`` of the framework's frame the user's code called into (the
  outermost framework frame inside the innermost user frame, e.g. Keras's
  ``keras/src/backend/jax/nn.py:1805`` under a model's attention), None without one.
- ``module``: the class of the innermost user frame that is a method (a plain function called
  from a method, such as ``dot_attend`` from ``Attention.__call__``, is the class's); else the
  named scopes in ``op_name`` (Flax Linen's ``transformer/h/3/attn``, ``jax.named_scope``), with
  layer numbers as ``*`` so a model's layers add up; else the innermost user function; else the
  optax transformation; else the explained function's name.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import os
import re
import sysconfig

from jaxmem.hlo.text import Instruction, Module

# Packages whose frames are library code: XLA's stack points past them to the user's line.
FRAMEWORK_PACKAGES = ("jax", "jaxlib", "flax", "optax", "keras", "haiku", "equinox")

# Scope names jax itself puts in op_name (transformations print with parentheses, einsum
# specs with commas or arrows, and are recognised by those).
_JAX_SCOPES = frozenset({
    "body", "branch", "checkpoint", "closed_call", "cond", "core_call", "custom_jvp_call", "custom_vjp_call",
    "custom_vjp_call_jaxpr", "eval_jaxpr", "jit", "named_call", "pjit", "remat", "rematted_computation", "scan",
    "shard_map", "switch", "while", "xla_call",
})


@dataclasses.dataclass(frozen=True, kw_only=True)
class Attribution:
  """Where an instruction comes from in the user's code."""

  op_name: str
  source: str | None  # file:line of the innermost user frame, None when the stack has none
  module: str
  phase: str  # forward, backward, optimizer or other, from op_name (and optax frames)
  framework: str | None = None  # file:line of the framework frame the user's line called into


def attribute(hlo: Module, ins: Instruction | None, *, fallback: str, packages: tuple[str, ...] = ()) -> Attribution:
  """The attribution of ``ins`` (see the module docstring); ``fallback`` names code with no
  user frame and no scope (the explained function); ``packages`` are framework packages beyond
  :data:`FRAMEWORK_PACKAGES` whose frames are not the user's."""
  if ins is None:
    return Attribution(op_name="", source=None, module="(compiler)", phase="other")
  stack = traced_part(hlo.stack(ins.frame))
  user_at = [i for i, (f, _, _) in enumerate(stack) if not is_library(f, packages)]
  user = [stack[i] for i in user_at]
  source = f"{display_path(user[0][0])}:{user[0][2]}" if user else None
  inside = stack[:user_at[0]] if user_at else stack  # the frames the innermost user line called
  called = [(f, line) for f, _, line in inside if not _is_stdlib(f)]
  framework = f"{display_path(called[-1][0])}:{called[-1][1]}" if called else None
  module = (
      next((c for _, fn, _ in user if (c := class_of(fn))), None)
      or scope_of(ins.op_name)
      or next((n for _, fn, _ in user if (n := function_of(fn))), None)
      or next((f"optax {fn.split('.')[0]}" for f, fn, _ in stack if _in_package(f, "optax")), None)
      or (fallback if stack else "(compiler)")
  )
  return Attribution(
      op_name=ins.op_name, source=source, module=module, phase=phase_of(ins.op_name, stack), framework=framework
  )


def phase_of(op_name: str, stack: list[tuple[str, str, int]]) -> str:
  if "transpose(jvp" in op_name:
    return "backward"
  if "jvp(" in op_name:
    return "forward"
  if any(_in_package(f, "optax") for f, _, _ in stack):
    return "optimizer"
  return "other"


def class_of(function: str) -> str | None:
  """The class a frame's function is a method of, from its qualified name: ``Attention`` for
  ``Attention.__call__`` and for ``Transformer.hidden.<locals>.body`` (a closure in a method);
  None for ``f``, ``f.<locals>.g`` and ``<module>``."""
  for scope in reversed(function.split(".<locals>.")):
    parts = scope.split(".")
    if len(parts) >= 2 and not parts[-2].startswith("<"):
      return parts[-2]
  return None


def function_of(function: str) -> str | None:
  """A plain function's own name (``loss`` for ``step.<locals>.loss``; the enclosing function
  for a lambda); None for module-level code."""
  parts = [p for p in function.split(".") if not p.startswith("<")]
  return parts[-1] if parts else None


def scope_of(op_name: str) -> str | None:
  """The user's named scopes in ``op_name`` (Flax Linen's module path, ``jax.named_scope``), layer
  numbers as ``*``: ``encoder/*/mlp`` for ``jit(step)/transpose(jvp(encoder/3/mlp))/dot_general``.

  jax prints the scopes a transformation saw inside its name (``jvp(encoder/3/mlp)``), those
  entered outside it after it (``jvp(Model)/transformer/h/3/attn``); a jitted function's name
  (``jit(silu)``) and einsum specs (``btd,df->btf``) are not scopes.
  """
  parts = [p for p in _scope_parts(_split_path(op_name)[:-1]) if p and not _jax_scope(p)]
  return "/".join("*" if p.isdigit() else p for p in parts) or None


def _scope_parts(parts: list[str]) -> list[str]:
  out = []
  for part in parts:
    m = re.fullmatch(r"([\w.]+)\((.*)\)", part)
    if m is None:
      out.append(part)
    elif m.group(1) not in ("jit", "pjit", "xla_call"):
      out += _scope_parts(_split_path(m.group(2)))
  return out


def _split_path(op_name: str) -> list[str]:
  """``op_name`` split at the slashes outside parentheses."""
  parts, depth, cur = [], 0, []
  for c in op_name:
    depth += (c == "(") - (c == ")")
    if c == "/" and depth == 0:
      parts.append("".join(cur))
      cur = []
    else:
      cur.append(c)
  return parts + ["".join(cur)]


def _jax_scope(part: str) -> bool:
  return part in _JAX_SCOPES or any(c in part for c in "(,>") or re.fullmatch(r"branch_\d+(_fun)?", part) is not None


# ----------------------------------------------------------------------------- paths


def is_library(path: str, packages: tuple[str, ...] = ()) -> bool:
  """A frame of a framework package (:data:`FRAMEWORK_PACKAGES` and ``packages``) or of the
  standard library (see the module docstring)."""
  if any(_in_package(path, p) for p in (*FRAMEWORK_PACKAGES, *packages)):
    return True
  return _is_stdlib(path)


def _is_stdlib(path: str) -> bool:
  if path.startswith("<frozen"):
    return True
  if any(m in path for m in ("site-packages", "dist-packages")):
    return False  # the standard library's directory holds site-packages; what is there is not it
  return any(path.startswith(root) for root in _stdlib_roots())


def traced_part(stack: list[tuple[str, str, int]]) -> list[tuple[str, str, int]]:
  """``stack`` up to the first frame of jaxmem's own entry points, which traced the program."""
  roots = _jaxmem_entry_roots()
  for i, (f, _, _) in enumerate(stack):
    if any(f.startswith(r) for r in roots):
      return stack[:i]
  return stack


def display_path(path: str) -> str:
  """``path`` as a reader knows it: relative to the checkout for jaxmem's files and models
  (``models/attention.py``), to ``site-packages`` for an installed package
  (``usermodel/model.py``), to the working directory for files under it; else as it is."""
  for root in _package_parents():
    if path.startswith(root):
      return path[len(root):]
  for marker in ("site-packages/", "dist-packages/"):
    if marker in path:
      return path.rsplit(marker, 1)[1]
  cwd = os.getcwd().rstrip(os.sep) + os.sep
  return path[len(cwd):] if path.startswith(cwd) else path


def _in_package(path: str, package: str) -> bool:
  return any(path.startswith(root) for root in _package_roots(package))


@functools.cache
def _package_roots(package: str) -> tuple[str, ...]:
  """The directories a package's modules are loaded from (as imported, and resolved)."""
  try:
    spec = importlib.util.find_spec(package)
  except (ImportError, ValueError):
    spec = None
  locations = list(spec.submodule_search_locations or []) if spec is not None else []
  return tuple({d.rstrip(os.sep) + os.sep for loc in locations for d in (loc, os.path.realpath(loc))})


@functools.cache
def _stdlib_roots() -> tuple[str, ...]:
  paths = sysconfig.get_paths()
  dirs = {paths[k] for k in ("stdlib", "platstdlib") if paths.get(k)}
  return tuple({d.rstrip(os.sep) + os.sep for p in dirs for d in (p, os.path.realpath(p))})


@functools.cache
def _jaxmem_entry_roots() -> tuple[str, ...]:
  # jaxmem/program holds the preset's train step: traced code, not an entry point.
  out = []
  for root in _module_dirs("jaxmem"):
    for entry in os.listdir(root):
      path = os.path.join(root, entry)
      if os.path.isdir(path) and entry != "program":
        out.append(path + os.sep)
      elif entry.endswith(".py"):
        out.append(path)
  return tuple(out)


@functools.cache
def _package_parents() -> tuple[str, ...]:
  """The directories holding ``jaxmem/`` and (installed as ``jaxmem.models``) ``models/``."""
  return tuple({os.path.dirname(r.rstrip(os.sep)) + os.sep for r in _module_dirs("jaxmem") + _module_dirs("jaxmem.models")})


def _module_dirs(name: str) -> tuple[str, ...]:
  """The directory of package ``name``'s ``__init__`` (as imported, and resolved)."""
  d = os.path.dirname(importlib.import_module(name).__file__)
  return tuple({d + os.sep, os.path.realpath(d) + os.sep})
