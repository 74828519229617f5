"""Renders docs/gpu.md's tables of a GPU run from its records (the files tests/gpu/verify.py and
benchmarks/gpu_triton_kernels.py wrote, copied into docs/data/gpu_<date>/): the verification of the
kernels through every framework, the kernels inside the package (verify.py's timings: the Triton path
through the C ABI; its profile of one attention call, kernel by kernel) and the bucket-sorted Triton
kernels on their own (gpu_triton_kernels.py) against SDPA flash attention timed in the same process,
the decoding step, the layer against MultiHeadAttention, and the measured rates. Prints Markdown; the
page quotes it. A table whose records the folder lacks is left out.

    python3 benchmarks/gpu_report.py docs/data/gpu_2026-11-30
"""

import importlib.util
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
VERIFY = os.path.join(os.path.dirname(HERE), "tests", "gpu", "verify.py")


def _verify():
    """tests/gpu/verify.py, loaded by path (it imports numpy only): its timing_ratios, computed once there."""
    spec = importlib.util.spec_from_file_location("gpu_verify", VERIFY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load(folder, name):
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def correctness(folder):
    result = _load(folder, "correctness.json")["correctness"]["result"]
    lines = ["| primitive, dtype | cases | pass | failed or refused | on the Triton kernels | worst error / bound | "
             "bitwise equal when run twice |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, row in sorted(result["by_primitive"].items()):
        lines.append(f"| {name} | {row['cases']} | {row['pass']} | {row.get('fail', 0) + row.get('error', 0)} | "
                     f"{row.get('on_triton', 0)} | {row['worst_ratio']:.3f} | {row['repeat_equal']}/{row['cases']} |")
    failed = [c for c in result.get("cases", []) if c.get("verdict") not in ("pass", None)]
    for case in failed:
        why = next(iter((case.get("messages") or {}).values()), case.get("error")) or "?"
        lines.append(f"\n- {case['verdict']}: `{case['case']}`: {why}")
    return "\n".join(lines)


def _ms(value, form="{:.2f}"):
    return "–" if value is None else form.format(value)


def library(folder):
    """verify.py's timings: the kernels inside the package (torch.ops.keras_yoso, i.e. the C ABI's
    ky_run_device, which launches the embedded Triton cubins), against SDPA flash timed in the same stage."""
    record = _load(folder, "timings.json")["timings"]
    result = record["result"]
    rows = {(r["what"], r["n"], r["dtype"]): r.get("ms") for r in result.get("rows", []) if "ms" in r}
    sdpa = {(r["what"], r["n"]): r.get("ms") for r in result.get("sdpa", []) if "ms" in r}
    shape = result["shape"]
    ratios = _verify().timing_ratios(result)
    zipf = any(what == "library yoso fwd+bwd zipf" for what, _, _ in rows)  # timed since 2026-11-29's run
    lines = [f"B*H = {shape['batch_heads']}, d = D = {shape['dim']}, m = {shape['num_hashes']}, tau = "
             f"{shape['hash_code_len']}; ms, CUDA events, median of 10; the stage's status: {record['status']}. "
             "Forward: lsh_cumulation (eq. 2); eq. 4: lower_bound_gradients (dQ, dK); YOSO fwd+bwd: forward, dV and "
             "eq. 4 with the codes given; attention: the same with the two hashes (Hadamard, interleaved) first; "
             "causal: Y over keys j <= i and the causal eq. 4 (SDPA stays bidirectional).", "",
             "| n | dtype | forward | eq. 4 | hash (one side) | YOSO fwd+bwd | attention fwd+bwd | causal YOSO fwd+bwd "
             "| SDPA flash bf16 fwd / fwd+bwd | forward / SDPA | YOSO fwd+bwd / SDPA | attention fwd+bwd / SDPA |"
             + (" YOSO fwd+bwd, Zipf codes |" if zipf else ""),
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if zipf else "")]
    for n, dtype in sorted({(n, dtype) for _, n, dtype in rows}, key=lambda k: (k[0], k[1] != "bfloat16")):
        get = lambda what: rows.get((what, n, dtype))  # noqa: E731
        forward, backward = sdpa.get(("forward", n)), sdpa.get(("forward+backward", n))
        over = lambda ours, theirs: None if ours is None or not theirs else ours / theirs  # noqa: E731
        lines.append(f"| {n:,} | {dtype} | {_ms(get('lsh_cumulation'))} | {_ms(get('lower_bound_gradients'))} | "
                     f"{_ms(get('hadamard_interleaved_hash_codes'))} | {_ms(get('library yoso fwd+bwd'))} | "
                     f"{_ms(get('library attention fwd+bwd'))} | {_ms(get('library causal yoso fwd+bwd'))} | "
                     f"{_ms(forward)} / {_ms(backward)} | {_ms(over(get('lsh_cumulation'), forward))} | "
                     f"{_ms(ratios[f'{n} {dtype}']['library_yoso_forward_backward'])} | "
                     f"{_ms(ratios[f'{n} {dtype}']['library_forward_backward'])} |"
                     + (f" {_ms(get('library yoso fwd+bwd zipf'))} |" if zipf else ""))
    steps = [r for r in result.get("decoding") or [] if "length" in r]
    if steps:
        lines += ["", "The decoding step (`lsh_cumulation_step`, float32 tables of 64 MiB), ms per call:", "",
                  "| tokens per call | dtype | in place (ky_run_device) | torch.ops (copies the tables) |",
                  "|---:|---|---:|---:|"]
        by = {(r["what"].split(" ")[0], r["length"], r["dtype"]): r.get("ms") for r in steps}  # "in", "torch.ops..."
        for length, dtype in sorted({(r["length"], r["dtype"]) for r in steps}):
            lines.append(f"| {length} | {dtype} | {_ms(by.get(('in', length, dtype)), '{:.3f}')} | "
                         f"{_ms(by.get(('torch.ops.keras_yoso', length, dtype)), '{:.3f}')} |")
    return "\n".join(lines)


def smoke(folder):
    """The layer against MultiHeadAttention; with its memory (verify.LAYER_MEMORY) once a run records it."""
    result = _load(folder, "smoke.json")
    stages = [(stage, result[stage]["result"]) for stage in ("smoke_jax", "smoke_torch")]
    memory = any("yoso_mib" in row for _, r in stages for row in r["layer_timings"].values())
    lines = ["| backend | GPU vs CPU, max relative difference | YOSO layer fwd+bwd, ms (8,192 / 16,384 tokens) | "
             "MultiHeadAttention fwd+bwd, ms |" + (" YOSO, MiB | MultiHeadAttention, MiB |" if memory else ""),
             "|---|---|---:|---:|" + ("---:|---:|" if memory else "")]
    for stage, r in stages:
        checks = {k: v for k, v in r.items() if isinstance(v, dict) and "verdict" in v}
        compared = "; ".join(f"{k}: {v['verdict']} ({v['worst_relative']:.1e})" for k, v in checks.items())
        t = r["layer_timings"]
        line = (f"| {stage.split('_')[1]} | {compared} | "
                f"{t['8192']['yoso_ms']:.0f} / {t['16384']['yoso_ms']:.0f} | "
                f"{t['8192']['mha_ms']:.1f} / {t['16384']['mha_ms']:.1f} |")
        if memory:
            line += "".join(" " + " / ".join(_mib(t[length].get(f"{key}_mib")) for length in ("8192", "16384")) + " |"
                            for key in ("yoso", "mha"))
        lines.append(line)
    if memory:
        lines += ["", "Memory: " + "; ".join(f"{stage.split('_')[1]}, {r['layer_memory']}" for stage, r in stages
                                             if r.get("layer_memory"))
                  + "."]
    return "\n".join(lines)


def _mib(value):
    return "–" if value is None else f"{value:,.0f}"


def triton(folder):
    """The newest run's record of each (n, dtype, codes) cell (runs are appended in time order)."""
    runs = _load(folder, "gpu_triton_kernels.json")["runs"]
    newest = {(r["length"], r["dtype"], r["codes"]): dict(r, run=i + 1)
              for i, run in enumerate(runs) for r in run["records"] if "error" not in r}
    records = [newest[key] for key in sorted(newest)]
    lines = [f"{runs[0]['device']}, torch {runs[0]['torch']}, Triton {runs[0]['triton']}; ms, CUDA events, "
             "median of 10",
             "",
             "| n | dtype | codes | forward | dV | eq. 4 dQ, dK | fwd+bwd | SDPA flash bf16 fwd / fwd+bwd | "
             "fwd / SDPA | fwd+bwd / SDPA | run |",
             "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in records:
        t, s = r["ms"], r["sdpa_ms"]
        lines.append(f"| {r['length']:,} | {r['dtype']} | {r['codes']} | {t['forward']:.2f} | {t['dV']:.2f} | "
                     f"{t['eq4 dQ,dK']:.2f} | {t['fwd+bwd']:.2f} | {s['forward']:.2f} / {s['fwd+bwd']:.2f} | "
                     f"{r['ratio_forward']:.2f} | {r['ratio_fwd_bwd']:.2f} | {r['run']} |")
    return "\n".join(lines)


def train_step(folder):
    """verify.py's stage train_step: one training step of examples/convert_pretrained.py's shape on JAX (None
    where the run had no such stage)."""
    result = (_load(folder, "smoke.json").get("train_step") or {}).get("result")
    if not result:
        return None
    shape = result.get("shape") or {}
    lines = [f"{shape.get('layers')} layers, width {shape.get('width')}, {shape.get('heads')} heads, batch "
             f"{shape.get('batch')} x {shape.get('length')} tokens (all-MiniLM-L6-v2's shape, random weights), "
             "model.train_on_batch, wall-clock median:", ""]
    rows = [(label, result.get(name) or {}) for name, label in (("yoso", "YOSO (m = 32)"), ("mha", "MultiHeadAttention"))]
    memory = any(row.get("mib") is not None for _, row in rows)  # recorded since 2026-12-03
    lines += ["| attention | ms a step | first call, s |" + (" memory, MiB |" if memory else ""),
              "|---|---:|---:|" + ("---:|" if memory else "")]
    for label, row in rows:
        lines.append(f"| {label} | {_ms(row.get('ms'), '{:.0f}') if 'ms' in row else row.get('error', '–')} | "
                     f"{_ms(row.get('first_call_s'), '{:.1f}')} |" + (f" {_mib(row.get('mib'))} |" if memory else ""))
    if memory:
        lines += ["", f"Memory: {result['memory']}."]
    return "\n".join(lines)


def profile(folder, top=12):
    """verify.py's stage profile: one attention forward+backward's GPU kernels under torch.profiler, the `top`
    heaviest and the rest summed (None where the run had no such stage or it recorded no kernel)."""
    result = (_load(folder, "timings.json").get("profile") or {}).get("result") or {}
    kernels = result.get("kernels")
    if not kernels:
        return None
    case, total = result["case"], result["kernel_ms"]
    lines = [f"`{case['what']}` at n = {case['n']:,}, {case['dtype']}, B*H = {case['batch_heads']}, d = D = "
             f"{case['dim']}, m = {case['num_hashes']}, tau = {case['hash_code_len']}: GPU time per call from "
             f"torch.profiler over {case['repeats']} calls, {total:.2f} ms in {len(kernels)} kernels (wall time of a "
             f"call under the profiler: {result['wall_ms']:.2f} ms)", "",
             "| kernel | launches per call | ms per call | share |", "|---|---:|---:|---:|"]
    for row in kernels[:top]:
        name = row["kernel"] if len(row["kernel"]) <= 70 else row["kernel"][:67] + "..."
        lines.append(f"| `{name}` | {row['launches']:g} | {row['ms']:.3f} | {row['ms'] / total:.0%} |")
    rest = kernels[top:]
    if rest:
        ms = sum(row["ms"] for row in rest)
        lines.append(f"| {len(rest)} others | {sum(row['launches'] for row in rest):g} | {ms:.3f} | {ms / total:.0%} |")
    return "\n".join(lines)


def rates(folder):
    result = _load(folder, "rates.json")["rates"]["result"]["rates"]
    lines = ["| rate | value | unit |", "|---|---:|---|"]
    for name, r in result.items():
        lines.append(f"| {name} | {r['rate']:,.0f} | {r['unit']} |")
    return "\n".join(lines)


# (title, renderer, the record file it needs), in the page's order.
TABLES = (
    ("Correctness of the GPU kernels through torch.ops (against float64)", correctness, "correctness.json"),
    ("The kernels inside the package against SDPA flash", library, "timings.json"),
    ("Where one attention forward+backward's GPU time goes", profile, "timings.json"),
    ("The layer on JAX and PyTorch on the GPU", smoke, "smoke.json"),
    ("A training step of the converted-checkpoint example on JAX", train_step, "smoke.json"),
    ("Bucket-sorted Triton kernels against SDPA flash", triton, "gpu_triton_kernels.json"),
    ("Rates (torch operations)", rates, "rates.json"))
RECORD_FILES = tuple(dict.fromkeys(needs for _, _, needs in TABLES))


def main(argv):
    if any(arg in ("-h", "--help") for arg in argv):
        print(__doc__)
        return
    if len(argv) != 1 or not os.path.isdir(argv[0]):
        raise SystemExit(f"give one folder of a GPU run's records (docs/data/gpu_<date>), got {argv}")
    folder = argv[0]
    if not any(os.path.exists(os.path.join(folder, name)) for name in RECORD_FILES):
        raise SystemExit(f"{folder} holds none of a GPU run's records ({', '.join(RECORD_FILES)})")
    for title, render, needs in TABLES:
        text = render(folder) if os.path.exists(os.path.join(folder, needs)) else None
        if text is not None:
            print(f"### {title}\n\n{text}\n")


if __name__ == "__main__":
    main(sys.argv[1:] or ["docs/data/gpu_2026-11-30"])
