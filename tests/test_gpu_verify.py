"""tests/gpu/verify.py, the one verification run on a GPU machine, on the CPU: its dry run (and a
run that finds no CUDA GPU) skips every GPU stage cleanly and still writes every file and the
summary, printed last; its scheduler, its comparisons and its correctness grid on NumPy arrays.

The script runs as a user runs it, in a subprocess from the repository root. It needs neither
torch, JAX nor the native library here. Where both torch and the native library are at hand, the decoding step's
GPU code paths (its launches in place and not, the bitwise repeat, the timing rows) are rehearsed with "cuda" on
the CPU: ky_run_device answered by the CPU kernels of ky_run, the launch plans the library's own. The layer timing
(time and memory against MultiHeadAttention) runs on the CPU on PyTorch, and on JAX in a program of its own.
"""

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import time
import types

import numpy as np
import pytest

import numpy_reference
from conftest import run_program
from conftest import runs_on

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "tests", "gpu", "verify.py")
# At most 8 files come back from the GPU machine; the run command tees its console log into the folder too.
MAX_FILES = 8


def _load_script():
    spec = importlib.util.spec_from_file_location("gpu_verify", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


verify = _load_script()
STAGE = {stage.name: stage for stage in verify.STAGES}


def _run(out_dir, *args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, SCRIPT, "--out", str(out_dir), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=env)


def _finished_run(proc, out_dir):
    """The stage records of a run that exited 0, wrote its files and printed the summary last."""
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    files = sorted(os.listdir(out_dir))
    assert len(files) + 1 <= MAX_FILES, files  # + log.txt
    assert verify.SUMMARY_FILE in files
    records = {}
    for name in files:
        if name.endswith(".json"):
            with open(os.path.join(out_dir, name)) as f:
                records.update(json.load(f))
    with open(os.path.join(out_dir, verify.SUMMARY_FILE)) as f:
        summary = f.read()
    assert proc.stdout.rstrip().endswith(summary.rstrip()), proc.stdout[-2000:]
    for name, record in records.items():
        assert f"| {name} | {record['status']} |" in summary
    return records, files


def test_dry_run_skips_every_gpu_stage_and_writes_every_file(tmp_path):
    records, files = _finished_run(_run(tmp_path, "--dry-run", "--deadline", "60"), tmp_path)
    assert set(files) == {stage.file for stage in verify.STAGES} | {verify.SUMMARY_FILE}
    assert set(records) == set(STAGE)
    assert records["env"]["status"] == "ok"
    for name in list(STAGE)[1:]:
        assert records[name]["status"] == "skipped"
        assert records[name]["reason"].startswith("no CUDA GPU")
    assert records["correctness"]["planned_cases"]["lsh_cumulation"] > 100
    assert records["correctness"]["planned_cases"]["lower_bound_gradients"] > 100
    assert records["correctness"]["planned_cases"]["lsh_cumulation_step"] == len(verify._decoding_cases())
    with open(tmp_path / verify.SUMMARY_FILE) as f:
        assert "Kernels: whether the Triton kernels ran is not known (stage load did not run)." in f.read()


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has an NVIDIA driver")
def test_run_without_a_cuda_gpu_detects_it_and_skips_cleanly(tmp_path):
    records, _ = _finished_run(_run(tmp_path, "--deadline", "120"), tmp_path)
    assert records["env"]["status"] == "ok"
    assert records["env"]["result"]["cuda_available"] is False
    for name in list(STAGE)[1:]:
        assert records[name]["status"] == "skipped"
        assert records[name]["reason"].startswith("no CUDA GPU")


def test_a_deadline_below_every_limit_skips_every_stage_and_still_summarizes(tmp_path):
    records, _ = _finished_run(_run(tmp_path, "--deadline", "3"), tmp_path)
    assert {r["status"] for r in records.values()} == {"skipped"}
    assert all("left before the deadline" in r["reason"] for r in records.values())


def test_only_runs_env_and_the_stages_named(tmp_path):
    records, files = _finished_run(_run(tmp_path, "--dry-run", "--only", "rates", "--deadline", "60"), tmp_path)
    assert set(records) == {"env", "rates"}
    assert set(files) == {STAGE["env"].file, STAGE["rates"].file, verify.SUMMARY_FILE}


def test_stages_fit_the_device_tool_and_run_most_valuable_first():
    assert [s.name for s in verify.STAGES][:4] == ["env", "load", "correctness", "timings"]
    # The run command gives verify.py --deadline 400 under `timeout 420`: the first four stages always fit.
    assert sum(s.limit for s in verify.STAGES[:4]) + verify.SUMMARY_RESERVE_S <= 400
    assert len({s.file for s in verify.STAGES}) + 2 <= MAX_FILES  # + summary.md and log.txt
    assert set(verify.WORKERS) >= set(STAGE)


def test_scheduler_skips_a_stage_whose_limit_exceeds_the_time_left():
    timings, facts = STAGE["timings"], {"gpu": True, "library": True}
    assert verify.skip_reason(timings, timings.limit, facts) is None
    assert "left before the deadline" in verify.skip_reason(timings, timings.limit - 0.5, facts)
    assert "left before the deadline" in verify.skip_reason(STAGE["env"], -3, facts)


def test_scheduler_skips_gpu_stages_without_a_gpu_and_library_stages_after_a_failed_load():
    plenty = 1e6
    no_gpu = {"gpu": False, "gpu_reason": "torch is not installed"}
    assert verify.skip_reason(STAGE["env"], plenty, no_gpu) is None
    assert verify.skip_reason(STAGE["rates"], plenty, no_gpu) == "no CUDA GPU (torch is not installed)"
    failed_load = {"gpu": True, "library": False, "library_reason": "no keras_yoso/_yoso_native*.so"}
    assert "native library" in verify.skip_reason(STAGE["correctness"], plenty, failed_load)
    assert "no keras_yoso/_yoso_native*.so" in verify.skip_reason(STAGE["sanitizer"], plenty, failed_load)
    assert verify.skip_reason(STAGE["rates"], plenty, failed_load) is None  # needs no library
    assert verify.skip_reason(STAGE["timings"], plenty, failed_load) is None  # SDPA still anchors the card
    assert verify.skip_reason(STAGE["correctness"], plenty, {"gpu": True, "library": None}) is None  # load not run
    dry = {"dry_run": True, "gpu": True, "library": True}
    assert verify.skip_reason(STAGE["env"], plenty, dry) is None
    assert verify.skip_reason(STAGE["load"], plenty, dry) == "no CUDA GPU (--dry-run)"


def test_facts_come_from_the_env_and_load_records():
    facts = {}
    verify.learn(STAGE["env"], {"status": "ok", "result": {"cuda_available": True}}, facts)
    assert facts["gpu"] is True
    verify.learn(STAGE["load"], {"status": "checks failed", "result": {},
                                 "checks": {"failures": ["ky_device_kernels() is 0"]}}, facts)
    assert facts["library"] is False and facts["library_reason"] == "ky_device_kernels() is 0"
    verify.learn(STAGE["load"], {"status": "ok", "result": {"launched": True}, "checks": {}}, facts)
    assert facts["library"] is True


def test_compare_values_scales_the_bound_with_the_reference():
    want = np.array([[0.5, -3.0], [2.0, 0.0]])
    allowed = 1e-4 * 3.0
    assert verify.compare_values(want + 0.9 * allowed, want, "float32")["verdict"] == "pass"
    assert verify.compare_values(want + 2 * allowed, want, "float32")["verdict"] == "tf32"
    assert verify.compare_values(want + 3 * 2e-3, want, "float32")["verdict"] == "fail"
    assert verify.compare_values(want + 0.04, want, "bfloat16")["verdict"] == "pass"  # 1.6e-2 * 3
    assert verify.compare_values(want + 0.04, want, "float16")["verdict"] == "fail"
    small = verify.compare_values(np.full(3, 0.01 + 1.5e-3), np.full(3, 0.01), "float16")
    assert small["allowed"] == pytest.approx(2e-3) and small["verdict"] == "pass"  # max(1, max |want|)


def test_compare_values_fails_on_nan_and_on_a_wrong_shape():
    want = np.ones((2, 3))
    got = want.copy()
    got[1, 2] = np.nan
    result = verify.compare_values(got, want, "bfloat16")
    assert result["verdict"] == "fail" and math.isinf(result["error"]) and result["non_finite"] == 1
    assert verify.compare_values(np.ones((3, 2)), want, "float32")["verdict"] == "fail"


def test_compare_codes_counts_the_codes_that_differ():
    want = np.arange(200, dtype=np.int32).reshape(2, 4, 25)
    got = want.copy()
    assert verify.compare_codes(got, want) == {"verdict": "pass", "error": 0.0, "allowed": 0.0, "ratio": 0.0}
    got[0, 0, 0] = -1
    assert verify.compare_codes(got, want)["verdict"] == "fail"
    assert verify.compare_codes(got, want, allowed_fraction=0.01)["error"] == pytest.approx(1 / 200)
    assert verify.compare_codes(got, want, allowed_fraction=0.01)["verdict"] == "pass"


def test_compare_values_takes_a_bound_of_its_own():
    want = np.array([1.0, -4.0])
    tf32 = verify.compare_values(want + 6e-3, want, "float32", tolerance=verify.TF32_TOLERANCE)
    assert tf32["verdict"] == "pass" and tf32["allowed"] == pytest.approx(8e-3)
    assert verify.compare_values(want + 9e-3, want, "float32", tolerance=verify.TF32_TOLERANCE)["verdict"] == "fail"


def test_triton_family_of_a_compute_capability_is_the_launchers():
    assert verify.triton_arch(9, 0) == 90
    assert [verify.triton_arch(8, minor) for minor in (0, 6, 9)] == [80, 80, 80]
    assert verify.triton_arch(7, 5) == verify.triton_arch(10, 0) == verify.triton_arch(9, 1) == 0


def test_triton_coverage_says_when_the_triton_kernels_were_not_checked():
    checked, sentence = verify.triton_coverage(150, "90")
    assert checked and "150 Triton cubins" in sentence and "sm_90" in sentence
    for cubins, capability in ((0, "90"), (150, "75"), (None, "90"), (150, None)):
        checked, sentence = verify.triton_coverage(cubins, capability)
        assert not checked
    assert "the Triton kernels were not checked" in verify.triton_coverage(0, "90")[1]
    assert "lower_bound_gradients and lsh_cumulation_step had no GPU kernel" in verify.triton_coverage(0, "90")[1]
    assert "lsh_cumulation_step ran them" in verify.triton_coverage(150, "80")[1]
    assert "the Triton kernels were not checked" in verify.triton_coverage(150, "100")[1]


def test_summary_flags_a_library_without_triton_cubins():
    records = {"load": {"status": "ok", "seconds": 1.0, "result": {"triton_cubins": 0, "capability": "90"}}}
    text = verify.summary(records, 7, verify._parse(["--out", "unused"]))
    assert "Kernels: **the library embeds no Triton cubins: the Triton kernels were not checked" in text
    assert "Triton kernels NOT checked" in text
    records["load"]["result"]["triton_cubins"] = 150
    text = verify.summary(records, 7, verify._parse(["--out", "unused"]))
    assert "Kernels: the library embeds 150 Triton cubins; this sm_90 GPU runs the sm_90 ones" in text


def test_worst_verdict_orders_pass_tf32_fail_error():
    assert verify.worst_verdict([]) == "pass"
    assert verify.worst_verdict(["pass", "tf32"]) == "tf32"
    assert verify.worst_verdict(["error", "fail", "pass"]) == "error"


def test_correctness_grid_takes_every_value_of_every_axis():
    names = list(verify.CUMULATIONS + verify.HASHES)
    cases = verify.correctness_cases(names)
    assert len({c["id"] for c in cases}) == len(cases)
    assert max(cases[0]["nq"], cases[0]["nk"]) == verify.LONG_LENGTH  # the slow references start first
    for name in verify.CUMULATIONS:
        # the grid (lsh_cumulation's tau 14 cases, past the Triton sort, are checked below)
        mine = [c for c in cases if c["primitive"] == name and c["hash_code_len"] <= 12]
        assert {c["nq"] for c in mine} | {c["nk"] for c in mine} == {1, 7, 1000, 4099}
        assert {c["mask"] for c in mine} == set(verify.MASKS)
        assert {c["codes"] for c in mine} == set(verify.CODE_DISTRIBUTIONS)
        assert {c["hash_code_len"] for c in mine} == {1, 6, 8, 12}
        assert {c["width"] for c in mine} == {c["weight_width"] for c in mine} == {1, 64, 100}
        for dtype in verify.DTYPES:
            typed = [c for c in mine if c["dtype"] == dtype]
            assert {c["width"] for c in typed} == {1, 64, 100}
            assert {c["hash_code_len"] for c in typed} == {1, 6, 8, 12}
    for name in verify.HASHES:
        mine = [c for c in cases if c["primitive"] == name]
        assert {c["n"] for c in mine} == {1, 7, 1000, 4099}
        # the row form's widths (one lane a row up to 64, two lanes for 100) and the block form's (300)
        assert {c["dim"] for c in mine} == {1, 64, 100, 300}
        assert {c["dtype"] for c in mine if c["dim"] == 300 and c["integer"]} == set(verify.DTYPES)
        assert {c["dtype"] for c in mine} == set(verify.DTYPES)
        assert {c["hash_code_len"] for c in mine} == {1, 6, 8, 12}


def test_correctness_grid_covers_the_gpu_primitives_of_the_table():
    names = verify.gpu_primitives(verify.spec_table())
    assert {"lsh_cumulation", "weighted_lsh_cumulation", "collision_cumulation", "lower_bound_gradients"} <= set(names)
    assert "lsh_cumulation_step" in names
    assert {c["primitive"] for c in verify.correctness_cases(names)} == set(names) & set(
        verify.CUMULATIONS + verify.HASHES + verify.DECODING)
    assert {c["primitive"] for c in verify._sanitizer_cases(verify.spec_table())} == set(names)


def test_correctness_grid_checks_the_triton_kernels_within_their_limits_and_both_lsh_kernels():
    cases = verify.correctness_cases(["lsh_cumulation", "lower_bound_gradients"])
    bound = [c for c in cases if c["primitive"] == "lower_bound_gradients"]
    assert max(c["hash_code_len"] for c in bound) <= 12  # the Triton sort's limit
    assert max(max(c["width"], c["weight_width"]) for c in bound) <= 128  # eq. 4's tiles hold whole rows
    assert {c["dtype"] for c in bound} == set(verify.DTYPES)
    tf32 = [c for c in bound if c.get("precision") == "tf32" and not c.get("causal")]
    assert len(tf32) == len(verify.TF32_CASES) and {c["dtype"] for c in tf32} == {"float32"}
    assert any(max(c["nq"], c["nk"]) == verify.LONG_LENGTH for c in tf32)
    causal = [c for c in bound if c.get("causal")]  # the Triton causal eq. 4 kernel
    assert len(causal) == len(verify.CAUSAL_LOWER_BOUND_CASES) and all(c["nq"] == c["nk"] for c in causal)
    assert {c["causal"] for c in causal} == {1, -1} and {c["dtype"] for c in causal} == set(verify.DTYPES)
    assert any(c.get("deterministic") for c in causal) and any(c.get("precision") == "tf32" for c in causal)
    lsh = [c for c in cases if c["primitive"] == "lsh_cumulation"]
    fallback = [c for c in lsh if c["hash_code_len"] > 12]
    assert len(fallback) == len(verify.CUDA_FALLBACK_CASES)  # past the Triton sort: its CUDA kernel runs them
    assert {c["dtype"] for c in fallback} == set(verify.DTYPES)


def test_causal_gradient_cases_split_eq_4_at_the_diagonal():
    """The references of the causal lower_bound_gradients cases: causal 1 and -1 sum the pairs j <= i and j >= i,
    so together they are causal 0's sum plus the pairs i = j once more."""
    case = verify._cumulation_case("lower_bound_gradients", 20, 20, "random", "zipf", "float32", 0, batch=2,
                                   num_hashes=4, hash_code_len=2, width=5, weight_width=6)
    x, attributes = verify.case_inputs(case, np.random.default_rng(5), None)
    sums = {}
    for direction in (1, -1, 0):
        directed = verify._causal_case(dict(case), direction) if direction else case
        assert verify.case_inputs(directed, np.random.default_rng(5), None)[1]["causal"] == direction
        sums[direction] = verify.reference_outputs(numpy_reference, "lower_bound_gradients", x,
                                                   dict(attributes, causal=direction))
    kept = (x["query_mask"] != 0) & (x["key_mask"] != 0)  # [B, N]: the pairs (i, i)
    meets = (x["query_codes"] == x["key_codes"]).mean(axis=1) * kept  # 1/m sum_h [qc_i == kc_i]
    s = meets * np.einsum("bnd,bnd->bn", np.nan_to_num(x["output_gradient"]), np.nan_to_num(x["value"]))
    diagonal = (s[..., None] * np.nan_to_num(x["key"]), s[..., None] * np.nan_to_num(x["query"]))
    assert np.abs(diagonal[0]).max() > 0
    for g in range(2):
        np.testing.assert_allclose(sums[1][g] + sums[-1][g], sums[0][g] + diagonal[g], atol=1e-10)


@pytest.mark.parametrize("name", verify.CUMULATIONS)
def test_masked_rows_hold_nan_that_the_reference_never_reads(name):
    case = verify._cumulation_case(name, 30, 40, "random", "zipf", "float32", 3, batch=2, num_hashes=4,
                                   hash_code_len=3, width=5, weight_width=6)
    inputs, attributes = verify.case_inputs(case, np.random.default_rng(0), None)
    masked_keys = inputs["key_mask"] == 0
    assert masked_keys.any() and (~masked_keys).any()
    key_rows = inputs["value"] if "value" in inputs else inputs["key"]
    assert np.isnan(key_rows[masked_keys]).all() and not np.isnan(key_rows[~masked_keys]).any()
    wants = verify.reference_outputs(numpy_reference, name, inputs, attributes)
    widths = {"lower_bound_gradients": [(30, 6), (40, 6)]}.get(name, [(30, 5)])
    assert [w.shape for w in wants] == [(2, *shape) for shape in widths]
    for want, mask in zip(wants, (inputs["query_mask"], inputs["key_mask"])):
        assert np.isfinite(want).all() and np.all(want[mask == 0] == 0)
    zero = verify._cumulation_case(name, 30, 40, "zero", "uniform", "float32", 3, batch=2)
    inputs, attributes = verify.case_inputs(zero, np.random.default_rng(1), None)
    assert all(np.all(want == 0) for want in verify.reference_outputs(numpy_reference, name, inputs, attributes))


def test_lower_bound_reference_is_the_primitives_eq_4_without_tau_over_2():
    case = verify._cumulation_case("lower_bound_gradients", 9, 11, "random", "uniform", "float32", 0, batch=2,
                                   num_hashes=3, hash_code_len=2, width=4, weight_width=5)
    inputs, attributes = verify.case_inputs(case, np.random.default_rng(2), None)
    dq, dk = verify.reference_outputs(numpy_reference, "lower_bound_gradients", inputs, attributes)
    qm, km = inputs["query_mask"] != 0, inputs["key_mask"] != 0
    q, k, v, dy = (np.nan_to_num(inputs[n]) for n in ("query", "key", "value", "output_gradient"))
    # (1/m) sum_h [qc == kc] <dY_i, V_j> K_j over kept pairs, and the same with Q_i for keys.
    c = (inputs["query_codes"][:, :, :, None] == inputs["key_codes"][:, :, None, :]).mean(1)
    weight = c * qm[:, :, None] * km[:, None, :] * np.einsum("bid,bjd->bij", dy, v)
    np.testing.assert_allclose(dq, np.einsum("bij,bjd->bid", weight, k), atol=1e-12)
    np.testing.assert_allclose(dk, np.einsum("bij,bid->bjd", weight, q), atol=1e-12)


def test_zipf_codes_are_skewed_and_use_the_top_bucket():
    codes = verify._codes(np.random.default_rng(0), "zipf", (4, 4099), 256)
    counts = np.bincount(codes.ravel(), minlength=256)
    assert counts.max() > 0.15 * codes.size and counts[255] > 0


def test_summary_decides_the_gate_from_the_timings_against_sdpa():
    n, dtype = verify.GATE_CASE
    timings = {"rows": [{"what": "attention forward+backward", "n": n, "dtype": dtype, "ms": 6.0},
                        {"what": "library attention fwd+bwd", "n": n, "dtype": dtype, "ms": 5.0},
                        {"what": "lower_bound_gradients", "n": n, "dtype": dtype, "ms": 2.5},
                        {"what": "lsh_cumulation", "n": n, "dtype": dtype, "ms": 0.5}],
               "sdpa": [{"what": "forward+backward", "n": n, "dtype": "bfloat16", "ms": 20.0}],
               "ratios": {f"{n} {dtype}": {"forward": None, "forward_backward": 0.3,
                                           "library_forward_backward": 0.25}}}
    records = {name: {"status": "ok", "seconds": 1.0, "result": {}} for name in ("load", "correctness", "rates")}
    records["load"]["result"] = {"triton_cubins": 150, "capability": "90"}
    records["timings"] = {"status": "ok", "seconds": 9.0, "result": timings}
    args = verify._parse(["--out", "unused"])
    text = verify.summary(records, 7, args)
    assert "Gate (GPU-DESIGN.md §5): PASS" in text
    assert f"| {n} | {dtype} | – | 6.000 | 5.000 |" in text and "| 0.3 | 0.25 |" in text
    assert "| lsh_cumulation | lower_bound_gradients |" in text and "| 0.500 | 2.500 |" in text
    records["correctness"]["status"] = "checks failed"
    assert "Gate (GPU-DESIGN.md §5): FAIL" in verify.summary(records, 7, args)
    records["correctness"]["status"] = "ok"
    records["load"]["result"]["triton_cubins"] = 0  # the design's kernels did not run: nothing to decide
    assert "Gate (GPU-DESIGN.md §5): not decided" in verify.summary(records, 7, args)


def test_decoding_grid_takes_every_value_of_every_axis_in_place_and_not():
    cases = [c for c in verify.correctness_cases(verify.gpu_primitives(verify.spec_table()))
             if c["primitive"] == "lsh_cumulation_step"]
    assert cases == verify._decoding_cases() and len({c["id"] for c in cases}) == len(cases)
    assert {c["nq"] for c in cases} == {c["nk"] for c in cases} == {1, 7, 300}
    assert all(c["nq"] == c["nk"] for c in cases)
    assert {c["mask"] for c in cases} == set(verify.MASKS)
    assert {c["codes"] for c in cases} == set(verify.CODE_DISTRIBUTIONS)
    for dtype in verify.DTYPES:
        typed = [c for c in cases if c["dtype"] == dtype]
        assert {c["width"] for c in typed} == {1, 64, 100}
        assert {c["hash_code_len"] for c in typed} >= {1, 6, 8, 12}
        assert {c["in_place"] for c in typed} == {True, False}
        assert {c["num_hashes"] for c in typed} >= {1, 4, 32}
    for length in (1, 7, 300):
        assert {c["num_hashes"] for c in cases if c["nq"] == length} >= {1, 4, 32}
    assert [c["hash_code_len"] for c in cases if c["hash_code_len"] > 12] == [verify.DECODING_LONG_CODE_LEN]
    assert max(c["batch"] * c["num_hashes"] * 2 ** c["hash_code_len"] * c["width"] for c in cases) <= (
        verify.DECODING_TABLE_FLOATS)


@pytest.mark.parametrize("mask", verify.MASKS)
def test_decoding_reference_reads_the_old_tables_and_the_earlier_keys_of_the_chunk(mask):
    case = verify._decoding_case(23, mask, "zipf", "float32", batch=3, num_hashes=4, hash_code_len=3, width=5,
                                 in_place=True)
    x, attributes = verify.case_inputs(case, np.random.default_rng(4), None)
    assert attributes == {} and x["tables"].shape == (3, 4, 8, 5)
    masked = x["key_mask"] == 0
    assert np.isnan(x["value"][masked]).all() and not np.isnan(x["value"][~masked]).any()
    out, tables_out = verify.reference_outputs(numpy_reference, "lsh_cumulation_step", x, attributes)
    assert np.isfinite(out).all() and np.isfinite(tables_out).all()
    b, h, t = np.meshgrid(*(np.arange(n) for n in x["query_codes"].shape), indexing="ij")
    # the tables gain every kept key's value in its bucket
    grown, keys = x["tables"].astype(np.float64), x["key_mask"][b, t] != 0
    np.add.at(grown, (b[keys], h[keys], x["key_codes"][keys]), x["value"][b[keys], t[keys]])
    np.testing.assert_allclose(tables_out, grown, atol=1e-12)
    # the old tables read by query code, plus eq. 2 over the chunk's keys s <= t (causal)
    kept = (x["query_mask"] != 0)[:, :, None]
    old = x["tables"][b, h, x["query_codes"]].mean(axis=1) * kept
    chunk = numpy_reference.lsh_cumulation(x["query_codes"], x["key_codes"], x["value"], x["query_mask"],
                                           x["key_mask"], causal=1)
    np.testing.assert_allclose(out, old + chunk, atol=1e-12)
    if mask == "zero":
        assert np.all(out == 0) and np.array_equal(tables_out, x["tables"])


def _launched_step(wants, in_place, error=0.0, tables_error=0.0, inputs_kept=True, repeat_equal=True):
    case = verify._decoding_case(7, "random", "uniform", "bfloat16", batch=2, num_hashes=4, hash_code_len=3,
                                 width=5, in_place=in_place)
    outputs = [wants[0] + error, wants[1] + tables_error]
    return {"case": case, "inputs": {}, "attributes": {}, "must_repeat": True, "messages": {}, "path": "triton",
            "path_detail": ["decode_outputs_kernel_bf16"], "output_names": ["output", "tables_out"],
            "output_dtypes": ["bfloat16", "float32"], "inputs_kept": {"torch_op": inputs_kept},
            "repeat_equal": repeat_equal, "op_equal": True,
            "outputs": {run: outputs for run in ("call_device", "call_device_again", "torch_op")}}


def test_decoding_rows_hold_each_output_to_its_own_dtypes_bound(monkeypatch):
    wants = [np.full((2, 7, 5), 2.0), np.full((2, 4, 8, 5), 3.0)]
    monkeypatch.setattr(verify, "reference_outputs", lambda *unused: wants)
    row = verify._checked_case(numpy_reference, _launched_step(wants, True, error=0.03, tables_error=2e-4))
    assert row["verdict"] == "pass" and row["in_place"] is True  # bf16 out: 1.6e-2 x 2; tables: 1e-4 x 3
    row = verify._checked_case(numpy_reference, _launched_step(wants, False, tables_error=5e-4))
    assert row["verdict"] == "fail"  # float32 tables_out: no TF32 allowance
    assert set(row["failing_paths"]) == {f"{run} tables_out" for run in ("call_device", "call_device_again",
                                                                            "torch_op")}
    row = verify._checked_case(numpy_reference, _launched_step(wants, False, repeat_equal=False))
    assert row["verdict"] == "fail" and "bitwise equal" in row["failing_repeat"]


def test_an_out_of_place_step_that_changes_its_input_tables_fails(monkeypatch):
    wants = [np.zeros((2, 7, 5)), np.zeros((2, 4, 8, 5))]
    monkeypatch.setattr(verify, "reference_outputs", lambda *unused: wants)
    row = verify._checked_case(numpy_reference, _launched_step(wants, False, inputs_kept=False))
    assert row["verdict"] == "fail" and "torch_op" in row["failing_inputs"]


def test_summary_shows_the_decoding_step_timings():
    rows = [{"what": what, "length": length, "dtype": dtype, "ms": ms}
            for what, base in (("in place (ky_run_device)", 0.01), ("torch.ops.keras_yoso (copies the tables)", 0.05))
            for length, dtype, ms in ((1, "bfloat16", base), (256, "bfloat16", 2 * base), (1, "float32", 3 * base))]
    records = {"timings": {"status": "ok", "seconds": 9.0, "result": {"decoding": rows}}}
    text = verify.summary(records, 7, verify._parse(["--out", "unused"]))
    assert "float32 tables of 64 MiB" in text
    assert "| T | dtype | in place (ky_run_device) | torch.ops.keras_yoso (copies the tables) |" in text
    assert "| 1 | bfloat16 | 0.010 | 0.050 |" in text and "| 256 | bfloat16 | 0.020 | 0.100 |" in text
    assert "decoding step in place, bfloat16: T 1 0.010 ms, T 256 0.020 ms" in text


# ---------------------------------------------------------------------------
# The decoding step's GPU code paths rehearsed on the CPU.

class _Event:
    """torch.cuda.Event on the host clock."""

    def __init__(self, enable_timing=False):
        self.at = None

    def record(self):
        self.at = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return (other.at - self.at) * 1e3


class _CudaOnCpu:
    """torch as verify.py's GPU stages use it, with "cuda" on the CPU: factories given device="cuda" make CPU
    tensors, torch.cuda is a set of no-ops on a GPU of compute capability 9.0 (Tensor.cuda is patched apart)."""

    FACTORIES = ("full", "empty", "randn", "randint", "ones", "zeros", "as_tensor")

    def __init__(self, torch):
        self._torch = torch
        self.cuda = types.SimpleNamespace(
            is_available=lambda: True, synchronize=lambda: None, empty_cache=lambda: None, Event=_Event,
            get_device_capability=lambda: (9, 0), current_stream=lambda: types.SimpleNamespace(cuda_stream=0),
            reset_peak_memory_stats=lambda: None, memory_allocated=lambda: 0, max_memory_allocated=lambda: 0)

    def __getattr__(self, name):
        value = getattr(self._torch, name)
        if name not in self.FACTORIES:
            return value

        def on_cpu(*args, **kwargs):
            if kwargs.get("device") == "cuda":
                kwargs["device"] = "cpu"
            return value(*args, **kwargs)

        return on_cpu


@pytest.fixture
def cuda_on_cpu(monkeypatch):
    """(torch, native): the fake CUDA torch and a native library whose ky_run_device is the CPU kernels' ky_run
    (every call's pointers recorded in native.calls), with the library's own workspace sizes and launch plans."""
    torch = pytest.importorskip("torch")
    from keras_yoso.ops.providers import native_library
    if native_library.library() is None:
        pytest.skip(f"the native library does not load: {native_library.load_error()}")
    import keras_yoso.ops.providers.torch  # noqa: F401 (registers torch.ops.keras_yoso)
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *args, **kwargs: self)
    calls = []

    def call_device(name, inputs, attributes, outputs, workspace, workspace_bytes, stream):
        calls.append({"name": name, "inputs": [v.data for v in inputs], "outputs": [v.data for v in outputs]})
        native_library.call(name, inputs, attributes, outputs)

    def device_workspace_bytes(name, inputs, attributes):
        """The library's own size, or, where this build has no GPU kernel of `name` (no Triton cubins, or no
        CUDA kernels at all), the Triton plan's workspace and the code counter: the CPU kernels ignore it."""
        try:
            return native_library.device_workspace_bytes(name, inputs, attributes)
        except (ValueError, RuntimeError):
            return 256 + native_library.device_launch_plan(name, inputs, attributes, 90)["workspace_bytes"]

    native = types.SimpleNamespace(
        tensor_view=native_library.tensor_view, device_workspace_bytes=device_workspace_bytes,
        device_launch_plan=native_library.device_launch_plan, triton_cubins=lambda: 150,
        has_device_kernel=lambda name: name == "lsh_cumulation_step", call_device=call_device, calls=calls)
    return _CudaOnCpu(torch), native


def _facts():
    return {"triton_cubins": 150, "capability": "90", "triton_arch": 90}


@pytest.mark.parametrize("in_place", [True, False])
def test_rehearsed_step_cases_pass_in_place_and_into_a_separate_tables_out(cuda_on_cpu, in_place):
    torch, native = cuda_on_cpu
    spec = verify.spec_table()
    for dtype, length, tau in (("float32", 7, 6), ("bfloat16", 300, verify.DECODING_LONG_CODE_LEN)):
        case = verify._decoding_case(length, "random", "zipf", dtype, batch=2, num_hashes=2, hash_code_len=tau,
                                     width=64, in_place=in_place)
        native.calls.clear()
        launched = verify._launch_case(torch, native, spec, None, case, 5, _facts())
        assert launched["path"] == "triton" and not launched["messages"]
        assert len(native.calls) == 2
        for call in native.calls:  # tables (input 5) is tables_out (output 1) in place only
            assert (call["outputs"][1] == call["inputs"][5]) is in_place
        assert set(launched["inputs_kept"]) == ({"torch_op"} if in_place else
                                                {"call_device", "call_device_again", "torch_op"})
        row = verify._checked_case(numpy_reference, launched)
        assert row["verdict"] == "pass", row
        assert row["repeat_equal"] and row["op_equal"] and row["in_place"] is in_place


def test_rehearsed_step_runs_twice_bitwise_equal_in_place_from_the_same_tables(cuda_on_cpu, monkeypatch):
    torch, native = cuda_on_cpu
    monkeypatch.setitem(verify.REPRODUCIBLE_STEP_CASE, "length", 300)
    found = verify._reproducibility(torch, native, verify.spec_table(), _facts(), 3)
    assert set(found) == {"lsh_cumulation_step"}
    step = found["lsh_cumulation_step"]
    assert step["path"] == "triton" and step["required"] and step["bitwise_equal"] and step["length"] == 300
    assert all(call["outputs"][1] == call["inputs"][5] for call in native.calls)


def test_rehearsed_tiny_step_launch_matches_float64(cuda_on_cpu):
    torch, native = cuda_on_cpu
    tiny = verify._tiny_launch(torch, native, verify.spec_table(), "lsh_cumulation_step", 1, _facts())
    assert tiny["verdict"] == "pass" and tiny["path"] == "triton"


def test_rehearsed_step_timings_give_a_row_per_way_length_and_dtype(cuda_on_cpu, monkeypatch, tmp_path):
    torch, native = cuda_on_cpu
    monkeypatch.setattr(verify, "TIMING_SHAPE", {"batch_heads": 2, "dim": 8, "num_hashes": 4, "hash_code_len": 3})
    rec = verify.WorkerRecord(str(tmp_path / "record.json"), 60, 1, False)
    rows = verify._time_decoding_step(rec, torch, native)
    assert [(r["length"], r["dtype"]) for r in rows[::2]] == [(t, d) for t in verify.DECODING_TIMING_LENGTHS
                                                               for d in verify.TIMING_DTYPES]
    assert all(r["repeats"] >= 10 and r["ms"] > 0 for r in rows) and rec.checks["failed"] == 0
    in_place = [c for c in native.calls if c["outputs"][1] == c["inputs"][5]]
    assert len(in_place) == len(native.calls) > 0  # the torch op's calls run through torch.ops, not ky_run_device


def test_rehearsed_timing_launches_time_the_causal_kernels_where_the_triton_kernels_run(cuda_on_cpu, monkeypatch):
    torch, _ = cuda_on_cpu
    monkeypatch.setattr(verify, "TIMING_SHAPE", {"batch_heads": 2, "dim": 8, "num_hashes": 4, "hash_code_len": 3})
    built = ["lsh_cumulation", "lower_bound_gradients"]
    library, _ = verify._timing_launches(torch, 16, "float32", built, causal=True)
    assert {"lsh_cumulation causal", "lower_bound_gradients causal", "library causal yoso fwd+bwd",
            "library yoso fwd+bwd zipf"} <= set(library)
    for launch in library.values():  # torch.ops.keras_yoso on CPU tensors: each launch's arguments are valid
        launch()
    without, _ = verify._timing_launches(torch, 16, "float32", built, causal=False)
    assert not [name for name in without if "causal" in name]
    assert {"lsh_cumulation causal", "lower_bound_gradients causal"} <= set(verify.TIMED_KERNELS)


def test_the_ratios_to_sdpa_come_from_the_rows_of_a_timings_stage_cut_at_its_limit():
    """A stage killed at its limit leaves its rows and no "ratios" (2026-11-29 on an H200): the summary and the
    gate compute them from the rows."""
    n, dtype = verify.GATE_CASE
    timings = {"rows": [{"what": "attention forward+backward", "n": n, "dtype": dtype, "ms": 40.0},
                        {"what": "library attention fwd+bwd", "n": n, "dtype": dtype, "ms": 39.0}],
               "sdpa": [{"what": "forward+backward", "n": n, "ms": 26.0}, {"what": "setup", "n": 65536,
                                                                            "error": "no flash kernel"}]}
    ratios = verify.timing_ratios(timings)[f"{n} {dtype}"]
    assert ratios["forward_backward"] == pytest.approx(40 / 26) and ratios["forward"] is None
    records = {name: {"status": "ok", "seconds": 1.0, "result": {}} for name in ("load", "correctness", "rates")}
    records["load"]["result"] = {"triton_cubins": 150, "capability": "90"}
    records["timings"] = {"status": "timeout", "seconds": 120.0, "result": timings}
    text = verify.summary(records, 7, verify._parse(["--out", "unused"]))
    assert "Gate (GPU-DESIGN.md §5): FAIL" in text and f"= {40 / 26:.3g} (<= " in text


def test_the_train_step_stage_trains_its_encoder_classifier_at_a_tiny_size_on_this_backend():
    """The model and the timing of stage train_step (examples/convert_pretrained.py's training step), here on
    the CPU at a tiny size, with YOSO and with MultiHeadAttention: both train (finite loss, timed repeats)."""
    shape = dict(verify.TRAIN_STEP, layers=1, width=16, heads=2, ffn=32, vocabulary=50, length=24, batch=3,
                 num_hashes=4)

    class Budget:
        def remaining(self):
            return 60.0

    for attention in ("yoso", "mha"):
        model = verify.encoder_classifier(attention, shape)
        measured = verify.time_train_steps(model, shape, Budget(), repeats=2)
        assert measured["repeats"] == 2 and measured["ms"] > 0 and math.isfinite(measured["loss"]), attention
    assert (verify.TRAIN_STEP["layers"], verify.TRAIN_STEP["width"], verify.TRAIN_STEP["length"]) == (6, 384, 2048)
    text = verify._headline_train_step({"shape": verify.TRAIN_STEP, "yoso": {"ms": 820.0, "mib": 1500.0},
                                        "mha": {"error": "OOM"}})
    assert "yoso: 820 ms a step, 1,500 MiB" in text and "mha: – ms a step (OOM)" in text and "under 1,000 ms" in text


@runs_on("jax")
def test_the_train_step_memory_is_quadratic_in_the_length_for_mha_and_about_linear_for_yoso():
    """train_step_memory_mib (stage train_step's memory: XLA's temporaries of the compiled train_step) on the CPU,
    tiny models at 128 and 512 tokens: MultiHeadAttention's [B, H, n, n] scores and their gradients grow 16x, so
    its step's memory grows far more than 4x; YOSO's activations 4x and its tables not at all (measured
    2026-12-03: MultiHeadAttention 2.2 -> 33.0 MiB, 15x; YOSO 0.83 -> 3.24 MiB, 3.9x)."""
    grown = {}
    for attention in ("yoso", "mha"):
        mib = []
        for length in (128, 512):
            shape = dict(verify.TRAIN_STEP, layers=1, width=32, heads=4, ffn=32, vocabulary=50, length=length,
                         batch=2, num_hashes=4)
            model = verify.encoder_classifier(attention, shape)
            model.train_on_batch(*verify.train_batch(shape))
            mib.append(verify.train_step_memory_mib(model, shape))
        assert min(mib) > 0, (attention, mib)
        grown[attention] = mib[1] / mib[0]
    assert grown["mha"] > 8 and grown["yoso"] < 5, grown


class _Budget:
    def remaining(self):
        return 60.0


@runs_on("torch")
def test_the_torch_layer_timing_times_fwd_bwd_and_reports_the_peak_above_what_was_allocated_before(cuda_on_cpu,
                                                                                                    monkeypatch):
    torch, _ = cuda_on_cpu
    import keras
    monkeypatch.setattr(verify, "LAYER_TIMING", dict(verify.LAYER_TIMING, num_heads=2, key_dim=8))
    torch.cuda.memory_allocated, torch.cuda.max_memory_allocated = lambda: 3 * 2 ** 20, lambda: 10 * 2 ** 20
    measured = verify.time_torch_layer(torch, keras.layers.MultiHeadAttention(num_heads=2, key_dim=8), 32, _Budget())
    assert measured["mib"] == 7.0 and measured["ms"] > 0 and measured["repeats"] > 0, measured


@pytest.mark.other_backends
@runs_on("tensorflow")  # the program starts JAX itself: once, on CI's TensorFlow side
def test_the_jax_layer_timing_measures_memory_quadratic_in_the_length_for_mha_and_linear_for_yoso(tmp_path):
    """_layer_timings with time_jax_layer on the CPU at 256 and 1,024 tokens (XLA's temporary buffers of the
    compiled forward+backward): MultiHeadAttention's [n, n] scores grow 16x, YOSO's buffers 4x plus its tables."""
    table = json.loads(run_program("verify_layer_memory", cwd=tmp_path, backend="jax").splitlines()[-1])
    short, long = table["256"], table["1024"]
    for row in (short, long):
        assert all(row[f"{key}_{unit}"] > 0 for key in ("yoso", "mha") for unit in ("ms", "mib")), row
    assert long["mha_mib"] / short["mha_mib"] > 10, table
    assert long["yoso_mib"] / short["yoso_mib"] < 5, table
    text = verify._headline_smoke({"layer_timings": {"8192": {"yoso_ms": 12.0, "yoso_mib": 300.0, "mha_ms": 20.0,
                                                              "mha_mib": 2100.0}}})
    assert "8192 tokens fwd+bwd: YOSO 12.0 ms 300 MiB, MHA 20.0 ms 2,100 MiB" in text


def test_kernel_profile_sums_each_gpu_kernel_per_call_heaviest_first_and_leaves_host_events_out():
    events = [("segment_scatter_kernel", True, 300.0), ("aten::mul_", False, 50.0), ("k6_tables", True, 2000.0),
              ("segment_scatter_kernel", True, 500.0), ("k6_tables", True, 2200.0), ("void at::vectorized", True, 10.0)]
    rows = verify.kernel_profile(events, repeats=2)
    assert [row["kernel"] for row in rows] == ["k6_tables", "segment_scatter_kernel", "void at::vectorized"]
    assert rows[0] == {"kernel": "k6_tables", "launches": 1.0, "ms": pytest.approx(2.1)}
    assert rows[1]["ms"] == pytest.approx(0.4) and rows[2]["launches"] == 0.5


def test_rehearsed_profile_stage_runs_the_attention_launch_under_the_profiler(cuda_on_cpu, monkeypatch, tmp_path):
    """On the CPU the profiler records no GPU kernel, which is not a failure there (its activities say why); the
    stage runs the timings stage's launch, records the case and the wall time, and its headline says so."""
    torch, _ = cuda_on_cpu
    monkeypatch.setattr(verify, "TIMING_SHAPE", {"batch_heads": 2, "dim": 8, "num_hashes": 4, "hash_code_len": 3})
    monkeypatch.setattr(verify, "PROFILE_CASE", (16, "float32"))
    monkeypatch.setattr(verify, "_cuda_torch", lambda: torch)
    monkeypatch.setattr(verify, "_has_device_kernel", lambda native, name: True)
    rec = verify.WorkerRecord(str(tmp_path / "record.json"), 60, 1, False)
    verify.stage_profile(rec)
    result = rec.result
    assert result["case"]["what"] == verify.PROFILE_ROW and result["case"]["n"] == 16
    assert result["kernels"] == [] and result["wall_ms"] > 0 and rec.checks["failed"] == 0
    assert "no GPU kernel recorded" in verify._headline_profile(result)
    result["kernels"] = [{"kernel": "lower_bound_tables_kernel", "launches": 1.0, "ms": 9.5}]
    result["kernel_ms"] = 9.5
    assert "1 kernels, 9.50 ms of GPU time per call" in verify._headline_profile(result)
