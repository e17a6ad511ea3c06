"""``xprof`` serving a logdir on a free loopback port, for the tests and benchmarks that check
what XProf's Memory Viewer shows for a compile that never ran (tests/test_xprof.py,
benchmarks/xprof_check.py). Not part of the library: jaxmem writes the logdir
(:func:`jaxmem.buffers.xprof.write_logdir`), and users open it with ``xprof --logdir DIR``.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

from jaxmem.buffers.xprof import xprof_available
from jaxmem.errors import JaxmemError

# Runs xprof's own server (xprof.server.start_server, what `xprof --logdir DIR --port P` calls) on
# the loopback interface. Unpatched, xprof binds its web server to the wildcard address and starts
# a gRPC worker on 0.0.0.0 for distributed processing, which the Memory Viewer does not use
# (checked with xprof 2.24.2); where these internals have moved, it runs unpatched on the free
# ports it is given.
_LAUNCHER = """
import sys
import xprof.server as s
logdir, port, grpc_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if hasattr(s, "_get_wildcard_address"):
  s._get_wildcard_address = lambda port: "127.0.0.1"
plugin = getattr(s, "_pywrap_profiler_plugin", None)
if plugin is not None and hasattr(plugin, "start_grpc_server"):
  plugin.start_grpc_server = lambda port, n: None
s.start_server(logdir=logdir, port=port, grpc_port=grpc_port, worker_service_address=f"127.0.0.1:{grpc_port}")
"""


def _free_port() -> int:
  import socket

  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class XprofServer:
  """``xprof`` serving ``logdir`` on a free loopback port, for checks and benchmarks.

  >>> with XprofServer(logdir) as server:                       # doctest: +SKIP
  ...   peak = server.memory_viewer(run, "jaxmem", "jit_step(1)")["peakHeapMib"]
  """

  def __init__(self, logdir: str, *, timeout: float = 60.0):
    ok, why = xprof_available()
    if not ok:
      raise JaxmemError(why)
    self.logdir, self.timeout = os.path.abspath(logdir), timeout
    self.port, self.process, self.log = 0, None, None

  @property
  def url(self) -> str:
    return f"http://127.0.0.1:{self.port}"

  def start(self) -> XprofServer:
    import subprocess
    import sys

    self.port, grpc_port = _free_port(), _free_port()
    while grpc_port == self.port:
      grpc_port = _free_port()
    # The server's own log, kept when it fails to start (the error names it), else removed.
    fd, self.log = tempfile.mkstemp(prefix="jaxmem-xprof-", suffix=".log")
    with os.fdopen(fd, "wb") as out:
      self.process = subprocess.Popen(
          [sys.executable, "-c", _LAUNCHER, self.logdir, str(self.port), str(grpc_port)],
          stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
      )
    deadline = time.monotonic() + self.timeout
    while True:
      try:
        self.get("/data/plugin/profile/runs")
        return self
      except OSError:
        if self.process.poll() is not None or time.monotonic() > deadline:
          log, self.log = self.log, None  # kept for the message
          self.stop()
          raise RuntimeError(f"xprof did not start serving {self.logdir}; its log is {log}") from None
        time.sleep(0.2)

  def stop(self) -> None:
    import subprocess

    if self.process is not None and self.process.poll() is None:
      self.process.terminate()
      try:
        self.process.wait(timeout=10)
      except subprocess.TimeoutExpired:
        self.process.kill()
        self.process.wait()
    self.process = None
    if self.log is not None:
      os.remove(self.log)
      self.log = None

  def __enter__(self) -> XprofServer:
    return self.start()

  def __exit__(self, *exc) -> None:
    self.stop()

  def fetch(self, path: str, **params: Any) -> bytes:
    """GETs ``path`` with query ``params``, gunzipped; OSError when the server cannot be reached
    or answers with an error status."""
    import gzip
    import urllib.parse
    import urllib.request

    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    request = urllib.request.Request(f"{self.url}{path}{query}", headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(request, timeout=self.timeout) as r:
      body = r.read()
      return gzip.decompress(body) if r.headers.get("Content-Encoding") == "gzip" else body

  def get(self, path: str, **params: Any) -> Any:
    """:meth:`fetch`, decoded as JSON."""
    import json

    return json.loads(self.fetch(path, **params))

  def memory_viewer(self, run: str, host: str, module: str, *, memory_space: int = 0) -> dict:
    """The Memory Viewer's data for ``module`` (``jit_f(1)``), as the page asks for it.

    XProf extracts the module's HloProto from the ``.xplane.pb`` when a run's tools or modules
    are listed, and its data endpoint answers 404 before that; the page lists them first, and
    so does this.
    """
    prefix = "/data/plugin/profile"
    tools = self.get(f"{prefix}/run_tools", run=run)
    if "memory_viewer" not in tools:
      raise RuntimeError(f"xprof lists no memory_viewer for run {run!r} (tools: {tools})")
    # A comma-separated list, not JSON.
    modules = self.fetch(f"{prefix}/module_list", run=run, tag="memory_viewer", host=host).decode().split(",")
    if module not in modules:
      raise RuntimeError(f"xprof lists no module {module!r} for run {run!r} (modules: {modules})")
    return self.get(f"{prefix}/data", run=run, tag="memory_viewer", host=host, module_name=module, memory_space=memory_space)
