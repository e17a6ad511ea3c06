"""A compiled step's time per device on a target: one model, read in one walk of the program's ops.

- :mod:`~jaxmem.steptime.walk`: the compiled schedule walked op by op on the target's machine
  (:class:`jaxmem.hardware.machine.Machine`, which its kind gives), collectives on the links
  they cross, asynchronous ones overlapping the work between their start and done.
- :mod:`~jaxmem.steptime.kernels`: the grouped matmul kernels (megablox) timed as their tiles
  do the work; :mod:`~jaxmem.steptime.moe`: a mixture-of-experts step's time by named term.
- :mod:`~jaxmem.steptime.roofline`: the bound, every resource at its datasheet peak.
- :mod:`~jaxmem.steptime.ops`: the time per op, read off the same walk.
- :mod:`~jaxmem.steptime.model`: the three as one :class:`Estimate` (:func:`step_time`), what
  every compiled row carries (:class:`jaxmem.records.StepTime`), and :func:`op_times`.

One vocabulary across them (docs/fields.md): ``step_time_s`` is the simulated step everywhere;
a bound says it is one (``roofline_step_time_s``, ``roofline_compute_time_s``...,
``ops_roofline_step_time_s``); a link's time is named by its link (``ici_comm_time_s``,
``dcn_comm_time_s`` on TPU slices, ``nvlink_comm_time_s``, ``network_comm_time_s`` on GPUs,
``host_comm_time_s`` a TPU's link to host memory), and ``comm_time_s`` without a link is every
link's together.

It reads the HLO (:mod:`jaxmem.hlo`), the hardware catalogue (:mod:`jaxmem.hardware`) and the
compiler's report (:mod:`jaxmem.compiler.report`); the compile step
(:func:`jaxmem.compiler.figures.compile_figures`) calls it.
"""

from jaxmem.steptime.kernels import GroupedMatmul
from jaxmem.steptime.model import Estimate, estimate, op_times, step_time, timeline
from jaxmem.steptime.moe import MoeTerms
from jaxmem.steptime.ops import OpTime, OpTimes
from jaxmem.steptime.roofline import Work
from jaxmem.steptime.walk import TERMS

__all__ = ["TERMS", "Estimate", "GroupedMatmul", "MoeTerms", "OpTime", "OpTimes", "Work", "estimate", "op_times",
           "step_time", "timeline"]
