"""Test set-up: CPU only, with 8 simulated devices so meshes can be tried without hardware.

JAX_PLATFORMS=cpu keeps JAX from initialising the TPU and CUDA plugins as backends (there is
no such hardware in CI); their compilers stay usable for compile-only targets.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAXMEM_NO_PROGRESS", "1")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import tempfile  # noqa: E402

# Each test session gets its own row cache, so no test is answered from an earlier run's rows.
os.environ.setdefault("JAXMEM_CACHE_DIR", tempfile.mkdtemp(prefix="jaxmem-test-cache-"))
