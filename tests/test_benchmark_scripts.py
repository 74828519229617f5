"""Every benchmark script runs end to end at tiny sizes and writes its JSON and PNG.

Each script runs in a subprocess from the repository root with `--out-dir` set to a
temporary directory, as a user would run it.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import BACKEND
from conftest import requires_custom_ops
from conftest import requires_tensorflow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(script, out_dir, *args, timeout=300):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", MPLBACKEND="Agg")
    return subprocess.run([sys.executable, os.path.join("benchmarks", script), "--out-dir", str(out_dir), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)


def _assert_wrote(proc, out_dir, *names):
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    for name in names:
        path = out_dir / name
        assert path.is_file() and path.stat().st_size > 0, f"{name} was not written; stdout:\n{proc.stdout[-3000:]}"


def _cuda_gpu_available():
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # any failure to reach the driver means no usable GPU here
        return False


def test_attention_scaling_quick_writes_json_and_png(tmp_path):
    proc = _run("attention_scaling.py", tmp_path, "--quick")
    _assert_wrote(proc, tmp_path, "scaling.json", "scaling.png")


@pytest.mark.slow  # ~30 s on 2 cores: 8 fresh TensorFlow processes
def test_linear_relative_op_quick_writes_json_and_png(tmp_path):
    proc = _run("linear_relative_op.py", tmp_path, "--quick")
    _assert_wrote(proc, tmp_path, "linear_relative_op.json", "linear_relative_op.png")


def test_ops_timing_at_tiny_sizes_writes_json_and_png(tmp_path):
    proc = _run("ops_timing.py", tmp_path, "--length", "64", "--batch", "1", "--repeats", "1", "--num-hashes", "4",
                "--value-dim", "8")
    _assert_wrote(proc, tmp_path, "ops_timing.json", "ops_timing.png")


def test_approximation_error_quick_writes_results_figures_and_cache(tmp_path):
    proc = _run("approximation_error.py", tmp_path, "--quick")
    _assert_wrote(proc, tmp_path, "approximation_error.json", "approximation_error.png",
                  "approximation_error_attention.png", "approximation_error_gradients.png",
                  "approximation_error_qkv.npz")
    with open(tmp_path / "approximation_error.json") as f:
        result = json.load(f)
    # --quick: 2 settings x 1 hash method x 2 values of m x 3 lengths.
    assert len(result["angles"]) == 12
    assert all(0.0 <= r["mean_angle_deg"] <= 180.0 for r in result["angles"])
    # 2 settings x 1 value of m x 2 estimators x (dQ, dK).
    assert len(result["gradients"]) == 8

    rerun = _run("approximation_error.py", tmp_path, "--quick")
    _assert_wrote(rerun, tmp_path, "approximation_error.json")
    assert "using the cached Q, K, V" in rerun.stdout


@pytest.mark.skipif(_cuda_gpu_available(), reason="a CUDA GPU is present: test_gpu_kernels_quick_on_gpu runs instead")
def test_gpu_kernels_without_gpu_exits_with_a_clear_message(tmp_path):
    proc = _run("gpu_kernels.py", tmp_path, "--quick", timeout=120)
    assert proc.returncode != 0
    message = proc.stderr.lower()
    assert "cupy" in message or "no cuda gpu" in message, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "gpu_kernels.json").exists()


@pytest.mark.slow
@pytest.mark.skipif(not _cuda_gpu_available(), reason="needs CuPy and a CUDA GPU")
def test_gpu_kernels_quick_on_gpu(tmp_path):
    proc = _run("gpu_kernels.py", tmp_path, "--quick", timeout=900)
    _assert_wrote(proc, tmp_path, "gpu_kernels.json", "gpu_kernels.png")


@requires_tensorflow
def test_serving_latency_quick_serves_both_exports_and_writes_json_and_png(tmp_path):
    proc = _run("serving_latency.py", tmp_path, "--quick")
    _assert_wrote(proc, tmp_path, "serving_latency.json", "serving_latency.png")
    with open(tmp_path / "serving_latency.json", encoding="utf-8") as f:
        rows = {row["export"]: row for row in json.load(f)["rows"]}
    assert rows["portable"]["keras_yoso_imported"] is False and rows["custom_op"]["keras_yoso_imported"] is True


@requires_tensorflow
def test_layer_profile_at_a_tiny_length_prints_every_part_and_writes_png(tmp_path):
    proc = _run("layer_profile.py", tmp_path, "--length", "64", "--repeats", "1")
    _assert_wrote(proc, tmp_path, "layer_profile.png")
    for part in ("YosoAttention fwd+bwd", "MultiHeadAttention fwd+bwd", "eq. 4 dQ and dK", "one weighted_lsh_cumulation"):
        assert part in proc.stdout, proc.stdout


@pytest.mark.slow  # 10-50 s on 2 cores: 12 rows, each compiled for a prefill and a one-token step
def test_decoding_quick_writes_json_and_png_with_constant_states(tmp_path):
    proc = _run("decoding.py", tmp_path, "--quick")  # on this suite's backend: it inherits KERAS_BACKEND
    _assert_wrote(proc, tmp_path, f"decoding_{BACKEND}.json", f"decoding_{BACKEND}.png")
    with open(tmp_path / f"decoding_{BACKEND}.json", encoding="utf-8") as f:
        rows = json.load(f)["rows"]
    sizes = {}
    for row in rows:
        sizes.setdefault((row["part"], row["attention"]), set()).add(row["state_bytes"])
    every = {(part, attention) for part in ("layer", "model") for attention in ("yoso", "linear_relative", "softmax")}
    assert every <= set(sizes), sorted(sizes)
    # --quick: 2 contexts; constant states for YOSO and LinearRelative, a growing softmax cache whose
    # longer one is filled directly (not prefilled).
    assert all(len(sizes[(part, a)]) == 1 for part in ("layer", "model") for a in ("yoso", "linear_relative"))
    assert all(len(sizes[(part, "softmax")]) == 2 for part in ("layer", "model"))
    assert [r["fill"] for r in rows if r["attention"] == "softmax"].count("direct") == 2


def test_causal_yoso_at_tiny_lengths_prints_ratios_and_writes_json_and_png(tmp_path):
    proc = _run("causal_yoso.py", tmp_path, "--lengths", "64", "--repeats", "1")
    _assert_wrote(proc, tmp_path, "causal_yoso.json", "causal_yoso.png")
    assert "causal/bidir" in proc.stdout


def test_isolated_runs_report_json_out_of_memory_failure_and_timeout_and_start_in_an_empty_directory(tmp_path):
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    try:
        import isolated_run
    finally:
        sys.path.pop(0)
    script = tmp_path / "child.py"
    script.write_text("import json, os, sys\n"
                      "if sys.argv[1] == 'ok': print(json.dumps({'cwd': os.listdir('.'), 'x': os.environ['X']}))\n"
                      "if sys.argv[1] == 'oom': raise MemoryError('no room')\n"
                      "if sys.argv[1] == 'fail': sys.exit('line one\\nline two')\n"
                      "if sys.argv[1] == 'sleep': import time; time.sleep(30)\n")
    ok = isolated_run.run_isolated_script(str(script), ["ok"], 60, {"X": "set"})
    assert ok["status"] == "ok" and ok["cwd"] == [] and ok["x"] == "set" and ok["wall_s"] > 0, ok
    assert isolated_run.run_isolated_script(str(script), ["oom"], 60) == {"status": "out of memory"}
    failed = isolated_run.run_isolated_script(str(script), ["fail"], 60)["status"]
    assert failed == "failed (exit 1): line one | line two", failed
    assert isolated_run.run_isolated_script(str(script), ["sleep"], 1) == {"status": "timeout (> 1 s)"}
    code = isolated_run.run_isolated("import json, sys; print(json.dumps({'argv': sys.argv[1:]}))", [3, "a"], 60)
    assert code["argv"] == ["3", "a"] and code["status"] == "ok", code


def test_sequence_parallel_scale_simulation_keeps_yoso_bytes_independent_of_length(tmp_path):
    proc = _run("sequence_parallel_scale.py", tmp_path)
    _assert_wrote(proc, tmp_path, "sequence_parallel_scale.json", "sequence_parallel_scale.png")
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    try:
        import sequence_parallel_scale as scale
    finally:
        sys.path.pop(0)
    short, long = (scale.per_layer_bytes("yoso", n, 8) for n in (2 ** 16, 2 ** 20))
    assert short["wire_bytes"] == long["wire_bytes"] > 0
    ring = [scale.per_layer_bytes("ring_softmax", n, 8)["wire_bytes"] for n in (2 ** 16, 2 ** 20)]
    assert ring[1] == 16 * ring[0]


@pytest.mark.slow  # ~50 s on 2 cores: 8 virtual JAX devices, several compiles
def test_sequence_parallel_measurement_quick_matches_the_formulas(tmp_path):
    proc = _run("sequence_parallel.py", tmp_path, "--quick", timeout=600)
    _assert_wrote(proc, tmp_path, "sequence_parallel.json", "sequence_parallel.png")
    verdicts = json.loads((tmp_path / "sequence_parallel.json").read_text())["verdicts"]
    assert verdicts["communication_independent_of_length"] == "MET" and verdicts["formula_agrees"], verdicts
    assert verdicts["custom_calls_per_shard"], verdicts


def test_busy_machine_quick_times_the_layer_and_mha_quiet_and_loaded_and_writes_json_and_png(tmp_path):
    proc = _run("busy_machine.py", tmp_path, "--quick", "--backends", BACKEND)
    _assert_wrote(proc, tmp_path, "busy_machine.json", "busy_machine.png")
    rows = json.loads((tmp_path / "busy_machine.json").read_text())["rows"]
    assert [(r["backend"], r["variant"], r["workload"]) for r in rows] == [
        (BACKEND, "default", "layer fwd+bwd"), (BACKEND, "default", "MHA fwd+bwd")]
    for row in rows:
        assert row["quiet"]["status"] == row["loaded"]["status"] == "ok", row
        assert row["quiet"]["seconds"] > 0 and row["loaded"]["seconds"] > 0


def test_hash_fidelity_at_tiny_sizes_prints_every_method_and_writes_json_and_png(tmp_path):
    proc = _run("hash_fidelity.py", tmp_path, "--dims", "16", "--taus", "8", "--draws", "2", "--pairs", "16",
                "--length", "64", "--layer-length", "32", "--repeats", "1")
    _assert_wrote(proc, tmp_path, "hash_fidelity.json", "hash_fidelity.png")
    for method in ("hadamard ", "hadamard_interleaved ", "gaussian "):
        assert method in proc.stdout, proc.stdout
    assert "interleaved / hadamard" in proc.stdout


def test_gpu_triton_kernels_dry_run_times_every_part_and_writes_its_record(tmp_path):
    """The GPU timing script of the bucket-sorted Triton kernels, on tiny shapes under Triton's
    interpreter (its GPU run is recorded in docs/data/gpu_2026-11-28)."""
    for package in ("torch", "triton"):  # found, not imported: Triton aborts a process that holds TensorFlow
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} is not installed")
    proc = _run("gpu_triton_kernels.py", tmp_path, "--dry-run", timeout=300)
    _assert_wrote(proc, tmp_path, "gpu_triton_kernels.json", "gpu_triton_kernels.png")
    records = json.loads((tmp_path / "gpu_triton_kernels.json").read_text())["records"]
    assert records and all("error" not in r for r in records), records
    assert all(set(r["ms"]) == {"forward", "dV", "eq4 dQ,dK", "fwd+bwd"} for r in records)
    assert "| 48 | bfloat16 | uniform |" in proc.stdout


def _run_gpu_report(*argv):
    """benchmarks/gpu_report.py ARGV in a fresh process from the repository root: the CompletedProcess."""
    return subprocess.run([sys.executable, os.path.join("benchmarks", "gpu_report.py"), *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def _gpu_report(folder):
    proc = _run_gpu_report(os.path.join("docs", "data", folder))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_gpu_report_renders_the_rows_a_later_verify_run_adds(tmp_path):
    """verify.py's zipf row (the target "Zipf-skewed codes at most 2x uniform"), stage train_step, stage profile and
    the layer's and the training step's memory, absent from 2026-11-29's records, get their column and table once
    a run records them."""
    folder = os.path.join(REPO, "docs", "data", "gpu_2026-11-29")
    for name in ("correctness.json", "rates.json", "smoke.json", "timings.json"):
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            record = json.load(f)
        if name == "smoke.json":
            for stage, (yoso, mha) in (("smoke_jax", (150.0, 2500.0)), ("smoke_torch", (170.0, 3000.0))):
                result = record[stage]["result"]
                result["layer_memory"] = f"{stage}'s measure"
                for length, scale in (("8192", 1), ("16384", 2)):
                    result["layer_timings"][length].update(yoso_mib=yoso * scale, mha_mib=mha * scale ** 2)
            record["train_step"] = {"status": "ok", "result": {
                "shape": {"layers": 6, "width": 384, "heads": 12, "batch": 16, "length": 2048},
                "memory": "train_step's measure", "yoso": {"ms": 812.0, "first_call_s": 14.2, "mib": 1234.0},
                "mha": {"error": "out of memory"}}}
        if name == "timings.json":
            record["timings"]["result"]["rows"].append(
                {"what": "library yoso fwd+bwd zipf", "n": 16384, "dtype": "bfloat16", "ms": 26.0})
            kernels = [{"kernel": f"kernel_{i}", "launches": 2.0, "ms": 1.0} for i in range(13)]
            record["profile"] = {"status": "ok", "result": {
                "case": {"what": "library attention fwd+bwd", "n": 16384, "dtype": "bfloat16", "repeats": 5,
                         "batch_heads": 32, "dim": 64, "num_hashes": 32, "hash_code_len": 8},
                "kernels": [{"kernel": "lower_bound_tables_kernel", "launches": 1.0, "ms": 7.0}] + kernels,
                "kernel_ms": 20.0, "wall_ms": 21.5}}
        (tmp_path / name).write_text(json.dumps(record))
    proc = _run_gpu_report(str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| 0.95 | 1.50 | 26.00 |" in proc.stdout and "| YOSO fwd+bwd, Zipf codes |" in proc.stdout
    assert "| YOSO (m = 32) | 812 | 14.2 | 1,234 |" in proc.stdout and "Memory: train_step's measure." in proc.stdout
    assert "| YOSO, MiB | MultiHeadAttention, MiB |" in proc.stdout
    assert "| 150 / 300 | 2,500 / 10,000 |" in proc.stdout and "| 170 / 340 | 3,000 / 12,000 |" in proc.stdout
    assert "Memory: jax, smoke_jax's measure; torch, smoke_torch's measure." in proc.stdout
    assert "| MultiHeadAttention | out of memory | – | – |" in proc.stdout
    assert "### Where one attention forward+backward's GPU time goes" in proc.stdout
    assert "20.00 ms in 14 kernels" in proc.stdout
    assert "| `lower_bound_tables_kernel` | 1 | 7.000 | 35% |" in proc.stdout
    assert "| 2 others | 4 | 2.000 | 10% |" in proc.stdout


def test_gpu_report_refuses_a_folder_without_records_and_prints_its_usage_on_help(tmp_path):
    assert "python3 benchmarks/gpu_report.py docs/data/gpu_" in _run_gpu_report("--help").stdout
    for argv, message in (([str(tmp_path)], f"{tmp_path} holds none of a GPU run's records (correctness.json"),
                          ([str(tmp_path / "absent")], "give one folder of a GPU run's records"),
                          ([str(tmp_path), str(tmp_path)], "give one folder of a GPU run's records")):
        proc = _run_gpu_report(*argv)
        assert proc.returncode != 0 and message in proc.stderr, (argv, proc.stderr)


def test_gpu_report_renders_the_recorded_gpu_runs():
    """2026-11-28: the CUDA kernels through torch.ops and the Triton kernels timed on their own; 2026-11-29: the
    Triton kernels inside the package (verify.py's timings, a stage cut at its limit), no separate timing run;
    2026-11-30: the same with every stage within its limit."""
    first = _gpu_report("gpu_2026-11-28")
    for title in ("Correctness of the GPU kernels", "The layer on JAX and PyTorch", "Triton kernels against SDPA",
                  "Rates"):
        assert title in first
    assert "| 16,384 | bfloat16 | uniform |" in first
    second = _gpu_report("gpu_2026-11-29")
    assert "The kernels inside the package against SDPA flash" in second and "Triton kernels against" not in second
    assert "Zipf codes" not in second and "A training step" not in second
    # n, dtype, forward, eq. 4, one hash, YOSO fwd+bwd, attention fwd+bwd: the records' medians
    assert "| 16,384 | bfloat16 | 4.45 | 16.98 | 7.78 | 25.16 | 39.94 |" in second
    assert "the stage's status: timeout" in second and "- error: `lower_bound_gradients-" in second
    with open(os.path.join(REPO, "docs", "gpu.md"), encoding="utf-8") as f:
        gpu_md = f.read()
    assert second.strip() in gpu_md, "docs/gpu.md quotes gpu_report.py docs/data/gpu_2026-11-29 verbatim"
    # 2026-11-30: the Hadamard hash's row form (one hash 7.78 -> 1.44 ms at 16K bf16), the Zipf row, train_step
    third = _gpu_report("gpu_2026-11-30")
    assert "| 16,384 | bfloat16 | 4.35 | 17.05 | 1.44 | 25.14 | 27.79 |" in third
    assert "| YOSO fwd+bwd, Zipf codes |" in third and "| YOSO (m = 32) | 157 | 14.4 |" in third
    assert "the stage's status: ok" in third and "- error:" not in third
    assert third.strip() in gpu_md, "docs/gpu.md quotes gpu_report.py docs/data/gpu_2026-11-30 verbatim"


def test_the_readme_gpu_rows_are_the_recorded_gpu_run():
    """The README's GPU rows (one attention call against SDPA flash at 16K and 64K, the layer against
    MultiHeadAttention on JAX) are the medians of the latest GPU run, docs/data/gpu_2026-11-30."""
    folder = os.path.join(REPO, "docs", "data", "gpu_2026-11-30")
    with open(os.path.join(folder, "timings.json"), encoding="utf-8") as f:
        timings = json.load(f)["timings"]["result"]
    with open(os.path.join(folder, "smoke.json"), encoding="utf-8") as f:
        layer = json.load(f)["smoke_jax"]["result"]["layer_timings"]["16384"]
    ours = {r["n"]: r["ms"] for r in timings["rows"]
            if r["what"] == "library attention fwd+bwd" and r["dtype"] == "bfloat16"}
    flash = {r["n"]: r["ms"] for r in timings["sdpa"] if r["what"] == "forward+backward"}
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    row16 = next(line for line in readme.splitlines() if line.startswith("| one attention forward+backward at 16,384"))
    assert f"| {ours[16384]:.1f} ms | **{flash[16384]:.1f} ms** (flash) |" in row16
    assert f"| **{ours[65536]:.1f} ms** | {flash[65536]:.1f} ms (flash) |" in readme
    assert f"| {layer['yoso_ms']:.1f} ms | **{layer['mha_ms']:.1f} ms** (MultiHeadAttention) |" in readme


def test_the_mixed_bfloat16_advice_quotes_the_recorded_gpu_run():
    """The README's and docs/gpu.md's advice to train in mixed_bfloat16 on a GPU quote YOSO's forward+backward
    at 16,384 tokens (codes given; bidirectional and causal, float32 and bfloat16) of docs/data/gpu_2026-11-30."""
    with open(os.path.join(REPO, "docs", "data", "gpu_2026-11-30", "timings.json"), encoding="utf-8") as f:
        rows = [r for r in json.load(f)["timings"]["result"]["rows"] if r["n"] == 16384]
    ms = {(r["what"], r["dtype"]): r["ms"] for r in rows}
    pages = {}
    for page in ("README.md", os.path.join("docs", "gpu.md")):
        with open(os.path.join(REPO, page), encoding="utf-8") as f:
            pages[page] = " ".join(f.read().split())
    causal = ms["library causal yoso fwd+bwd", "float32"] / ms["library causal yoso fwd+bwd", "bfloat16"]
    assert f"causal attention in float32 took {causal:.1f}x its bfloat16 time" in pages["README.md"]
    gpu = pages[os.path.join("docs", "gpu.md")]
    bidirectional = ms["library yoso fwd+bwd", "bfloat16"], ms["library yoso fwd+bwd", "float32"]
    assert "{:.1f} ms in bfloat16 against {:.1f} ms in float32".format(*bidirectional) in gpu
    assert "causal {:.1f} ms against {:.1f} ms".format(ms["library causal yoso fwd+bwd", "bfloat16"],
                                                     ms["library causal yoso fwd+bwd", "float32"]) in gpu
    assert "the causal float32 eq. 4 alone {:.1f} ms, against {:.1f} ms in bfloat16".format(
        ms["lower_bound_gradients causal", "float32"], ms["lower_bound_gradients causal", "bfloat16"]) in gpu


def test_quality_gpu_scale_dry_run_checks_every_stage_and_trains_the_first_at_a_tiny_size(tmp_path):
    """benchmarks/quality/gpu_scale.py (issue 43, item 7), prepared for a GPU machine: every stage's command
    line passes run.py's checks, and the first stage of YOSO against softmax trains end to end at a tiny size, its
    records written before the summary, on this test run's backend (the script's own default, JAX, may not be
    installed). About 30 s of CPU time."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", MPLBACKEND="Agg", KERAS_BACKEND=BACKEND)
    proc = subprocess.run([sys.executable, os.path.join("benchmarks", "quality", "gpu_scale.py"), "--dry-run",
                           "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    _assert_wrote(proc, tmp_path, "environment.json", "summary.json", "mqar_512_64_width128.json")
    summary = json.loads((tmp_path / "summary.json").read_text())
    stage, = summary["stages"]
    assert stage["status"] == "done", stage["output_tail"]
    assert {r["attention"] for r in stage["records"]} == {"none", "yoso", "softmax"}
    assert all(r["steps_done"] == 2 and r["length"] == 24 for r in stage["records"])
    assert "mqar_512_64_width128     yoso" in proc.stdout


def test_quality_gpu_scale_renders_the_recorded_gpu_run_as_docs_quality_quotes_it():
    """The table of docs/quality.md section 8 is gpu_scale.py --render of its records, verbatim."""
    proc = subprocess.run([sys.executable, os.path.join("benchmarks", "quality", "gpu_scale.py"), "--render",
                           os.path.join("docs", "data", "quality_gpu_scale_2026-11-29.json")], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| mqar_512_64_width64 | 512 | 64 | 64 | 1,500 x 64 | yoso | 0.9978 |" in proc.stdout
    assert "| mqar_2048_128 | 2,048 | 128 | 64 | 1,000 x 16 | softmax | – |" in proc.stdout
    with open(os.path.join(REPO, "docs", "quality.md"), encoding="utf-8") as f:
        quality_md = f.read()
    assert proc.stdout.strip() in quality_md
    # 2026-11-30: a stage stopped by a missing module and one cut at the deadline name their attentions with no record
    second = subprocess.run([sys.executable, os.path.join("benchmarks", "quality", "gpu_scale.py"), "--render",
                             os.path.join("docs", "data", "quality_gpu_scale_2026-11-30.json")], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "| performer | – | – | no record: stage failed (exit 1) |" in second.stdout
    cut = "| mqar_512_64_width128 | 512 | 64 | 128 | 1,500 x 64 | yoso | – | – | no record: stage cut at the deadline |"
    assert cut in second.stdout
    assert second.stdout.strip() in quality_md


def test_benchmark_scripts_import_without_editing_sys_path():
    # Python puts a script's own folder on sys.path; modules of other folders are loaded by path
    # (tests/gpu/harness_library.py) or imported by a process of their own (examples/).
    kept = {"gpu_triton_kernels.py": "the Triton kernels (custom_ops/triton) import each other by name"}
    folder = os.path.join(REPO, "benchmarks")
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py") and name not in kept:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                source = f.read()
            assert "sys.path.insert" not in source and "sys.path.append" not in source, name


def test_conversion_error_dry_run_measures_every_variant_and_the_docs_quote_the_record(tmp_path):
    """benchmarks/conversion_error.py on a tiny random BERT (no checkpoint): every variant at both lengths,
    the re-implemented softmax, YOSO-E and sampled YOSO equal to the layers themselves; and the table in
    docs/results.md is what --render gives from the committed record. 8-18 s of CPU time (TensorFlow,
    PyTorch; JAX compiles each eager op)."""
    proc = _run("conversion_error.py", tmp_path, "--dry-run", timeout=240)
    _assert_wrote(proc, tmp_path, "conversion_error.json", "conversion_error.png")
    record = json.loads((tmp_path / "conversion_error.json").read_text())
    assert {(r["variant"], r["length"]) for r in record["rows"]} == {
        (v, n) for v in ("softmax", "exp, unit q,k", "YOSO-E, /sum", "YOSO-E", "YOSO converted",
                         "YOSO library default", "softmax, L2 out") for n in (16, 32)}
    # Sampled YOSO to 1e-2: a hash code can flip where NumPy and the layer round a normalized q or k apart.
    tolerances = {"softmax": 1e-4, "YOSO-E": 1e-4, "sampled YOSO": 1e-2}
    assert all(value < tolerances[name.split(" re-implemented")[0].split(" via")[0]]
               for name, value in record["checks"].items()), record["checks"]
    assert all(e < 1e-4 for r in record["rows"] if r["variant"] == "softmax" for e in r["layer_error"])
    rendered = subprocess.run([sys.executable, os.path.join("benchmarks", "conversion_error.py"), "--render",
                               os.path.join("docs", "data", "conversion_error_2026-11-28.json")], cwd=REPO,
                              capture_output=True, text=True, timeout=60)
    assert rendered.returncode == 0, rendered.stderr[-3000:]
    with open(os.path.join(REPO, "docs", "results.md"), encoding="utf-8") as f:
        assert rendered.stdout.strip() in f.read()


@requires_custom_ops
def test_native_ab_times_two_builds_side_by_side_and_finds_a_build_bitwise_equal_to_itself(tmp_path):
    from keras_yoso.ops.providers import native_library

    built = native_library.library()._name  # the package's native library, copied twice: two builds to load
    libraries = []
    for label in ("before", "after"):
        libraries.append(shutil.copyfile(built, tmp_path / f"{label}.so"))
    record = tmp_path / "record.json"
    proc = _run("native_ab.py", tmp_path, "--libraries", *map(str, libraries), "--labels", "before", "after",
                "--hash-code-lens", "2", "6", "--batch", "2", "--length", "64", "--num-hashes", "4", "--rounds", "2",
                "--repeats", "1", "--record", str(record))
    _assert_wrote(proc, tmp_path, "native_ab.png")
    assert "| case | tau | before ms | after ms | after / before |" in proc.stdout
    [run] = json.loads(record.read_text())
    assert [(row["primitive"], row["tau"]) for row in run["rows"]] == [
        (primitive, tau) for tau in (2, 6) for primitive in ("lower_bound_gradients", "weighted_lsh_cumulation",
                                                             "lsh_cumulation")]
    assert all(row["bitwise_equal_to_first"] == [True, True] and min(row["ms"]) > 0 for row in run["rows"])
    assert [library["label"] for library in run["libraries"]] == ["before", "after"] and run["machine"]["cpu"]
    rendered = _run("native_ab.py", tmp_path, "--render", str(record))
    assert rendered.returncode == 0, rendered.stderr
    assert rendered.stdout.split("\nwrote ")[0].strip() in proc.stdout
    assert (tmp_path / "native_ab_0.png").stat().st_size > 10_000


def test_native_ab_names_the_argument_it_refuses(tmp_path):
    proc = _run("native_ab.py", tmp_path, "--libraries", "one.so")
    assert proc.returncode == 2 and "--libraries: expected at least 2 paths" in proc.stderr, proc.stderr
    proc = _run("native_ab.py", tmp_path, "--libraries", "a.so", "b.so", "--hash-code-lens", "0")
    assert proc.returncode == 2 and "--hash-code-lens: expected values in [1, 20], got 0" in proc.stderr, proc.stderr


@pytest.mark.parametrize("script, marker, record", [
    ("native_ab.py", "native-ab", "docs/data/native_ab_2026-11-30.json"),
    ("training_memory.py", "training-memory", "docs/data/training_memory.json"),
])
def test_docs_benchmarks_quote_the_records_as_their_script_renders_them(tmp_path, script, marker, record):
    with open(os.path.join(REPO, "docs", "benchmarks.md"), encoding="utf-8") as f:
        page = f.read()
    published = page.split(f"<!-- {marker}: {record} -->\n")[1].split(f"<!-- /{marker} -->")[0]
    proc = _run(script, tmp_path, "--render", record)
    assert proc.returncode == 0, proc.stderr
    assert published.strip() == proc.stdout.split("\nwrote ")[0].strip()


_TINY_ENCODER = ["--batch", "1", "--length", "128", "--layers", "1", "--heads", "2", "--width", "16", "--ffn", "32"]


@pytest.mark.skipif(importlib.util.find_spec("jax") is None or importlib.util.find_spec("keras_hub") is None,
                    reason="compiles a JAX training step of a keras_hub BertBackbone")
def test_training_memory_compiles_a_step_per_tree_window_and_scheduler_and_renders_its_record(tmp_path):
    record = tmp_path / "training_memory.json"
    proc = _run("training_memory.py", tmp_path, "--trees", REPO, "--labels", "here", *_TINY_ENCODER,
                "--local-windows", "0", "8", "--schedulers", "serial", "--steps", "1", "--record", str(record),
                timeout=600)
    _assert_wrote(proc, tmp_path, "training_memory.png", "training_memory.json")
    (written,) = json.loads(record.read_text())
    assert [(row["window"], row["scheduler"], row["status"]) for row in written["rows"]] == [
        (0, "serial", "ok"), (8, "serial", "ok")]
    without, with_window = (row["temp_bytes"] for row in written["rows"])
    assert 0 < without < with_window, written["rows"]   # the window's band is a buffer of the step
    assert all(row["step_s"] > 0 for row in written["rows"]) and "here s/step" in proc.stdout
    assert all(row["keras_yoso"] == os.path.join(REPO, "keras_yoso") for row in written["rows"])
    rendered = _run("training_memory.py", tmp_path, "--render", str(record))
    assert rendered.returncode == 0, rendered.stderr
    assert rendered.stdout.split("\nwrote ")[0].strip() in proc.stdout
    assert (tmp_path / "training_memory_0.png").stat().st_size > 10_000


def test_training_memory_names_the_argument_it_refuses(tmp_path):
    proc = _run("training_memory.py", tmp_path, "--trees", str(tmp_path))
    assert proc.returncode == 2 and "--trees: expected folders holding keras_yoso/__init__.py" in proc.stderr
    proc = _run("training_memory.py", tmp_path, "--trees", REPO, "--local-windows", "-1")
    assert proc.returncode == 2 and "--local-windows: expected integers >= 0 (0: no window), got -1" in proc.stderr
    proc = _run("training_memory.py", tmp_path, "--trees", REPO, "--labels", "a", "b")
    assert proc.returncode == 2 and "--labels: expected one per tree (1), got 2" in proc.stderr
