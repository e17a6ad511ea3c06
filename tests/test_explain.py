"""explain: consumers, live set at the peak, timeline, residuals (tiny model; real compilers)."""

import json

import pytest

from jaxmem.buffers.explain import CONSUMERS, explain
from jaxmem.render.explain import (
  JSON_BUFFER_KEYS,
  explain_json,
  render_explain,
  residuals_table,
)
from jaxmem.buffers.residuals import saved_residuals_by_policy
from jaxmem.render.timeline import plot_timeline, timeline_text


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
  assert sum(r.consumers.values()) == total + rep.generated_code_size_in_bytes == r.footprint_bytes
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
# (models/attention_ops.py::dot_attend, a plain function: attributed to the class that calls it).
_ATTENTION = ("Attention",)


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
  assert max(r.by_module, key=r.by_module.get) not in ("Transformer", "params"), r.by_module
  assert r.by_module.get("Transformer", 0) < sum(r.by_module.get(m, 0) for m in _ATTENTION), r.by_module
  # The attention math lives in a plain function (dot_attend); its buffers are Attention's.
  assert "dot_attend" not in r.by_module, r.by_module


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
  text = render_explain(cpu_none, "table", columns=frozenset({"all"}))
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
  from jaxmem.hlo.text import parse_module
  from jaxmem.hlo.values import carried, origin

  # jaxlib 0.12.0.1's dumps print no get-tuple-element: %g's readers say %loop#2 instead.
  new = printer == "jaxlib 0.12.0.1"
  text = elide_get_tuple_elements(_LOOP_HLO) if new else _LOOP_HLO
  assert ("get-tuple-element" in text) != new and ("%loop#2" in text) == new
  h = parse_module(text)
  g = "loop#2" if new else "g"
  assert h.instructions[g].index == 2 and h.instructions["p2"].index == 2
  for name, index in (("loop", 2), (g, None), ("c2", None), ("ad", None)):
    o = origin(h, name, index)
    assert o is not None and o.loop == "loop", (name, o)
    assert o.instruction.name == "e" and o.instruction.op_name == "jit(f)/while/body/exp"
  assert origin(h, "loop", 1) is None  # passed through unchanged: the step's input, no op names it
  assert origin(h, "c2").index == 2
  # The carry's one buffer: the initial value, the body's and condition's parameter, the stacked
  # write back to the body's parameter, the loop's output (and the body's read of it, which is
  # an instruction only where the printer shows get-tuple-elements).
  held = {k for k in carried(h, "loop", 2) if "#" not in k}
  assert held == {"loop{2}", "init{2}", "b{}", "arg{2}", "c{2}", "out{2}", "w{}"} | (set() if new else {"buf{}"})
  assert origin(h, "a") is None  # not out of a loop: its own metadata names it


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


@pytest.mark.slow  # the GPU program's compile with XLA's dump; the TPU and CPU cases check the same reading
@pytest.mark.needs_gpu_compiler("h100")
def test_gpu_live_at_peak_matches(gpu_none):
  r = gpu_none
  _close(r)
  assert r.peak_source == "compiler"
  assert sum(r.consumers.values()) == r.footprint_bytes


@pytest.mark.slow  # shares the GPU compile above
@pytest.mark.needs_gpu_compiler("h100")
def test_gpu_loop_outputs_attributed_to_the_layer_op(gpu_none):
  _attributed_inside_the_layer(gpu_none)


@pytest.mark.slow  # shares the GPU compile above
@pytest.mark.needs_gpu_compiler("h100")
def test_gpu_residuals_are_saved_during_the_forward_pass(gpu_none):
  _residuals_saved_from_the_forward_pass(gpu_none)


# Slow: a TPU compile at batch 64 (its temporaries must live in HBM for the dump to place them).
# The same readings are held on the host CPU's program above in the fast suite.
@pytest.mark.slow
@pytest.mark.needs_tpu_compiler
def test_tpu_live_at_peak_matches(tpu_none):
  r = tpu_none
  _close(r)
  assert r.peak_source == "compiler"
  assert sum(r.consumers.values()) == r.footprint_bytes


@pytest.mark.slow  # shares the TPU compile above
@pytest.mark.needs_tpu_compiler
def test_tpu_loop_outputs_attributed_to_the_layer_op(tpu_none):
  _attributed_inside_the_layer(tpu_none)


@pytest.mark.slow  # shares the TPU compile above
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


# ----------------------------------------------------------------------------- any function


# A user's model in a library of their own, installed the way pip installs one (under
# site-packages): explain must name its file and lines, not skip them as library code.
_USER_MODEL = '''
import jax
import jax.numpy as jnp
import optax


class SelfAttention:
  def __call__(self, p, x_btd):
    q_btd, k_btd = x_btd @ p["wq"], x_btd @ p["wk"]
    s_bts = jnp.einsum("btd,bsd->bts", q_btd, k_btd)  # <- scores
    a_bts = jax.nn.softmax(s_bts, axis=-1)  # <- softmax
    return jnp.einsum("bts,bsd->btd", a_bts, x_btd @ p["wv"])


def feed_forward(x_btd, w_df):
  with jax.named_scope("encoder/3/mlp"):  # a plain function: its scope names it
    return jax.nn.gelu(x_btd @ w_df)  # <- gelu


def loss(params, batch):
  y_btd = SelfAttention()(params, batch["x"])
  return jnp.mean(feed_forward(y_btd, params["w_ff"]) ** 2)


tx = optax.adam(1e-3)


def step(params, opt_state, batch):
  grads = jax.grad(loss)(params, batch)
  updates, opt_state = tx.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state
'''


@pytest.fixture(scope="module")
def usermodel(tmp_path_factory):
  import importlib
  import sys

  root = tmp_path_factory.mktemp("venv") / "lib" / "python3" / "site-packages"
  (root / "usermodel").mkdir(parents=True)
  (root / "usermodel" / "__init__.py").write_text("")
  (root / "usermodel" / "model.py").write_text(_USER_MODEL)
  sys.path.insert(0, str(root))
  try:
    module = importlib.import_module("usermodel.model")
  finally:
    sys.path.remove(str(root))
  yield module
  for name in [n for n in sys.modules if n == "usermodel" or n.startswith("usermodel.")]:
    del sys.modules[name]


def _line(marker: str) -> int:
  return next(i for i, text in enumerate(_USER_MODEL.splitlines(), start=1) if f"# <- {marker}" in text)


def _user_step_args(module):
  import jax
  import jax.numpy as jnp

  f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)  # noqa: E731
  params = {"wq": f32(64, 64), "wk": f32(64, 64), "wv": f32(64, 64), "w_ff": f32(64, 256)}
  return params, jax.eval_shape(module.tx.init, params), {"x": f32(8, 512, 64)}


@pytest.fixture(scope="module", params=["cpu", pytest.param("gpu:h100", marks=pytest.mark.needs_gpu_compiler("h100"))])
def user_step(request, usermodel):
  import jaxmem

  return jaxmem.explain(usermodel.step, *_user_step_args(usermodel), target=request.param, top=5)


def test_user_step_names_the_users_file_and_line(user_step):
  r = user_step
  b = r.peak_buffers[0]
  # The largest buffers at the peak are the attention's [8, 512, 512] scores and probabilities.
  assert b.kind == "saved residual" and b.shape == "[8,512,512]", r.peak_buffers
  assert b.source in {f"usermodel/model.py:{_line(m)}" for m in ("scores", "softmax")}, b
  assert b.module == "SelfAttention", b
  assert sum(r.consumers.values()) == r.footprint_bytes
  assert r.function == "step" and not r.model


def test_user_step_consumers_split_the_arguments_by_pytree_path(user_step):
  r = user_step
  assert set(r.arguments) == {"params", "opt_state.mu", "opt_state.nu", "opt_state.count", "batch"}
  params_bytes = 4 * (3 * 64 * 64 + 64 * 256)
  assert r.arguments["params"] == r.arguments["opt_state.mu"] == r.arguments["opt_state.nu"] == params_bytes
  assert r.arguments["batch"] == 4 * 8 * 512 * 64
  assert sum(r.arguments.values()) == r.report.argument_size_in_bytes
  assert set(r.consumers) == set(r.arguments) | {"output", "saved residual", "gradient", "temporary", "generated_code"}
  # Not donated, so the new parameters and state are outputs of their own.
  assert r.consumers["output"] >= 3 * params_bytes
  assert r.consumers["saved residual"] > 0


def test_user_step_modules_by_class(user_step):
  r = user_step
  # The plain function loss calls SelfAttention: the attention's buffers are the class's.
  assert max(r.by_module, key=r.by_module.get) == "SelfAttention", r.by_module
  inputs = {m for m in r.by_module if m in r.arguments}
  assert inputs and sum(r.by_module[m] for m in inputs) <= sum(r.arguments.values())


def test_a_plain_function_is_named_by_its_scope(usermodel):
  """feed_forward is no method; its jax.named_scope names it, the layer number as *."""
  import jax
  import jax.numpy as jnp

  import jaxmem

  w, x = jax.ShapeDtypeStruct((64, 1024), jnp.float32), jax.ShapeDtypeStruct((4096, 64), jnp.float32)
  r = jaxmem.explain(jax.grad(lambda w, x: usermodel.feed_forward(x, w).sum()), w, x, target="cpu", top=3)
  b = r.peak_buffers[0]
  assert b.shape == "[4096,1024]" and b.module == "encoder/*/mlp", r.peak_buffers
  assert b.source == f"usermodel/model.py:{_line('gelu')}" and "encoder/3/mlp" in b.op_name


def test_stack_frames_are_read_outwards_from_the_op(tmp_path):
  """XLA prints each frame's parent one above its id; read as written, the stack of an op
  stopped after its innermost frame. Here h <- g <- f, from a module of this test."""
  import jax
  import jax.numpy as jnp

  from jaxmem.buffers.explain import compile_with_dump
  from jaxmem.compiler.analysis import lower_for_target

  def h(x):
    return jnp.exp(x)

  def g(x):
    return h(x) * 2

  def f(x):
    return g(x).sum()

  _, dump, _ = compile_with_dump(lower_for_target(f, jax.ShapeDtypeStruct((8,), jnp.float32)))
  (exp,) = [i for i in dump.hlo.instructions.values() if i.op_name.endswith("/exp") and i.frame]
  functions = [fn.rsplit(".", 1)[-1] for _, fn, _ in dump.hlo.stack(exp.frame)]
  assert functions[:3] == ["h", "g", "f"], functions
  assert all(file == __file__ for file, _, _ in dump.hlo.stack(exp.frame)[:3])


def test_attribution_rules():
  import os
  import sysconfig

  import flax
  import jax
  import optax

  from jaxmem.buffers import sources

  assert sources.class_of("Attention.__call__") == "Attention"
  assert sources.class_of("Transformer.hidden.<locals>.body") == "Transformer"
  assert sources.class_of("make.<locals>.Block.__call__") == "Block"
  assert sources.class_of("build.<locals>.loss_fn") is None and sources.class_of("<module>") is None
  assert sources.function_of("step.<locals>.loss") == "loss" and sources.function_of("<module>") is None
  assert sources.scope_of("jit(step)/jvp(M)/transformer/h/3/attn/dot_general") == "M/transformer/h/*/attn"
  assert sources.scope_of("jit(step)/transpose(jvp(encoder/3/mlp))/add_any") == "encoder/*/mlp"
  assert sources.scope_of("jit(step)/jvp(btd,bsd->bts)/dot_general") is None
  assert sources.scope_of("jit(train_step)/jvp()/while/body/closed_call/jit(silu)/mul") is None
  assert sources.scope_of("jit(f)/transpose(jvp())/while/body/closed_call/checkpoint/rematted_computation/exp") is None
  assert sources.scope_of("jit(f)/jvp()/while/body/eval_jaxpr/btd,df->btf/dot_general") is None
  for package in (jax, flax, optax):
    assert sources.is_library(os.path.join(os.path.dirname(package.__file__), "x.py"))
  assert sources.is_library(os.path.join(sysconfig.get_paths()["stdlib"], "functools.py"))
  assert not sources.is_library(os.path.join(sysconfig.get_paths()["purelib"], "transformers", "models", "gpt2.py"))
  assert not sources.is_library("/home/me/project/model.py")


@pytest.mark.parametrize("op_name,group", [
    ("params['layers']['w'].value", "params"),
    ("opt_state[0].mu['w']", "opt_state.mu"),
    ("opt_state[0].count", "opt_state.count"),
    ("model.layers[0].attn.w", "model.layers"),
    ("tokens_bt", "tokens_bt"),
    ("", "argument 3"),
])
def test_argument_groups(op_name, group):
  from jaxmem.buffers.analyse import argument_group

  assert argument_group(op_name, 3) == group


def test_a_jitted_function_keeps_its_donation():
  import jax
  import jax.numpy as jnp

  import jaxmem

  def update(w, x):
    return w - 0.1 * jnp.tanh(x @ w).mean()

  w, x = jax.ShapeDtypeStruct((256, 256), jnp.float32), jax.ShapeDtypeStruct((32, 256), jnp.float32)
  plain = jaxmem.explain(update, w, x, target="cpu")
  donated = jaxmem.explain(jax.jit(update, donate_argnums=0), w, x, target="cpu")
  assert plain.report.alias_size_in_bytes == 0 < donated.report.alias_size_in_bytes
  assert donated.consumers["output"] < plain.consumers["output"]
  assert plain.function == donated.function == "test_a_jitted_function_keeps_its_donation.<locals>.update"


def test_bad_first_argument_is_a_one_line_error():
  import jaxmem
  from jaxmem.errors import JaxmemError

  with pytest.raises(JaxmemError, match="model='gpt2-small'") as e:
    jaxmem.explain("gpt2-small")
  assert "\n" not in str(e.value)
  with pytest.raises(JaxmemError, match="`top` must be at least 1"):
    jaxmem.explain(lambda a: a, 1.0, top=0)


def test_docstring_example_runs():
  import doctest

  from jaxmem.buffers import explain as module

  (test,) = doctest.DocTestFinder().find(module.explain, "explain", globs={})
  assert len(test.examples) > 5
  runner = doctest.DocTestRunner()
  runner.run(test)
  assert (runner.failures, runner.tries) == (0, len(test.examples))


# ----------------------------------------------------------------------------- XProf


def test_to_xprof_writes_the_compiled_module(cpu_none, tmp_path):
  path = cpu_none.to_xprof(str(tmp_path), run="r")
  assert path == str(tmp_path / "plugins" / "profile" / "r" / "jaxmem.xplane.pb")
  assert cpu_none.optimized_hlo.module_name == "jit_train_step"
  assert "optimized_hlo" not in cpu_none.as_dict()
  json.dumps(cpu_none.as_dict())  # the dict form stays JSON


def test_cli_explain_xprof(tmp_path, capsys):
  from jaxmem import cli

  logdir = tmp_path / "logs"
  assert cli.main(["explain", "--model", "tiny", "--batch", "2", "--seq", "16", "--target", "cpu", "--top", "2",
                   "--xprof", str(logdir)]) == 0
  err = capsys.readouterr().err
  (written,) = logdir.glob("plugins/profile/*/jaxmem.xplane.pb")
  assert str(written) in err and f"xprof --logdir {logdir}" in err
