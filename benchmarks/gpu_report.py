"""Renders docs/gpu.md's tables of a GPU run from its records (the files tests/gpu/verify.py and
benchmarks/gpu_triton_kernels.py wrote, copied into docs/data/gpu_<date>/): the verification of the
kernels through every framework, the bucket-sorted Triton kernels against SDPA flash attention, the
layer against MultiHeadAttention, and the measured rates. Prints Markdown; the page quotes it.

    python3 benchmarks/gpu_report.py docs/data/gpu_2026-11-28
"""

import json
import os
import sys


def _load(folder, name):
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def correctness(folder):
    result = _load(folder, "correctness.json")["correctness"]["result"]
    lines = ["| primitive, dtype | cases | pass | worst error / bound | bitwise equal when run twice |",
             "|---|---:|---:|---:|---:|"]
    for name, row in sorted(result["by_primitive"].items()):
        lines.append(f"| {name} | {row['cases']} | {row['pass']} | {row['worst_ratio']:.3f} | "
                     f"{row['repeat_equal']}/{row['cases']} |")
    return "\n".join(lines)


def smoke(folder):
    result = _load(folder, "smoke.json")
    lines = ["| backend | GPU vs CPU, max relative difference | YOSO layer fwd+bwd, ms (8,192 / 16,384 tokens) | "
             "MultiHeadAttention fwd+bwd, ms |", "|---|---|---:|---:|"]
    for stage in ("smoke_jax", "smoke_torch"):
        r = result[stage]["result"]
        checks = {k: v for k, v in r.items() if isinstance(v, dict) and "verdict" in v}
        compared = "; ".join(f"{k}: {v['verdict']} ({v['worst_relative']:.1e})" for k, v in checks.items())
        t = r["layer_timings"]
        lines.append(f"| {stage.split('_')[1]} | {compared} | {t['8192']['yoso_ms']:.0f} / {t['16384']['yoso_ms']:.0f} | "
                     f"{t['8192']['mha_ms']:.1f} / {t['16384']['mha_ms']:.1f} |")
    return "\n".join(lines)


def triton(folder):
    """The newest run's record of each (n, dtype, codes) cell (runs are appended in time order)."""
    runs = _load(folder, "gpu_triton_kernels.json")["runs"]
    newest = {(r["length"], r["dtype"], r["codes"]): dict(r, run=i + 1)
              for i, run in enumerate(runs) for r in run["records"] if "error" not in r}
    records = [newest[key] for key in sorted(newest)]
    lines = [f"{runs[0]['device']}, torch {runs[0]['torch']}, Triton {runs[0]['triton']}; ms, CUDA events, median of 10",
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


def rates(folder):
    result = _load(folder, "rates.json")["rates"]["result"]["rates"]
    lines = ["| rate | value | unit |", "|---|---:|---|"]
    for name, r in result.items():
        lines.append(f"| {name} | {r['rate']:,.0f} | {r['unit']} |")
    return "\n".join(lines)


def main(argv):
    folder = argv[0]
    for title, render in (("Correctness of the CUDA kernels through torch.ops (against float64)", correctness),
                          ("The layer on JAX and PyTorch on the GPU", smoke),
                          ("Bucket-sorted Triton kernels against SDPA flash", triton),
                          ("Rates (torch operations)", rates)):
        print(f"#### {title}\n\n{render(folder)}\n")


if __name__ == "__main__":
    main(sys.argv[1:] or ["docs/data/gpu_2026-11-28"])
