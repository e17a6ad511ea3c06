"""Inference memory from the compiler: prefill and decode steps with a KV cache, per weight format.

The names ``jaxmem.infer`` and the CLI use, gathered from the modules that hold each concept:

- :mod:`jaxmem.inference.workload`: :class:`InferWorkload`, :class:`InferPlan`, :func:`plan_infer`
- :mod:`jaxmem.inference.program`: the prefill and decode programs (:func:`build_infer_program`,
  :func:`abstract_cache`)
- :mod:`jaxmem.inference.run`: :class:`InferRow`, :func:`run_infer_config`, :func:`infer`
- :mod:`jaxmem.inference.kv`: the KV cache from its formula (:func:`kv_cache_table`)
- :mod:`jaxmem.inference.versus`: :func:`training_vs_inference`

>>> rows = infer(model="tiny", weights="bf16,int8", context=[64, 128], prompt=32)  # doctest: +SKIP
"""

from __future__ import annotations

from jaxmem.inference.kv import attention_kind, kv_cache_table
from jaxmem.inference.program import InferProgram, abstract_cache, build_infer_program
from jaxmem.inference.run import InferRow, infer, run_infer_config
from jaxmem.inference.versus import Side, training_vs_inference
from jaxmem.inference.workload import DEFAULT_CONTEXT, DEFAULT_PROMPT, PHASES, InferPlan, InferWorkload, plan_infer

__all__ = [
    "DEFAULT_CONTEXT", "DEFAULT_PROMPT", "PHASES", "InferPlan", "InferProgram", "InferRow", "InferWorkload", "Side",
    "abstract_cache", "attention_kind", "build_infer_program", "infer", "kv_cache_table", "plan_infer",
    "run_infer_config", "training_vs_inference",
]
