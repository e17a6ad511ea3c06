"""The compiler a row names is the one that compiled it, with a real second libtpu (slow).

The check of issue 43, as a new user would run it: libtpu 0.0.50.1 installed beside jax, and
libtpu 0.0.52's wheel fetched (once, into jaxmem's cache: ``jaxmem.compilers``). The same
``compare`` (the tiny model on ``tpu:v5e-4``, batch 8, seq 256, remat full), each in its own
process, with one private row cache:

1. with the installed libtpu: rows name it;
2. with ``TPU_LIBRARY_PATH`` at 0.0.52's ``libtpu.so`` (as container images set it): rows name
   0.0.52, are compiled (not served from step 1's cache) and their temp differs;
3. with the installed one again: step 1's rows, from the cache, naming it;
4. ``--compiler libtpu==0.0.50.1,libtpu==0.0.52``: one row per release, each naming its own, the
   same figures as steps 1 and 2.

    python benchmarks/compiler_versions.py          # prints each step's rows; exit 1 on a mismatch

It downloads the 0.0.52 wheel (137 MB) the first time and compiles eight small programs (about
two minutes on two loaded cores). The test suite checks the same with fakes
(tests/test_compilers.py); ``tests/test_compilers.py::test_a_real_second_libtpu`` (slow) runs this.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ARGS = ["compare", "--model", "tiny", "--target", "tpu:v5e-4", "--batch", "8", "--seq", "256", "--remat", "full",
        "--format", "json"]
OTHER = "0.0.52"


def compare(cache: str, *extra: str, libtpu: str | None = None) -> list[dict]:
  """compare's rows from a fresh process with the row cache ``cache`` (and TPU_LIBRARY_PATH)."""
  env = {**os.environ, "JAXMEM_CACHE_DIR": cache, "JAX_PLATFORMS": "cpu"}
  env.pop("TPU_LIBRARY_PATH", None)
  if libtpu:
    env["TPU_LIBRARY_PATH"] = libtpu
  done = subprocess.run([sys.executable, "-m", "jaxmem", *ARGS, *extra], capture_output=True, text=True, env=env,
                        timeout=1800)
  if done.returncode != 0:
    raise SystemExit(f"compare failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
  return json.loads(done.stdout)["rows"]


def line(r: dict) -> str:
  return (f"  {r['remat']:5} compiler {r.get('compiler') or '-':17} libtpu {r['versions'].get('libtpu')!s:9} "
          f"temp {r['temp_size_in_bytes']:>10,} B  cached {r['cached']}")


def main() -> int:
  from jaxmem import compilers, versions

  installed = versions.installed_version("libtpu")
  other = compilers.environment(f"libtpu=={OTHER}")  # fetched into jaxmem's cache once
  so = dict(other.variables)["TPU_LIBRARY_PATH"]
  failures = []
  with tempfile.TemporaryDirectory(prefix="jaxmem-compiler-versions-") as tmp:
    cache = os.path.join(tmp, "cache")
    os.makedirs(cache)
    os.symlink(compilers.compilers_dir(), Path(cache) / "compilers")  # the fetched wheels, not the rows
    steps = {
        "1 installed": compare(cache),
        f"2 TPU_LIBRARY_PATH at {OTHER}": compare(cache, libtpu=so),
        "3 installed again": compare(cache),
        "4 --compiler": compare(cache, "--compiler", f"libtpu=={installed},libtpu=={OTHER}"),
    }
    for name, rows in steps.items():
      print(name)
      for r in rows:
        print(line(r))
    one, two, three, four = steps.values()

    def check(ok: bool, what: str) -> None:
      if not ok:
        failures.append(what)

    check(all(r["versions"]["libtpu"] == installed for r in one + three), "installed rows name the installed libtpu")
    check(all(r["versions"]["libtpu"] == OTHER and not r["cached"] for r in two),
          f"rows under TPU_LIBRARY_PATH name {OTHER} and are compiled, not served from the installed one's cache")
    check(all(r["cached"] for r in three), "the installed one's rows come back from the cache")
    check([r["temp_size_in_bytes"] for r in one] != [r["temp_size_in_bytes"] for r in two], "the two releases' temp differs")
    by_release = {(r["compiler"], r["remat"]): r for r in four}
    for rows, release in ((one, installed), (two, OTHER)):
      for r in rows:
        got = by_release.get((f"libtpu=={release}", r["remat"]))
        check(got is not None and got["versions"]["libtpu"] == release
              and got["temp_size_in_bytes"] == r["temp_size_in_bytes"],
              f"--compiler's libtpu=={release} row {r['remat']} names {release} with the same temp")
  for f in failures:
    print(f"MISMATCH: {f}")
  print("ok" if not failures else f"{len(failures)} mismatch(es)")
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())
