"""Open a compile that never ran in XProf's Memory Viewer.

XProf (``pip install 'jaxmem[xprof]'``, then ``xprof --logdir DIR``) shows memory from profiles
captured on hardware. A profiling session records each compiled module's optimized ``HloProto``
(the module with XLA's buffer assignment and heap-simulator trace) in the ``/host:metadata``
plane of the ``XSpace`` it writes, and that proto is all the Memory Viewer and the Graph Viewer
read. A compile for a target that is not attached writes the same ``HloProto`` to its dump
directory, so wrapping it the way a profiling session does gives a logdir that XProf opens for a
program that never ran (format: shared/notes/xprof-deviceless.md, checked with xprof 2.24.2).

>>> with tempfile.TemporaryDirectory() as d:                    # doctest: +SKIP
...   compiled = lowered.compile({"xla_dump_to": d, **DUMP_AS_PROTO})
...   hlo = read_optimized_hlo(d)
>>> write_logdir(hlo.hlo_proto, hlo.module_name, "logs")         # doctest: +SKIP
'logs/plugins/profile/2025_01_31_12_00_00/jaxmem.xplane.pb'
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
import types
from typing import Any

from jaxmem.errors import JaxmemError
from jaxmem.hlo.dump import DumpFormatError

# Compiler options that make XLA write each module's HloProto next to whatever else it dumps;
# used with {"xla_dump_to": DIR}. They combine with "xla_dump_hlo_as_text" (explain's text dump):
# checked on XLA:CPU, gpu:h100 and tpu:v5e-1 with jax 0.10.2 and 0.12.0.1.
DUMP_AS_PROTO: dict[str, Any] = {"xla_dump_hlo_as_proto": True}

# The one dump file per module that holds field 3 of HloProto, buffer_assignment. The backends
# spell the stem differently (CPU ``module_0000.jit_f.cpu_after_optimizations.hlo.pb``, GPU
# ``module_0001.jit_f.sm_9.0a_gpu_after_optimizations.hlo.pb``, TPU
# ``module_0000.jit_f.cl_<id>.after_optimizations.hlo.pb``); TPU's
# ``after_optimizations_{before,after}_buffer_assignment.hlo.pb`` end differently and are not it.
_OPTIMIZED_SUFFIX = "after_optimizations.hlo.pb"

# Names from XLA's profiler schema (xla/tsl/profiler/utils/xplane_schema.cc): the plane a
# profiling session writes its HLO protos to, and the stat names that XProf looks up.
METADATA_PLANE = "/host:metadata"
HLO_PROTO_STAT = "Hlo Proto"
PROGRAM_ID_STAT = "program_id"

_INSTALL = "pip install 'jaxmem[xprof]'"


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizedHlo:
  """The optimized module of one compile, as XLA dumped it for XProf."""

  hlo_proto: bytes  # a serialized xla.HloProto with buffer_assignment
  module_name: str  # the jit module, e.g. "jit_train_step"
  program_id: int  # HloModuleProto.id, the number in the dump's "module_NNNN" prefix
  file: str  # the dump file it came from

  @property
  def xprof_module(self) -> str:
    """The name XProf lists the module under and takes as ``module_name=``: ``jit_f(1)``."""
    return xprof_module_name(self.module_name, self.program_id)


def xprof_module_name(module_name: str, program_id: int) -> str:
  # XProf keys modules as "<HloModuleProto.name>(<program id>)" (HloModuleNameWithProgramId in
  # xla/tsl/profiler/convert/xla_op_utils.h).
  return f"{module_name}({program_id})"


# ----------------------------------------------------------------------------- protobuf schema


# No installed package ships a Python module for XLA's profiler protos: the xprof wheel (2.24.2)
# carries xplane.proto only compiled into its C++ library, jax and jaxlib carry none, and
# tensorflow's xplane_pb2 would mean installing tensorflow. So the messages this module writes
# and reads are declared here, field for field as in xla/tsl/profiler/protobuf/xplane.proto and
# xla/service/hlo.proto, and the protobuf library (a dependency of flax through orbax, and of
# xprof) does the encoding. They live in a private descriptor pool, so a process that also
# imports tensorflow's copy of the same messages sees no clash. Only the fields used are
# declared; parsing keeps the others as unknown fields.
_I64, _U64, _DOUBLE, _STRING, _BYTES, _MESSAGE = "int64", "uint64", "double", "string", "bytes", "message"
_XPLANE_FIELDS: dict[str, list[tuple]] = {
    # message: [(field, number, type, repeated, message type, oneof)]
    "XSpace": [
        ("planes", 1, _MESSAGE, True, "XPlane", None),
        ("errors", 2, _STRING, True, None, None),
        ("warnings", 3, _STRING, True, None, None),
        ("hostnames", 4, _STRING, True, None, None),
    ],
    "XPlane": [
        ("id", 1, _I64, False, None, None),
        ("name", 2, _STRING, False, None, None),
        ("event_metadata", 4, "map", True, "XEventMetadata", None),
        ("stat_metadata", 5, "map", True, "XStatMetadata", None),
        ("stats", 6, _MESSAGE, True, "XStat", None),
    ],
    # The value is a oneof, so a zero (program id 0) is still written and read back as set.
    "XStat": [
        ("metadata_id", 1, _I64, False, None, None),
        ("double_value", 2, _DOUBLE, False, None, "value"),
        ("uint64_value", 3, _U64, False, None, "value"),
        ("int64_value", 4, _I64, False, None, "value"),
        ("str_value", 5, _STRING, False, None, "value"),
        ("bytes_value", 6, _BYTES, False, None, "value"),
        ("ref_value", 7, _U64, False, None, "value"),
    ],
    "XEventMetadata": [
        ("id", 1, _I64, False, None, None),
        ("name", 2, _STRING, False, None, None),
        ("metadata", 3, _BYTES, False, None, None),
        ("display_name", 4, _STRING, False, None, None),
        ("stats", 5, _MESSAGE, True, "XStat", None),
        ("child_id", 6, _I64, True, None, None),
    ],
    "XStatMetadata": [
        ("id", 1, _I64, False, None, None),
        ("name", 2, _STRING, False, None, None),
        ("description", 3, _STRING, False, None, None),
    ],
}
_HLO_FIELDS: dict[str, list[tuple]] = {
    # buffer_assignment is a BufferAssignmentProto; declared as bytes (the same wire type), as
    # only whether it is there is read.
    "HloProto": [
        ("hlo_module", 1, _MESSAGE, False, "HloModuleProto", None),
        ("buffer_assignment", 3, _BYTES, False, None, None),
    ],
    "HloModuleProto": [
        ("name", 1, _STRING, False, None, None),
        ("id", 5, _I64, False, None, None),
    ],
}


def _file_descriptor(name: str, package: str, messages: dict[str, list[tuple]]):
  from google.protobuf import descriptor_pb2

  fdp = descriptor_pb2.FieldDescriptorProto
  scalar = {
      _I64: fdp.TYPE_INT64, _U64: fdp.TYPE_UINT64, _DOUBLE: fdp.TYPE_DOUBLE,
      _STRING: fdp.TYPE_STRING, _BYTES: fdp.TYPE_BYTES,
  }
  f = descriptor_pb2.FileDescriptorProto(name=name, package=package, syntax="proto3")
  for msg_name, fields in messages.items():
    msg = f.message_type.add(name=msg_name)
    oneofs: list[str] = []
    for field, number, kind, repeated, type_name, oneof in fields:
      fd = msg.field.add(name=field, number=number)
      fd.label = fdp.LABEL_REPEATED if repeated else fdp.LABEL_OPTIONAL
      if kind == "map":
        # A proto map<int64, V> is a repeated nested "<Field>Entry" message marked map_entry.
        entry = msg.nested_type.add(name="".join(p.title() for p in field.split("_")) + "Entry")
        entry.options.map_entry = True
        entry.field.add(name="key", number=1, label=fdp.LABEL_OPTIONAL, type=fdp.TYPE_INT64)
        entry.field.add(
            name="value", number=2, label=fdp.LABEL_OPTIONAL, type=fdp.TYPE_MESSAGE,
            type_name=f".{package}.{type_name}",
        )
        fd.type, fd.type_name = fdp.TYPE_MESSAGE, f".{package}.{msg_name}.{entry.name}"
      elif kind == _MESSAGE:
        fd.type, fd.type_name = fdp.TYPE_MESSAGE, f".{package}.{type_name}"
      else:
        fd.type = scalar[kind]
      if oneof is not None:
        if oneof not in oneofs:
          oneofs.append(oneof)
          msg.oneof_decl.add(name=oneof)
        fd.oneof_index = oneofs.index(oneof)
  return f


@functools.cache
def _messages() -> types.SimpleNamespace:
  """The message classes, built once per process."""
  try:
    from google.protobuf import descriptor_pool, message_factory
  except ImportError:
    raise JaxmemError(f"writing an XProf logdir needs the protobuf package: {_INSTALL}") from None
  pool = descriptor_pool.DescriptorPool()
  pool.Add(_file_descriptor("jaxmem/xplane.proto", "tensorflow.profiler", _XPLANE_FIELDS))
  pool.Add(_file_descriptor("jaxmem/hlo.proto", "xla", _HLO_FIELDS))

  def cls(full_name: str):
    desc = pool.FindMessageTypeByName(full_name)
    if hasattr(message_factory, "GetMessageClass"):  # protobuf >= 4.22
      return message_factory.GetMessageClass(desc)
    return message_factory.MessageFactory(pool).GetPrototype(desc)

  names = {n: f"tensorflow.profiler.{n}" for n in _XPLANE_FIELDS} | {n: f"xla.{n}" for n in _HLO_FIELDS}
  return types.SimpleNamespace(**{n: cls(full) for n, full in names.items()})


def xplane_messages() -> types.SimpleNamespace:
  """``XSpace``, ``XPlane``, ``XStat``, ... message classes (the subset declared above)."""
  return _messages()


# ----------------------------------------------------------------------------- reading the dump


def _parse_hlo(data: bytes, what: str):
  from google.protobuf.message import DecodeError

  proto = _messages().HloProto()
  try:
    proto.ParseFromString(data)
  except DecodeError as e:
    raise DumpFormatError(f"{what} is not a serialized xla.HloProto ({e})") from None
  return proto


def read_optimized_hlo(directory: str, *, module_name: str | None = None) -> OptimizedHlo:
  """The optimized module's ``HloProto`` from a dump written with ``{"xla_dump_to": directory,
  **DUMP_AS_PROTO}``.

  When XLA dumped several modules (a backend may compile helper programs), the one named
  ``module_name`` is taken, or else the largest, as :func:`jaxmem.hlo.dump.read_dump` does.
  """
  names = sorted(n for n in os.listdir(directory) if n.endswith(_OPTIMIZED_SUFFIX))
  if not names:
    raise DumpFormatError(
        f"XLA wrote no *{_OPTIMIZED_SUFFIX} under {directory}; compile with "
        f"{{'xla_dump_to': DIR, 'xla_dump_hlo_as_proto': True}}"
    )
  found: list[tuple[int, OptimizedHlo]] = []
  for n in names:
    with open(os.path.join(directory, n), "rb") as f:
      data = f.read()
    proto = _parse_hlo(data, n)
    if not proto.buffer_assignment:
      continue
    hlo = OptimizedHlo(hlo_proto=data, module_name=proto.hlo_module.name, program_id=proto.hlo_module.id, file=n)
    if module_name is None or hlo.module_name == module_name:
      found.append((len(data), hlo))
  if not found:
    which = f" for module {module_name!r}" if module_name else ""
    raise DumpFormatError(f"no {_OPTIMIZED_SUFFIX} under {directory} holds a buffer assignment{which}")
  return max(found, key=lambda t: t[0])[1]


# ----------------------------------------------------------------------------- writing the logdir


def _check_name(what: str, name: str) -> None:
  if not name or name in (".", "..") or "/" in name or os.sep in name:
    raise JaxmemError(f"the XProf {what} name must be one path component (got {name!r}); pick a plain name")


def metadata_xspace(hlo_proto: bytes, module_name: str, *, host: str = "jaxmem"):
  """The ``XSpace`` a profiling session would record for this module: one ``/host:metadata``
  plane whose event metadata carries the ``HloProto`` (xla/backends/profiler/cpu/
  metadata_utils.h, ``MetadataXPlaneBuilder::AddHloProto``, does the same)."""
  m = _messages()
  proto = _parse_hlo(hlo_proto, "hlo_proto")
  if not proto.buffer_assignment:
    raise JaxmemError(
        "this HloProto has no buffer assignment, so XProf's Memory Viewer cannot show it; pass the "
        f"*{_OPTIMIZED_SUFFIX} file (read_optimized_hlo)"
    )
  if proto.hlo_module.name != module_name:
    raise JaxmemError(
        f"module_name {module_name!r} is not the HloProto's module {proto.hlo_module.name!r}; "
        "XProf lists it under the proto's name, so pass that"
    )
  program_id = proto.hlo_module.id
  space = m.XSpace(hostnames=[host])
  plane = space.planes.add(id=0, name=METADATA_PLANE)
  hlo_stat, pid_stat = 1, 2
  plane.stat_metadata[hlo_stat].CopyFrom(m.XStatMetadata(id=hlo_stat, name=HLO_PROTO_STAT))
  plane.stat_metadata[pid_stat].CopyFrom(m.XStatMetadata(id=pid_stat, name=PROGRAM_ID_STAT))
  name = xprof_module_name(module_name, program_id)
  event = m.XEventMetadata(id=1, name=name, display_name=name)
  event.stats.add(metadata_id=hlo_stat, bytes_value=hlo_proto)
  event.stats.add(metadata_id=pid_stat, uint64_value=program_id)
  plane.event_metadata[1].CopyFrom(event)
  return space


def write_logdir(
    hlo_proto: bytes, module_name: str, logdir: str, *, run: str | None = None, host: str = "jaxmem",
) -> str:
  """Writes ``LOGDIR/plugins/profile/<run>/<host>.xplane.pb`` for one optimized module and
  returns its path; ``xprof --logdir LOGDIR`` then lists Memory Viewer and Graph Viewer for the
  run. ``run`` defaults to the time, as a profiling session names its runs.

  A run holds one compile: XProf caches what it extracts from a run's files in the run's
  directory, and names a module ``jit_f(<id>)`` across all of the run's hosts, so a second
  compile written into an existing run could be shown as the first. An existing ``run`` is
  therefore an error.
  """
  _check_name("host", host)
  if run is not None:
    _check_name("run", run)
  data = metadata_xspace(hlo_proto, module_name, host=host).SerializeToString()
  base = os.path.join(logdir, "plugins", "profile")
  os.makedirs(base, exist_ok=True)
  if run is None:
    stem = time.strftime("%Y_%m_%d_%H_%M_%S")
    run, n = stem, 1
    while os.path.exists(os.path.join(base, run)):
      run, n = f"{stem}_{n}", n + 1
  run_dir = os.path.join(base, run)
  try:
    os.mkdir(run_dir)
  except FileExistsError:
    raise JaxmemError(f"run {run!r} already exists under {base}; name another run or remove it") from None
  path = os.path.join(run_dir, f"{host}.xplane.pb")
  # A server watching the logdir must never read a half-written file: write, then rename.
  tmp = os.path.join(run_dir, f".{host}.xplane.pb.tmp")
  with open(tmp, "wb") as f:
    f.write(data)
  os.replace(tmp, path)
  return path


# ----------------------------------------------------------------------------- opening it


def xprof_available() -> tuple[bool, str]:
  """(True, "") when the ``xprof`` package (the viewer that opens the logdir) is importable;
  else (False, why). (A server for checks lives in tests/xprof_server.py.)"""
  import importlib.util

  if importlib.util.find_spec("xprof") is None:
    return False, f"the xprof package is not installed ({_INSTALL})"
  return True, ""
