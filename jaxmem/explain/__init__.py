"""What fills the memory: ``analyse`` (consumers, the live set at the peak, the timeline's data),
``residuals`` (what each remat policy saves, from JAX's listing) and ``timeline`` (plot and text)."""

from jaxmem.explain.analyse import Explanation, explain

__all__ = ["Explanation", "explain"]
