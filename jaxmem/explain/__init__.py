"""What fills the memory: ``analyse`` (consumers, the live set at the peak, the timeline's data),
``residuals`` (what each remat policy saves, from JAX's listing) and ``timeline`` (plot and text).

``jaxmem.explain`` is both this package and the entry point: calling it calls
:func:`jaxmem.explain.analyse.explain`. A plain function re-exported as ``jaxmem.explain`` would
shadow the package, and then ``import jaxmem.explain.timeline as t`` and dotted-path patching
(``monkeypatch.setattr("jaxmem.explain.analyse.X", ...)``) fail; a callable module keeps both.
"""

import sys
import types

from jaxmem.explain.analyse import Explanation, explain

__all__ = ["Explanation", "explain"]


class _CallableModule(types.ModuleType):
  def __call__(self, *args, **kwargs) -> Explanation:
    return explain(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
