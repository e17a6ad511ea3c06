"""explain: consumers, live set at the peak, timeline, residuals (tiny model; real compilers)."""

import json

import pytest

from jaxmem.explain.analyse import CONSUMERS, explain
from jaxmem.render.explain import (
  JSON_BUFFER_KEYS,
  explain_json,
  render_explain,
  residuals_table,
)
from jaxmem.explain.residuals import saved_residuals_by_policy
from jaxmem.explain.timeline import plot_timeline, timeline_text


# Each configuration compiles once per module; its tests share the Explanation.
@pytest.fixture(scope="module")
def cpu_none():
  # dot attention: its softmax is the residual these tests follow through the layer scan.
  return explain(model="tiny", remat="none", target="cpu:4", mesh="fsdp=4", batch=8, seq=64, top=5, attention="dot")


def _close(r):
  assert r.peak_bytes and r.live_bytes_at_peak
  assert abs(r.live_bytes_at_peak - r.peak_bytes) <= 0.05 * r.peak_bytes, (r.live_bytes_at_peak, r.peak_bytes, r.notes)


def test_consumers_sum_to_compiler_total(cpu_none):
  r = cpu_none
  assert set(r.consumers) == set(CONSUMERS)
  rep = r.report
  total = rep.argument_size_in_bytes + rep.output_size_in_bytes - rep.alias_size_in_bytes + rep.temp_size_in_bytes
  assert sum(r.consumers.values()) == total + rep.generated_code_size_in_bytes == r.compiler_bytes
  assert r.consumers["activations"] > 0 and r.consumers["params"] > 0


def test_cpu_live_at_peak_matches(cpu_none):
  r = cpu_none
  _close(r)
  # XLA:CPU reports no peak: the figure is the memory its buffer assignment allocates (argument +
  # output - alias + temp), said in the notes.
  assert r.peak_source == "compiler allocation" and r.peak_bytes == r.report.total_bytes
  assert any("XLA:CPU" in n for n in r.notes)
  assert sum(r.by_kind.values()) == r.live_bytes_at_peak == sum(r.by_module.values())


def test_largest_buffer_at_no_remat_peak_is_model_code(cpu_none):
  b = cpu_none.peak_buffers[0]
  assert b.size_bytes == max(x.size_bytes for x in cpu_none.peak_buffers)
  assert b.op_name and b.source and "models/" in b.source and ":" in b.source
  assert b.kind == "saved residual"


_LAYER_CODE = ("models/attention.py", "models/attention_ops.py", "models/mlp.py", "models/layers.py", "models/rope.py")
# Attention's buffers: the module's own (projections) and those of the AttendFn it calls
# (models/attention_ops.py; XLA keeps too few frames of a scanned layer to see the module there).
_ATTENTION = ("Attention", "dot_attend")


def _attributed_inside_the_layer(r):
  """The scan's residuals name the op in the layer that made them, not the scan."""
  saved = [b for b in r.peak_buffers if b.kind == "saved residual"]
  assert saved, r.peak_buffers
  b = saved[0]
  assert b.via_loop and b.producer, b
  assert not b.op_name.endswith("/while") and "/while/body/" in b.op_name, b
  assert b.source and b.source.startswith(_LAYER_CODE), b
  assert b.module not in ("Transformer", "train_step", "(compiler)"), b
  # The layers' residuals land on the layers' modules, not on the scan that runs them.
  assert max(r.by_module, key=r.by_module.get) not in ("Transformer", "inputs"), r.by_module
  assert r.by_module.get("Transformer", 0) < sum(r.by_module.get(m, 0) for m in _ATTENTION), r.by_module


def _residuals_saved_from_the_forward_pass(r):
  """The stacked residuals the forward layer scan writes are saved residuals from the moment
  they are allocated, not temporaries that turn into residuals after the forward loop."""
  attention = [b for b in r.peak_buffers if b.module in _ATTENTION]
  assert attention and attention[0].kind == "saved residual", r.peak_buffers  # the softmax's exp
  first_bwd = next(first for name, first, _ in r.timeline.regions if name == "backward")
  saved = r.timeline.bytes_by_kind["saved residual"][:first_bwd]
  temp = r.timeline.bytes_by_kind["temporary"][:first_bwd]
  assert saved[first_bwd // 2] > 0, saved
  # What the forward pass holds as temporaries is one layer's workspace, not the stack.
  assert max(temp) <= max(saved) // 2, (max(temp), max(saved))


def test_residuals_are_saved_during_the_forward_pass(cpu_none):
  _residuals_saved_from_the_forward_pass(cpu_none)


def test_loop_outputs_attributed_to_the_layer_op(cpu_none):
  _attributed_inside_the_layer(cpu_none)
  text = render_explain(cpu_none, "table")
  assert " <- while" in text and "body" in text


_LOOP_HLO = """HloModule m

%fused_dus (p0: f32[2,4], p1: s32[], p2: f32[4]) -> f32[2,4] {
  %p0 = f32[2,4]{1,0} parameter(0)
  %p2 = f32[4]{0} parameter(2)
  %bc = f32[1,4]{1,0} bitcast(%p2), metadata={op_name="jit(f)/while/body/mul" stack_frame_id=2}
  %p1 = s32[] parameter(1)
  %z = s32[] constant(0), metadata={op_name="jit(f)/while/body/jit(dynamic_index_in_dim)"}
  ROOT %dus = f32[2,4]{1,0} dynamic-update-slice(%p0, %bc, %p1, %z), metadata={op_name="jit(f)/while/body/jit(dynamic_update_index_in_dim)/dynamic_update_slice"}
}

%fused_two (q0: f32[4]) -> (f32[4], f32[4]) {
  %q0 = f32[4]{0} parameter(0)
  %e = f32[4]{0} exponential(%q0), metadata={op_name="jit(f)/while/body/exp" stack_frame_id=2}
  %n = f32[4]{0} negate(%q0), metadata={op_name="jit(f)/while/body/neg" stack_frame_id=2}
  ROOT %t = (f32[4]{0}, f32[4]{0}) tuple(%e, %n)
}

%body (arg: (s32[], f32[4], f32[2,4])) -> (s32[], f32[4], f32[2,4]) {
  %arg = (s32[], f32[4]{0}, f32[2,4]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%arg), index=0
  %x = f32[4]{0} get-tuple-element(%arg), index=1
  %buf = f32[2,4]{1,0} get-tuple-element(%arg), index=2
  %two = (f32[4]{0}, f32[4]{0}) fusion(%x), kind=kLoop, calls=%fused_two, metadata={op_name="jit(f)/while/body/exp"}
  %m = f32[4]{0} get-tuple-element(%two), index=0
  %w = f32[2,4]{1,0} fusion(%buf, %i, %m), kind=kLoop, calls=%fused_dus, metadata={op_name="jit(f)/while/body/jit(dynamic_update_index_in_dim)/dynamic_update_slice"}
  ROOT %out = (s32[], f32[4]{0}, f32[2,4]{1,0}) tuple(%i, %x, %w), metadata={op_name="x" /*index=5*/}
}

%async_slice (s0: f32[2,4], s1: s32[]) -> f32[1,4] {
  %s0 = f32[2,4]{1,0} parameter(0)
  %s1 = s32[] parameter(1)
  %zz = s32[] constant(0)
  ROOT %ds = f32[1,4]{1,0} dynamic-slice(%s0, %s1, %zz), dynamic_slice_sizes={1,4}, metadata={op_name="jit(f)/transpose(jvp())/while/body/jit(dynamic_index_in_dim)/dynamic_slice"}
}

%cond (c: (s32[], f32[4], f32[2,4])) -> pred[] {
  %c = (s32[], f32[4]{0}, f32[2,4]{1,0}) parameter(0)
  ROOT %k = pred[] constant(true)
}

ENTRY %main (a: f32[4], b: f32[2,4]) -> f32[2,4] {
  %a = f32[4]{0} parameter(0)
  %b = f32[2,4]{1,0} parameter(1)
  %zero = s32[] constant(0)
  %init = (s32[], f32[4]{0}, f32[2,4]{1,0}) tuple(%zero, %a, %b)
  %loop = (s32[], f32[4]{0}, f32[2,4]{1,0}) while(%init), condition=%cond, body=%body, metadata={op_name="jit(f)/while" stack_frame_id=1}
  %g = f32[2,4]{1,0} get-tuple-element(%loop), index=2, metadata={op_name="jit(f)/while" stack_frame_id=1}
  %as = ((f32[2,4]{1,0}, s32[]), f32[1,4]{1,0}, u32[]) async-start(%g, %zero), calls=%async_slice
  %ad = f32[1,4]{1,0} async-done(%as)
  ROOT %c2 = f32[2,4]{0,1} copy(%g), metadata={op_name="jit(f)/while" stack_frame_id=1}
}
"""


@pytest.mark.parametrize("printer", ["jaxlib 0.10.2", "jaxlib 0.12.0.1"])
def test_origin_follows_the_loop_body(printer, elide_get_tuple_elements):
  from jaxmem.hlo.dump import parse_hlo

  # jaxlib 0.12.0.1's dumps print no get-tuple-element: %g's readers say %loop#2 instead.
  new = printer == "jaxlib 0.12.0.1"
  text = elide_get_tuple_elements(_LOOP_HLO) if new else _LOOP_HLO
  assert ("get-tuple-element" in text) != new and ("%loop#2" in text) == new
  h = parse_hlo(text)
  g = "loop#2" if new else "g"
  assert h.instructions[g].index == 2 and h.instructions["p2"].index == 2
  for name, index in (("loop", 2), (g, None), ("c2", None), ("ad", None)):
    o = h.origin(name, index)
    assert o is not None and o.loop == "loop", (name, o)
    assert o.instruction.name == "e" and o.instruction.op_name == "jit(f)/while/body/exp"
  assert h.origin("loop", 1) is None  # passed through unchanged: the step's input, no op names it
  assert h.origin("c2").index == 2
  # The carry's one buffer: the initial value, the body's and condition's parameter, the stacked
  # write back to the body's parameter, the loop's output (and the body's read of it, which is
  # an instruction only where the printer shows get-tuple-elements).
  carried = {k for k in h.carried("loop", 2) if "#" not in k}
  assert carried == {"loop{2}", "init{2}", "b{}", "arg{2}", "c{2}", "out{2}", "w{}"} | (set() if new else {"buf{}"})
  assert h.origin("a") is None  # not out of a loop: its own metadata names it


# Compiled only when a test that needs it runs; the needs_*_compiler markers skip the tests (and
# so the compile) where the compiler is missing.
@pytest.fixture(scope="module")
def gpu_none():
  return explain(model="tiny", target="gpu:h100", mesh="fsdp=1", batch=8, seq=64, top=5, attention="dot")


@pytest.fixture(scope="module")
def tpu_none():
  # Large enough that libtpu puts the step's temporaries in HBM (smaller steps live in VMEM,
  # where libtpu's peak counts bytes its dumped buffer assignment does not place: see explain).
  # dot attention, as on CPU: the tests follow its softmax through the layer scan.
  return explain(model="tiny", target="tpu:v5e-4", mesh="fsdp=4", batch=64, seq=512, top=3, attention="dot")


@pytest.mark.needs_gpu_compiler("h100")
def test_gpu_live_at_peak_matches(gpu_none):
  r = gpu_none
  _close(r)
  assert r.peak_source == "compiler"
  assert sum(r.consumers.values()) == r.compiler_bytes


@pytest.mark.needs_gpu_compiler("h100")
def test_gpu_loop_outputs_attributed_to_the_layer_op(gpu_none):
  _attributed_inside_the_layer(gpu_none)


@pytest.mark.needs_gpu_compiler("h100")
def test_gpu_residuals_are_saved_during_the_forward_pass(gpu_none):
  _residuals_saved_from_the_forward_pass(gpu_none)


@pytest.mark.needs_tpu_compiler
def test_tpu_live_at_peak_matches(tpu_none):
  r = tpu_none
  _close(r)
  assert r.peak_source == "compiler"
  assert sum(r.consumers.values()) == r.compiler_bytes


@pytest.mark.needs_tpu_compiler
def test_tpu_loop_outputs_attributed_to_the_layer_op(tpu_none):
  _attributed_inside_the_layer(tpu_none)


@pytest.mark.needs_tpu_compiler
def test_tpu_residuals_are_saved_during_the_forward_pass(tpu_none):
  _residuals_saved_from_the_forward_pass(tpu_none)


def test_plot_png_and_text(cpu_none, tmp_path):
  path = plot_timeline(cpu_none, str(tmp_path / "t.png"))
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  svg = plot_timeline(cpu_none, str(tmp_path / "t.svg"))
  assert "<svg" in open(svg).read(2000)
  text = timeline_text(cpu_none, width=40)
  assert "^" in text and "backward" in text
  assert all(len(line) == len(text.splitlines()[0]) for line in text.splitlines())


def test_json_keys(cpu_none):
  doc = json.loads(json.dumps(explain_json(cpu_none)))
  for k in ("consumers", "peak_bytes", "live_bytes_at_peak", "peak_buffers"):
    assert k in doc
  assert set(doc["peak_buffers"][0]) == set(JSON_BUFFER_KEYS)


def test_cli_explain_registers(tmp_path, capsys):
  from jaxmem import cli

  p = cli.build_parser()  # explain is registered by the CLI itself
  args = p.parse_args(["explain", "--model", "tiny", "--batch", "2", "--seq", "16", "--target", "cpu", "--plot", str(tmp_path / "x.gif")])
  from jaxmem.errors import JaxmemError

  with pytest.raises(JaxmemError):
    args.func(args)


def test_residuals_full_saves_less_than_none():
  rows = saved_residuals_by_policy(model="tiny", remat="none,everything_saveable,full", batch=2, seq=16)
  by = {r.remat: r for r in rows}
  assert by["full"].per_layer_bytes < by["none"].per_layer_bytes
  assert by["full"].per_layer_bytes < by["everything_saveable"].per_layer_bytes
  assert [r.name for r in by["full"].residuals] == ["x_btd"]  # only the layer's input
  assert by["none"].total_bytes == by["none"].per_layer_bytes * by["none"].num_layers
  table = residuals_table(rows, "table")
  assert "full" in table and "x_btd" in table
  assert json.loads(residuals_table(rows, "json"))["policies"][0]["remat"] == "none"
