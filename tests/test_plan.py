"""``plan``: candidates, pruning before compiling, the compile budget, the
ranking by the compiled step-time estimate, the CLI and its bad input."""

from __future__ import annotations

import dataclasses
import json
import math
import types

import pytest

import jaxmem
from jaxmem.cli import main
from jaxmem.compiler.figures import shape_argument_bytes
from jaxmem.hardware.targets import get_target
from jaxmem.models import count_params, get_config
from jaxmem.planning import search, sweep
from jaxmem.program import sharding as shd
from jaxmem.render.plan import plot_plan
from jaxmem.steptime.moe import TERMS as MOE_TERMS

WORKLOAD = dict(model="tiny", batch=8, seq=128)
ARGS_OVER = "arguments alone over capacity (not compiled)"


def counting(mp: pytest.MonkeyPatch, capacity: int | None = None) -> list[int]:
  """Wraps the compile path the sweep's rows go through: each call's exact argument bytes."""
  seen: list[int] = []
  real = sweep.compile_figures

  def wrapped(traced, target, *, args=None, **kw):
    seen.append(shape_argument_bytes(args, target.num_devices))
    return real(traced, target, args=args, **kw)

  mp.setattr(sweep, "compile_figures", wrapped)
  return seen


@pytest.fixture(scope="module")
def planned():
  """tiny on tpu:v5e-4 (its own capacity), two compiles, and the compile calls counted. The
  rows go to the session's row cache, so the CLI test's first candidate is read from it."""
  with pytest.MonkeyPatch.context() as mp:
    seen = counting(mp)
    result = jaxmem.plan(target="tpu:v5e-4", budget=2, cache=jaxmem.RowCache(), **WORKLOAD)
  return result, seen


@pytest.mark.needs_tpu_compiler
def test_budget_respected_and_compiles_counted(planned):
  result, seen = planned
  assert len(seen) == result.compiles - result.cache_hits and result.compiles <= result.budget == 2
  assert result.not_compiled > 0  # more valid candidates than the budget: the budget stopped it
  assert dict(result.pruned)["tensor does not divide the heads"] > 0  # tensor=4 over two kv heads
  assert json.loads(jaxmem.table(result, "json"))["compiles"] == result.compiles


@pytest.mark.needs_tpu_compiler
def test_recommendation_is_the_fastest_fitting_compiled(planned):
  result, _ = planned
  fitting = [r for r in result.rows if r.fits]
  assert fitting, "tiny fits on v5e"
  assert result.recommended is result.rows[0]
  assert result.recommended.step_time_s == min(r.step_time_s for r in fitting)
  assert all(r.fits for r in result.rows[: len(fitting)])  # fitting ones first
  assert "recommendation: mesh " + result.recommended.mesh in jaxmem.table(result)
  # Ranked by the simulated schedule, never below its roofline bound; the choice explained in one line.
  assert all(r.step_time_s >= r.roofline_step_time_s for r in fitting)
  assert result.why and "\n" not in result.why and search.label(result.recommended) in result.why
  assert json.loads(jaxmem.table(result, "json"))["why"] == result.why and f"why: {result.why}" in jaxmem.table(result)


@pytest.mark.needs_tpu_compiler
def test_why_names_the_term_that_differs(planned):
  best = dataclasses.replace(planned[0].rows[0], step_time_s=1.0, compute_bound_share=1.0, memory_bound_share=0.0,
                             comm_bound_share=0.0, comm_all_gather_bytes=0, comm_bytes=0)
  gathers = dataclasses.replace(best, mesh="data=4", step_time_s=1.5, compute_bound_share=2 / 3, comm_bound_share=1 / 3,
                                comm_all_gather_bytes=2**30, comm_bytes=2**30)
  line = search.why([best, gathers])
  assert "500.0 ms" in line and "exposed communication" in line and "all-gathers" in line and "compute" not in line
  recomputes = dataclasses.replace(best, remat="full", step_time_s=1.2, flops=1.2 * best.flops)
  assert "more FLOPs" in search.why([best, recomputes]) and "remat full" in search.why([best, recomputes])
  assert "tie" in search.why([best, dataclasses.replace(best, mesh="data=4")])


@pytest.mark.needs_tpu_compiler
def test_plot(planned, tmp_path):
  path = tmp_path / "pareto.png"
  plot_plan(planned[0], str(path))
  assert path.stat().st_size > 1000


@pytest.mark.needs_tpu_compiler
def test_arguments_over_capacity_are_never_compiled():
  # A capacity between the fsdp meshes' arguments (parameters split four ways) and the data
  # meshes' (replicated): the data meshes are dropped before anything compiles.
  cap = 400_000
  tgt = dataclasses.replace(get_target("tpu:v5e-4"), capacity_bytes=cap, capacity_note="test")
  with pytest.MonkeyPatch.context() as mp:
    seen = counting(mp)
    result = jaxmem.plan(target=tgt, budget=1, **WORKLOAD)
  assert seen and all(b <= cap for b in seen)
  assert dict(result.pruned)[ARGS_OVER] > 0
  assert all(not r.mesh.startswith("data=") for r in result.rows)
  assert result.recommended is None and not any(r.fits for r in result.rows)  # tiny's step needs more than 400 kB
  assert "none of the 1 candidates compiled fits" in jaxmem.table(result)


@pytest.mark.needs_tpu_compiler
def test_cli_json_and_bad_input(planned, capsys):
  # planned: its rows are in the row cache, so this first candidate is read, not compiled.
  assert main(["plan", *"--model tiny --target tpu:v5e-4 --batch 8 --seq 128 --budget 1 --format json".split()]) == 0
  doc = json.loads(capsys.readouterr().out)
  assert doc["compiles"] == 1 and doc["budget"] == 1 and len(doc["rows"]) == 1
  assert main(["plan", "--model", "tiny", "--target", "tpu:v5e-4", "--budget", "0"]) == 2
  err = capsys.readouterr().err.strip()
  assert "--budget" in err and len(err.splitlines()) == 1
  assert main(["plan", "--model", "tiny", "--target", "tpu:v5e-4", "--batch", "0"]) == 2
  assert "--batch must be a whole number" in capsys.readouterr().err


def test_factorizations_cover_the_device_count():
  meshes = search.factorizations(8, ("data", "fsdp", "tensor"))
  assert all(math.prod(s for _, s in m) == 8 for m in meshes)
  assert len(meshes) == len({tuple(m) for m in meshes}) == 10  # ordered factorizations of 2^3 into 3 parts


def test_axes_the_model_cannot_use_are_skipped():
  assert "expert" not in search.search_axes(get_config("tiny"))
  assert all(a in shd.MESH_AXES for a in search.search_axes(get_config("tiny")))


def test_invalid_meshes_have_reasons():
  cfg = get_config("tiny")
  assert search.mesh_reason((("tensor", 8),), cfg, 8, 128, 1) == "tensor does not divide the heads"
  assert search.mesh_reason((("data", 8),), cfg, 4, 128, 1).startswith("batch not divisible")
  assert search.mesh_reason((("data", 4),), cfg, 8, 128, 4).startswith("batch not divisible")  # microbatches count
  assert search.mesh_reason((("fsdp", 4),), cfg, 8, 128, 2) is None
  assert search.mesh_reason((("context", 4),), cfg, 8, 126, 1) == "sequence not divisible by its mesh axes"
  assert search.mesh_reason((("stage", 4),), cfg, 8, 128, 1, 4) == "the stage axis cannot pipeline this model's layers"
  moe = get_config("tiny-moe")
  assert search.mesh_reason((("expert", 16),), moe, 16, 128, 1) == "expert does not divide the experts"


def test_input_bad_on_every_mesh_is_its_own_error_not_a_mesh_reason():
  # A sequence past GPT-2's learned positions fails alike on every mesh: it is not counted as
  # a mesh's reason (by the kind of the refusal, not its words), but raised as the one line it is.
  cfg = get_config("tiny-gpt2")
  with pytest.raises(jaxmem.JaxmemError, match="learned positions"):
    search.mesh_reason((("fsdp", 4),), cfg, 8, cfg.max_seq_len * 2, 1)


def test_closed_form_orders_by_recompute_and_memory():
  cfg, tgt = get_config("llama3-8b"), get_target("tpu:v5p-16")
  mesh = (("fsdp", 16),)
  est = {r.name: search.analytic(cfg, mesh=mesh, rung=r, microbatches=1, batch=64, seq=8192, argument_bytes=0,
                                 param_count=8_000_000_000, target=tgt, fused=True) for r in search.REMAT_LADDER}
  names = [r.name for r in search.REMAT_LADDER]
  mems, times = [est[n][0] for n in names], [est[n][1] for n in names]
  assert mems == sorted(mems, reverse=True) and times == sorted(times)  # none to full: less memory, more time


def test_dominance():
  c = dict(mesh="fsdp=4", attention="splash", argument_bytes=0, estimated_required_bytes=0, estimated_step_time_s=0.0)
  failed = [search.Candidate(remat="minimal", microbatches=2, level=1, **c)]
  assert search.dominated(search.Candidate(remat="none", microbatches=1, level=0, **c), failed)
  assert not search.dominated(search.Candidate(remat="full", microbatches=1, level=4, **c), failed)
  assert not search.dominated(search.Candidate(remat="none", microbatches=4, level=0, **c), failed)
  other = {**c, "mesh": "data=4"}
  assert not search.dominated(search.Candidate(remat="none", microbatches=1, level=0, **other), failed)


def test_calibration_moves_a_rung_the_closed_form_underestimates_behind_those_that_fit():
  """No compile: one `none` candidate compiled at twice its estimate beyond its arguments; the
  other `none` candidates, estimated to fit, are then expected not to, and go behind `minimal`."""
  gib = 2**30
  c = dict(attention="splash", argument_bytes=10 * gib, estimated_step_time_s=1.0, microbatches=1)
  none_a = search.Candidate(mesh="fsdp=8", remat="none", level=0, estimated_required_bytes=60 * gib, **c)
  none_b = search.Candidate(mesh="data=2,fsdp=4", remat="none", level=0, estimated_required_bytes=70 * gib, **c)
  minimal = search.Candidate(mesh="fsdp=8", remat="minimal", level=1, estimated_required_bytes=50 * gib,
                             **{**c, "estimated_step_time_s": 1.1})
  capacity = 95 * gib
  assert search.order([minimal, none_b], capacity) == [none_b, minimal]  # the closed form alone
  refused = types.SimpleNamespace(required_bytes=110 * gib)  # the compiled row: only its figure is read
  scales = search.calibration([(none_a, refused)])
  assert scales == {"none": 2.0}
  assert search.calibrated_required(none_b, scales) == 130 * gib
  assert search.order([minimal, none_b], capacity, scales) == [minimal, none_b]
  assert search.calibrated_required(minimal, scales) == minimal.estimated_required_bytes  # other rungs untouched


def test_stage_meshes_are_candidates_charged_their_bubble():
  """No compile: tiny on 4 devices (batch 8) gets stage=2,fsdp=2 at 2 and 4 pipeline
  microbatches (8 would leave half a sequence per pipeline microbatch: pruned), and the closed
  form's time falls as M grows (the bubble (M + S - 1) / M)."""
  p = search._base_plan(jaxmem.Workload(**WORKLOAD, target="tpu:v5e-4"), get_config("tiny"), get_target("tpu:v5e-4"))
  cands = search.candidates(p, search.Counter())
  staged = [c for c in cands
            if c.mesh == "stage=2,fsdp=2" and c.remat == "none" and c.microbatches == 1 and c.attention == "dot"]
  assert sorted(c.pipeline_microbatches for c in staged) == [2, 4]
  times = [c.estimated_step_time_s for c in sorted(staged, key=lambda c: c.pipeline_microbatches)]
  assert times == sorted(times, reverse=True) and times[0] > times[-1]
  assert all(c.pipeline_microbatches is None for c in cands if "stage" not in c.mesh)


@pytest.mark.needs_tpu_compiler
def test_a_stage_candidate_compiles_with_its_own_schedule():
  p = search._base_plan(jaxmem.Workload(**WORKLOAD, target="tpu:v5e-4"), get_config("tiny"), get_target("tpu:v5e-4"))
  c = next(c for c in search.candidates(p, search.Counter())
           if c.mesh == "stage=2,fsdp=2" and c.pipeline_microbatches == 4 and c.remat == "full" and c.microbatches == 1)
  (row,) = search._run_candidates(p, p.tasks()[0], [c], jobs=1, cache=None, on_row=None)
  assert (row.stages, row.pipeline_microbatches) == (2, 4) and row.bubble_fraction == pytest.approx(1 / 5)
  assert row.error is None and row.fits


def test_bad_budget_is_one_line_before_compiling():
  with pytest.raises(jaxmem.JaxmemError, match="budget"):
    jaxmem.plan(model="tiny", target="tpu:v5e-4", budget=0)


def test_compiling_ahead_in_parallel_takes_the_serial_searchs_rows():
  """No compile: the first candidate does not fit, which makes the second (same mesh, more
  saved, no more microbatches) dominated, so one process skips it for the third. Compiled two at
  a time, the second is compiled ahead but never taken: the rows are the serial search's."""
  p = search._base_plan(jaxmem.Workload(**WORKLOAD, target="tpu:v5e-4"), get_config("tiny"), get_target("tpu:v5e-4"))
  c = dict(mesh="fsdp=4", attention="splash", argument_bytes=0, estimated_required_bytes=0)
  over = search.Candidate(remat="none", microbatches=2, level=0, estimated_step_time_s=1.0, **c)
  dominated = search.Candidate(remat="none", microbatches=1, level=0, estimated_step_time_s=2.0, **c)
  fits = search.Candidate(remat="full", microbatches=1, level=4, estimated_step_time_s=3.0, **c)
  compiled: list[list[search.Candidate]] = []

  def fake(p, base, batch, **kw):  # a row that fits unless it is `over`'s
    compiled.append(batch)
    return [types.SimpleNamespace(name=x.remat, fits=x is not over, required_bytes=None) for x in batch]

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(search, "_run_candidates", fake)
    taken = {}
    for jobs in (1, 2):
      compiled.clear()
      rows, done, skipped, unreached = search.compile_in_order(p, [over, dominated, fits], budget=2,
                                                                run=jaxmem.RunOptions(jobs=jobs))
      taken[jobs] = ([r.name for r in rows], done, dict(skipped), [len(b) for b in compiled], unreached)
  assert taken[1][:3] == taken[2][:3] == (["none", "full"], [over, fits], {
      "needs at least the memory of a compiled candidate that did not fit (not compiled)": 1})
  assert taken[1][3:] == ([1, 1], 0)
  assert taken[2][3:] == ([2, 1], 1)  # `dominated` compiled ahead and left out, so said in the notes
  assert "1 candidate(s) compiled in parallel ahead" in search.search_notes(1)[-1]


def _ranking(result: search.PlanResult) -> tuple:
  """What a plan answers: the recommendation, the rows' configurations in ranked order, `why`."""
  rec = result.recommended
  return (None if rec is None else search.label(rec), [search.label(r) for r in result.rows], result.why,
          result.compiles)


@pytest.fixture(scope="module")
def serial_plan():
  """tiny on tpu:v5e-4 in one process, three compiles, no row cache (each run compiles its own)."""
  return jaxmem.plan(target="tpu:v5e-4", budget=3, cache=None, **WORKLOAD)


@pytest.mark.slow  # two worker processes' start and compiles; test_compiling_ahead_in_parallel_takes_the_serial_searchs_rows
# holds the ordering without a compiler, test_planning's jobs=2 compare the worker processes
@pytest.mark.needs_tpu_compiler
def test_parallel_jobs_give_the_serial_ranking(serial_plan):
  parallel = jaxmem.plan(target="tpu:v5e-4", budget=3, cache=None, jobs=2, **WORKLOAD)
  assert _ranking(parallel) == _ranking(serial_plan) and serial_plan.recommended is not None
  assert [r.step_time_s for r in parallel.rows] == [r.step_time_s for r in serial_plan.rows]


@pytest.mark.slow  # a local Dask cluster's start and its compiles; the jobs=2 case above takes the same path
@pytest.mark.needs_tpu_compiler
def test_dask_scheduler_gives_the_serial_ranking(serial_plan):
  distributed = pytest.importorskip("distributed")
  with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
    remote = jaxmem.plan(target="tpu:v5e-4", budget=3, cache=None, scheduler=cluster.scheduler_address, **WORKLOAD)
  assert _ranking(remote) == _ranking(serial_plan)
  assert [r.step_time_s for r in remote.rows] == [r.step_time_s for r in serial_plan.rows]


@pytest.mark.needs_tpu_compiler
def test_cli_emit_maxtext(planned, capsys):
  # planned: its rows are in the row cache, so this first candidate is read, not compiled.
  argv = ["plan", *"--model tiny --target tpu:v5e-4 --batch 8 --seq 128 --budget 1 --emit maxtext".split()]
  assert main(argv) == 0
  out = capsys.readouterr().out.splitlines()
  at = next(i for i, line in enumerate(out) if line.startswith("MaxText overrides for "))
  pasted = dict(word.split("=", 1) for word in out[at + 1].split())
  assert main([*argv, "--format", "json"]) == 0
  doc = json.loads(capsys.readouterr().out)
  overrides = doc["maxtext"]["overrides"]
  assert pasted == {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in overrides.items()}
  mesh = dict(shd.parse_mesh(doc["recommended"]["mesh"]))
  assert all(overrides[f"ici_{'pipeline' if a == 'stage' else a}_parallelism"] == n for a, n in mesh.items())
  assert overrides["max_target_length"] == 128 and any(line.startswith("maxtext note: model tiny") for line in out)
  assert main([*argv, "--format", "csv"]) == 2
  assert "--emit" in capsys.readouterr().err


# --- mixture of experts: the MoE kernel and the experts' placement, and the MoE term in `why` ---

MOE_WORKLOAD = dict(model="tiny-moe", batch=8, seq=128)


def _moe_base(target: str = "tpu:v5e-4") -> sweep.Plan:
  return search._base_plan(jaxmem.Workload(**MOE_WORKLOAD, target=target), get_config("tiny-moe"), get_target(target))


@pytest.fixture(scope="module")
def moe_candidates():
  """tiny-moe's candidates on tpu:v5e-4 (no compile; each mesh's arguments sized once)."""
  p = _moe_base()
  return p, search.candidates(p, search.Counter())


def test_moe_candidates_take_each_kernel_the_target_offers_and_each_placement_of_the_experts(moe_candidates):
  """No compile: on TPU the MoE kernels are auto (gmm) and ragged_dot, once each; the experts'
  weights split on d_model or on their expert dimension over fsdp on every mesh with an fsdp
  axis, neither where there is none; a dense model has no MoE choice."""
  _, cands = moe_candidates
  assert {c.moe_kernel for c in cands} == {"auto", "ragged_dot"}
  for c in cands:
    fsdp = dict(shd.parse_mesh(c.mesh)).get("fsdp", 1) > 1
    assert (c.fsdp_shard_on_exp is not None) == fsdp
  placed = {(c.mesh, c.fsdp_shard_on_exp) for c in cands if c.fsdp_shard_on_exp is not None}
  assert {m for m, on in placed if on} == {m for m, on in placed if not on} != set()
  assert any(c.mesh.startswith("expert=") for c in cands)  # expert parallelism, searched as a mesh axis
  tpu = get_target("tpu:v5e-4")
  dense = search._base_plan(jaxmem.Workload(**WORKLOAD, target=tpu), get_config("tiny"), tpu)
  kernels = search._moe_kernels(dense)
  assert kernels == ({None: None}, 0)
  assert search._moe_choices(dense, (("fsdp", 4),), kernels[0], search.Counter(), 1) == [search.MoeChoice()]


def test_moe_kernels_are_what_the_target_resolves():
  assert search._moe_kernels(_moe_base()) == ({"auto": "gmm", "ragged_dot": "ragged_dot"}, 0)
  # GPU targets run capacity by default: no grouped matmul to choose.
  assert search._moe_kernels(_moe_base("gpu:h100")) == ({None: None}, 0)


def test_experts_on_fsdp_is_offered_only_where_the_axes_divide_the_experts():
  p, pruned = _moe_base(), search.Counter()
  kernels = {"auto": "gmm"}
  assert [c.on_fsdp for c in search._moe_choices(p, (("fsdp", 4),), kernels, pruned, 1)] == [False, True]
  assert [c.on_fsdp for c in search._moe_choices(p, (("fsdp", 16),), kernels, pruned, 1)] == [False]  # 8 experts
  assert pruned == {search.EXPERTS_ON_FSDP_REFUSED: 1}
  assert [c.on_fsdp for c in search._moe_choices(p, (("expert", 4),), kernels, pruned, 1)] == [None]


def test_closed_form_charges_ragged_dot_its_dense_expansion():
  cfg, tgt = get_config("mixtral-8x7b"), get_target("tpu:v5p-16")
  times = {k: search.analytic(cfg, mesh=(("fsdp", 16),), rung=search.REMAT_LADDER[0], microbatches=1, batch=64,
                              seq=4096, argument_bytes=0, param_count=count_params(cfg), target=tgt, fused=True,
                              moe_kernel=k)[1] for k in ("gmm", "ragged_dot")}
  assert times["ragged_dot"] > times["gmm"]


def _moe_row(row, step: float, moe: dict[str, float] | None, **fields):
  return dataclasses.replace(row, step_time_s=step, compute_bound_share=1.0, memory_bound_share=0.0,
                             comm_bound_share=0.0, moe_time_s=moe, **fields)


@pytest.fixture(scope="module")
def moe_planned():
  """tiny-moe on tpu:v5e-4, two compiles, no row cache."""
  return jaxmem.plan(target="tpu:v5e-4", budget=2, cache=None, **MOE_WORKLOAD)


@pytest.mark.needs_tpu_compiler
def test_why_names_the_moe_term_whose_difference_is_most_of_the_gap(moe_planned):
  row = moe_planned.rows[0]
  terms = dict.fromkeys(MOE_TERMS, 0.0)
  best = _moe_row(row, 1.0, {**terms, "grouped_matmul": 0.2, "token_exchange": 0.1})
  slower = _moe_row(row, 1.5, {**terms, "grouped_matmul": 0.5, "token_exchange": 0.3}, remat="full")
  # 0.3 s of the 0.5 s between them is the grouped matmul's: more than half, so it decides.
  assert search.moe_decides(best, slower) == "grouped matmul decides: 500.0 ms vs 200.0 ms"
  line = search.why([best, slower])
  assert "grouped matmul decides: 500.0 ms vs 200.0 ms" in line and line.index("decides") < line.index("less")
  # 0.2 s of 0.5 s: no one MoE term accounts for most of the difference.
  spread = _moe_row(row, 1.5, {**terms, "grouped_matmul": 0.4, "token_exchange": 0.3}, remat="full")
  assert search.moe_decides(best, spread) is None and "decides" not in search.why([best, spread])
  # The runner-up's experts ran ragged_dot (no grouped matmul kernel the walk reads): no term to
  # set against, and the FLOPs are said to come from the kernel.
  dense = _moe_row(row, 1.5, None, moe_kernel="ragged_dot", flops=3 * row.flops)
  line = search.why([best, dense])
  assert "decides" not in line and f"MoE kernel ragged_dot vs {row.moe_kernel}" in line
  assert "remat" not in line  # the same policy: not what differs


@pytest.mark.needs_tpu_compiler
def test_plan_on_an_moe_preset_ranks_its_kernels_and_says_which_moe_term_decides(moe_planned):
  result = moe_planned
  assert result.recommended is not None and len(result.rows) == 2
  for r in result.rows:  # the walk reads gmm's kernels as the MoE terms; ragged_dot's expansion it does not
    assert r.moe_kernel in ("gmm", "ragged_dot") and search.label(r).endswith(f" {r.moe_kernel}")
    if r.moe_kernel == "gmm":
      assert set(r.moe_time_s) == set(MOE_TERMS) and r.moe_time_s["grouped_matmul"] > 0
  fitting = [r for r in result.rows if r.fits]
  decides = search.moe_decides(fitting[0], fitting[1])
  assert result.why.startswith(search.label(fitting[0]))
  assert (decides is not None and decides in result.why) or (decides is None and "decides" not in result.why)
  doc = json.loads(jaxmem.table(result, "json"))
  assert doc["why"] == result.why and doc["rows"][0]["moe_time_s"] == result.rows[0].moe_time_s


@pytest.mark.needs_tpu_compiler
def test_moe_candidates_compile_with_their_kernel_and_placement(moe_candidates):
  p, cands = moe_candidates
  pick = {(c.moe_kernel, c.fsdp_shard_on_exp): c for c in cands
          if c.mesh == "fsdp=4" and c.remat == "full" and c.microbatches == 1 and c.attention == "auto"}
  chosen = [pick["ragged_dot", False], pick["auto", True]]
  dense, on_fsdp = search._run_candidates(p, p.tasks()[0], chosen, jobs=1, cache=None, on_row=None)
  assert dense.error is None and dense.moe_kernel == "ragged_dot" and dense.moe_time_s is None
  assert dense.fsdp_shard_on_exp is False and search.label(dense).endswith(" ragged_dot")
  assert on_fsdp.error is None and on_fsdp.moe_kernel == "gmm" and on_fsdp.fsdp_shard_on_exp is True
  assert search.label(on_fsdp).endswith("gmm experts on fsdp") and on_fsdp.moe_time_s
  assert on_fsdp.param_bytes == dense.param_bytes  # the same bytes a device, split on another dimension
