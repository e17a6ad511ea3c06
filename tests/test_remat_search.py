"""fit's per-tensor remat search (jaxmem.planning.tensors): assignments as policies by name, the
prediction against the compile, the least recompute that fits, and targets without host memory."""

import dataclasses
from types import SimpleNamespace

import pytest

import jaxmem
from jaxmem.cli import main
from jaxmem.errors import JaxmemError
from jaxmem.models.names import DECODER_LAYER_INPUT
from jaxmem.planning import sweep, tensors
from jaxmem.cache import RowCache
from jaxmem.resolve import plan
from jaxmem.program.remat import REMAT_POLICIES, assignment_name, get_remat, parse_remat


def test_an_assignment_has_one_name_and_its_policy_saves_and_offloads_those_names():
  rp = get_remat("names:offload=decoder_layer_input:save=mlpwo+context")
  assert rp.name == "names:save=context+mlpwo:offload=decoder_layer_input"
  assert rp.saves == ("context", "mlpwo") and rp.offloads == (DECODER_LAYER_INPUT,) and rp.needs_host_memory
  assert get_remat(assignment_name(["mlpwo", "context"], [DECODER_LAYER_INPUT])).name == rp.name
  assert [p.name for p in parse_remat("full," + rp.name)] == ["none", "full", rp.name]


@pytest.mark.parametrize("spec, words", [
    ("names:save=mlpwii", "unknown checkpoint name 'mlpwii'"),
    ("names:keep=context", "parts are save="),
    ("names:save=context:offload=context", "both saved and offloaded"),
    ("search", "fit.s per-tensor search"),
])
def test_a_bad_assignment_is_one_line(spec, words):
  with pytest.raises(JaxmemError, match=words):
    parse_remat(spec)


def test_an_offloading_assignment_on_a_target_without_host_memory_names_its_device_twin():
  with pytest.raises(JaxmemError, match="use names:save=context+"):
    parse_remat("names:save=mlpwo:offload=context", host_memory=False)


def test_maxtexts_custom_map_is_the_assignment_of_the_same_tensors():
  # tpu-recipes' Llama 3.1 70B on v6e-256: the layer input and q/k/v to host, the rest recomputed.
  recipe = get_remat("custom:decoder_layer_input=offload:query_proj=offload:key_proj=offload:value_proj=offload")
  assert recipe.name == "names:offload=decoder_layer_input+key_proj+query_proj+value_proj" and recipe.needs_host_memory
  # MaxText's minimal (layers/nnx_decoders.py) as a custom map: its fused names place jaxmem's
  # separate tensors, and a dense MLP name the experts' too: jaxmem's preset of the same name.
  minimal = ("query_proj", "value_proj", "key_proj", "qkv_proj", "out_proj", "mlpwi_0", "mlpwi_1", "mlpwi", "mlpwo")
  fused = get_remat("custom:" + ":".join(f"{n}=device" for n in minimal) + ":context=remat:engram=remat")
  assert set(fused.saves) == set(REMAT_POLICIES["minimal"].saves) and not fused.offloads
  assert set(get_remat("custom:qkv_proj=device:mlpwi=device").saves) == {"query_proj", "key_proj", "value_proj",
                                                                          "mlpwi_0", "mlpwi_1"}
  # The layer input on the device is every scanned policy's checkpoint: MaxText's default map is full.
  assert get_remat("custom:decoder_layer_input=device").saves == () == get_remat("custom:").saves


def test_a_custom_map_written_back_for_maxtext_is_the_map_given():
  from jaxmem.maxtext.table import ROWS

  name = get_remat("custom:query_proj=device:mlpwo=offload").name
  out = ROWS["remat"].write(name, None)
  assert out == {"remat_policy": "custom", "query_proj": "device", "mlpwo": "offload", "moe_mlpwo": "offload"}
  assert ROWS["remat"].notes(name, None) == ()


@pytest.mark.parametrize("spec, words", [
    ("custom:query_proj=host", "PLACE one of remat, device, offload"),
    ("custom:qproj=device", "not a name of MaxText's custom policy"),
    ("custom:engram=device", "no tensor MaxText calls engram"),
    ("custom:decoder_layer_input=remat", "cannot be remat"),
    ("custom:qkv_proj=device:key_proj=offload", "key_proj is placed both device and offload"),
    ("custom:mlpwo=device:mlpwo=remat", "mlpwo is placed twice"),
])
def test_a_bad_custom_map_is_one_line(spec, words):
  with pytest.raises(JaxmemError, match=words) as e:
    parse_remat(spec)
  assert "\n" not in str(e.value)


def _costs(**device):
  return {n: tensors.NameCost(name=n, bytes=b, device_bytes=b, recompute_flops=0.0) for n, b in device.items()}


def test_placement_offloads_the_smallest_name_that_closes_the_gap_and_the_layer_input_too():
  costs = _costs(a=50, b=20, c=10, **{DECODER_LAYER_INPUT: 30})
  kept = frozenset({"a", "b", "c"})
  assert tensors._place(kept, costs, tensors._Line(base=100), limit=200, offload=True) == (frozenset(), 180)
  off, predicted = tensors._place(kept, costs, tensors._Line(base=100), limit=165, offload=True)
  assert off == {"b"} and predicted == 160  # b (20) closes the gap of 15 with the fewest host bytes
  off, predicted = tensors._place(frozenset(), costs, tensors._Line(base=100), limit=90, offload=True)
  assert off == {DECODER_LAYER_INPUT} and predicted == 70  # full_offloaded's move
  assert tensors._place(kept, costs, tensors._Line(base=100), limit=165, offload=False) is None


def test_a_missed_compile_that_offloaded_moves_the_offload_residue_and_one_that_did_not_the_base():
  costs = _costs(a=50, b=20, **{DECODER_LAYER_INPUT: 30})
  line = tensors._Line(base=100)
  offloading = tensors._Option(kept=frozenset({"a", "b"}), offloads=frozenset({"a"}), recompute=0.0, predicted=120, host=50)
  moved = line.missed(offloading, SimpleNamespace(required_bytes=145), costs)
  assert moved.base == 100 and moved.residue("a") == pytest.approx(0.5)  # 25 of a's 50 stayed
  assert moved.residue("b") == 0.0 and moved.residue(DECODER_LAYER_INPUT) == 0.0  # not offloaded: not learned
  # Offloading a now frees 25 of 170; the layer input and b, never offloaded in a miss, all of theirs.
  assert tensors._place(frozenset({"a", "b"}), costs, moved, limit=145, offload=True) == ({"a"}, 145)
  assert tensors._place(frozenset({"a", "b"}), costs, moved, limit=130, offload=True) == ({DECODER_LAYER_INPUT, "b"}, 120)
  saving = tensors._Option(kept=frozenset({"b"}), offloads=frozenset(), recompute=0.0, predicted=120, host=0)
  assert line.missed(saving, SimpleNamespace(required_bytes=130), costs) == tensors._Line(base=110)


def _endpoints(p, cache):
  """``full`` and every name saved, compiled (the search's own end points: it reads them back)."""
  sizes, _ = tensors.layer_names(p)
  every = assignment_name(n for n in sizes if n != DECODER_LAYER_INPUT)
  q = dataclasses.replace(p, remats=(get_remat("full"), get_remat(every)))
  return sweep.run_rows(q, q.tasks(), cache=cache)


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
  """The tiny model on the host CPU (the fastest compiler here), no host memory space, with a
  capacity halfway between `full` and every name saved: the search must choose (four or five
  compiles of about a second each on a quiet machine)."""
  p = plan(model="tiny", remat="full", batch=4, seq=64, target="cpu")
  cache = RowCache(tmp_path_factory.mktemp("rows"))
  full, every = _endpoints(p, cache)
  capacity = full.required_bytes + (every.required_bytes - full.required_bytes) // 2
  target = dataclasses.replace(p.target, capacity_bytes=capacity, capacity_note="a test's", has_host_memory=False)
  p = dataclasses.replace(p, target=target)
  result = tensors.search_plan(p, cache=cache)
  sizes, flops = tensors.layer_names(p)
  return SimpleNamespace(plan=p, result=result, full=full, every=every, cache=cache, sizes=sizes, flops=flops)


@pytest.mark.slow  # the search's five CPU compiles; its placement and refusals are held above and below without one
def test_the_chosen_assignment_fits_and_its_compile_is_within_5_percent_of_the_prediction(searched):
  r = searched.result
  assert r.row is not None and r.row.fits and r.remat.startswith("names:")
  assert abs(r.row.required_bytes - r.predicted_required_bytes) <= 0.05 * r.row.required_bytes
  assert r.prediction_error_pct == r.tried[-1].prediction_error_pct
  assert 2 < r.compiles <= tensors.MAX_COMPILES


@pytest.mark.slow  # shares the compiles above
def test_the_search_saves_some_names_and_recomputes_less_than_full(searched):
  r = searched.result
  choice = dict(r.assignment)
  assert "save" in choice.values() and "recompute" in choice.values()
  flops = searched.flops
  assert 0 < r.recompute_flops < flops(get_remat("full")) - flops(REMAT_POLICIES["none"])


@pytest.mark.slow  # shares the compiles above
def test_a_target_without_host_memory_is_searched_over_save_and_recompute_only(searched):
  r = searched.result
  assert "offload" not in dict(r.assignment).values() and r.host_bytes == 0 and not r.offload
  assert any("no host memory space" in n for n in r.notes)


@pytest.mark.slow  # shares the compiles above
def test_no_registry_name_preset_predicted_to_fit_recomputes_less(searched):
  # The presets are kept sets of the enumeration: one predicted to fit with less recompute than
  # the answer would mean the search missed it.
  p, r = searched.plan, searched.result
  sizes, flops = searched.sizes, searched.flops
  share = r.per_device_share
  none = flops(REMAT_POLICIES["none"])
  for rp in REMAT_POLICIES.values():
    if not rp.saves or rp.offloads or not set(rp.saves) <= set(sizes):
      continue
    predicted = searched.full.required_bytes + share * sum(sizes[n] for n in set(rp.saves))
    if predicted <= p.target.capacity_bytes * (1 - tensors.MARGIN):
      assert r.recompute_flops <= flops(rp) - none + 1, rp.name


@pytest.mark.slow
def test_the_answer_recomputes_no_more_than_the_cheapest_fitting_registry_policy(searched):
  # Compiles the name presets (a few seconds each on the CPU).
  p, r = searched.plan, searched.result
  names = [rp.name for rp in REMAT_POLICIES.values() if rp.saves and not rp.offloads]
  q = dataclasses.replace(p, remats=(REMAT_POLICIES["none"], *map(get_remat, names)))
  rows = jaxmem.with_overheads(sweep.run_rows(q, q.tasks(), cache=searched.cache))
  fitting = [x for x in rows if x.fits and x.remat != "none"]
  assert fitting
  cheapest = min(x.recompute_overhead_pct for x in fitting)
  assert r.row.recompute_overhead_pct <= cheapest + 1e-6


@pytest.mark.slow
def test_below_full_on_a_tpu_only_offloading_fits_and_the_answer_offloads(tmp_path):
  # TPU compiles of the tiny model (tens of seconds each on a loaded machine): slow. The
  # placement test above holds the offload choice without a compiler.
  p = plan(model="tiny", remat="full", batch=8, seq=1024, target="tpu:v5e-1")
  cache = RowCache(tmp_path)
  full, _ = _endpoints(p, cache)
  target = dataclasses.replace(p.target, capacity_bytes=full.required_bytes - 1, capacity_note="a test's")
  r = tensors.search_plan(dataclasses.replace(p, target=target), cache=cache)
  assert r.offload and r.row is not None and r.row.fits
  assert "offload" in dict(r.assignment).values() and r.host_bytes > 0 and r.host_transfer_bytes == 2 * r.host_bytes
  assert abs(r.prediction_error_pct) <= 5


@pytest.mark.parametrize("argv, words", [
    (["--remat", "search,full", "--batch", "2", "--seq", "64"], "runs alone"),
    (["--remat", "search"], "give --batch and --seq"),
    (["--remat", "search", "--batch", "2", "--seq", "64", "--mesh", "data=1", "--mesh", "fsdp=1"], "takes one --mesh"),
])
def test_the_cli_refuses_what_the_search_cannot_take_in_one_line(argv, words, capsys):
  assert main(["fit", "--model", "tiny", "--target", "cpu", *argv]) == 2
  err = capsys.readouterr().err
  assert words in err and "Traceback" not in err


@pytest.mark.slow  # shares the compiles above
def test_the_table_and_json_say_the_assignment_its_prediction_and_each_compile(searched):
  import json

  from jaxmem.render.tensors import render_tensor_search

  r = searched.result
  text = render_tensor_search(r, "table")
  assert f"recommendation: remat {r.remat}" in text and "end point" in text and f"{r.prediction_error_pct:+.2f}%" in text
  (row,) = json.loads(render_tensor_search(r, "json"))["rows"]
  assert row["remat"] == r.remat and row["compiles"] == r.compiles and row["required_bytes"] == r.row.required_bytes
  assert set(row["assignment"]) == set(searched.sizes) and row["offload_searched"] is False


def test_a_dtype_list_is_refused_in_one_line():
  with pytest.raises(jaxmem.JaxmemError, match="one `qk_dtype`"):
    jaxmem.remat_search(model="tiny", target="tpu:v5e-1", batch=2, seq=128, qk_dtype="bfloat16,float32")
  with pytest.raises(jaxmem.JaxmemError, match="one `dropout`"):
    jaxmem.remat_search(model="tiny", target="tpu:v5e-1", batch=2, seq=128, dropout="0,0.1")


def test_an_assignment_whose_offloaded_bytes_exceed_the_hosts_share_is_not_an_option():
  costs = _costs(a=50, b=20, **{DECODER_LAYER_INPUT: 30})
  line = tensors._Line(base=100)
  free = tensors._options(costs, line, limit=110, offload=True, floor=0.0)
  assert any(o.host > 40 for o in free)  # with the host unbounded some option offloads over 40
  capped = tensors._options(costs, line, limit=110, offload=True, floor=0.0, host_limit=40)
  assert capped and all(o.host <= 40 for o in capped)
  assert tensors._runs(SimpleNamespace(fits=True, host_fits=None))
  assert not tensors._runs(SimpleNamespace(fits=True, host_fits=False))
