"""Times the bucket-sorted Triton kernels of custom_ops/triton (../shared/GPU-DESIGN.md) against
PyTorch's SDPA flash attention, in one run on one GPU.

One self-attention call at the design's standard shape: B*H = 32 rows (B = 1, H = 32 for SDPA),
d = D = 64, m = 32 hashes, tau = 8 (256 buckets; --hashes, --tau), codes drawn uniformly or Zipf-skewed (s = 1.2,
most rows in a few buckets), masks all ones. Parts, each timed alone with CUDA events (median of
`--repeats` after 2 warm-up calls, which include Triton's JIT compile):

- forward: `lsh_cumulation` (K1 counting sort of the keys, K2 per-bucket sums, K3 gather; eq. 2);
- dV: the same with queries and keys exchanged;
- eq. 4 dQ, dK: `lower_bound_gradients` (K1 of both sides, K6 pair/table tiles, K7);
- fwd+bwd: the sum of the three (the hash codes are inputs: hashing is not timed);
- SDPA flash (bf16) forward and forward+backward at the same shape, in the same run.

Prints a table, writes gpu_triton_kernels.json (and the PNG when matplotlib is there) into --out.
`--dry-run` runs the same code on tiny shapes under TRITON_INTERPRET=1 on the CPU (CI), timing
nothing meaningful.

    python3 benchmarks/gpu_triton_kernels.py --out-dir DIR [--lengths 16384 65536] [--deadline 90]
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import time
import traceback

if "--dry-run" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402

KERNELS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "custom_ops", "triton")
sys.path.insert(0, KERNELS)  # the kernels are build-time sources, not a package
import bucket_sums  # noqa: E402
import lower_bound  # noqa: E402

ROWS, HEADS, DIM = 32, 32, 64


def _timer(device):
    """fn -> median milliseconds of `repeats` calls (CUDA events on a GPU, wall time on the CPU)."""
    def time_it(fn, repeats):
        for _ in range(2):
            fn()
        times = []
        for _ in range(repeats):
            if device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            else:
                begin = time.perf_counter()
                fn()
                times.append(1e3 * (time.perf_counter() - begin))
        return statistics.median(times)
    return time_it


def _codes(rng, rows, hashes, length, buckets, kind, device):
    if kind == "uniform":
        codes = rng.integers(0, buckets, (rows, hashes, length))
    else:  # Zipf-skewed: bucket k drawn with probability ~ 1 / (k + 1)^1.2
        weights = 1.0 / np.arange(1, buckets + 1) ** 1.2
        codes = rng.choice(buckets, (rows, hashes, length), p=weights / weights.sum())
    return torch.tensor(codes.astype(np.int32), device=device)


def _yoso_parts(rng, rows, hashes, tau, length, dtype, kind, device, time_it, repeats):
    q, k, v, dy = (torch.randn(rows, length, DIM, device=device).to(dtype) for _ in range(4))
    buckets = 2 ** tau
    qc, kc = (_codes(rng, rows, hashes, length, buckets, kind, device) for _ in range(2))
    mask = torch.ones(rows, length, device=device)
    parts = {
        "forward": lambda: bucket_sums.lsh_cumulation(mask, qc, mask, kc, v, buckets),
        "dV": lambda: bucket_sums.lsh_cumulation(mask, kc, mask, qc, dy, buckets),
        "eq4 dQ,dK": lambda: lower_bound.lower_bound_gradients(mask, qc, q, mask, kc, k, v, dy, buckets),
    }
    times = {name: time_it(fn, repeats) for name, fn in parts.items()}
    times["fwd+bwd"] = sum(times.values())
    return times


def _sdpa(length, device, time_it, repeats):
    shape = (1, HEADS, length, DIM)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    grad = torch.randn(shape, device=device, dtype=dtype)
    attention = torch.nn.functional.scaled_dot_product_attention
    backend = torch.nn.attention.SDPBackend.FLASH_ATTENTION if device == "cuda" else torch.nn.attention.SDPBackend.MATH

    def context():
        return torch.nn.attention.sdpa_kernel([backend])

    def forward_backward():
        attention(q, k, v).backward(grad)

    with context(), torch.no_grad():
        forward = time_it(lambda: attention(q, k, v), repeats)
    with context():
        both = time_it(forward_backward, repeats)
    return {"forward": forward, "fwd+bwd": both}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", required=True, help="folder for gpu_triton_kernels.json (and .png)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[16384, 65536])
    parser.add_argument("--hashes", type=int, default=32)
    parser.add_argument("--tau", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--deadline", type=float, default=90.0, help="seconds: later cells are skipped past it")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes, interpreted on the CPU (CI)")
    args = parser.parse_args(argv)
    start = time.monotonic()
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("gpu_triton_kernels.py: no CUDA GPU (use --dry-run on a CPU)", file=sys.stderr)
        return 2
    rows, lengths, repeats = (2, [48], 1) if args.dry_run else (ROWS, args.lengths, args.repeats)
    hashes, tau = (2, 3) if args.dry_run else (args.hashes, args.tau)
    time_it = _timer(device)
    rng = np.random.default_rng(0)
    cells = [(n, dtype, kind) for n in lengths for dtype in ("bfloat16", "float32") for kind in ("uniform", "zipf")
             if kind == "uniform" or (dtype == "bfloat16" and n == lengths[0])]
    records, sdpa = [], {}
    for length, dtype, kind in cells:
        if time.monotonic() - start > args.deadline:
            print(f"skipped n={length} {dtype} {kind}: past the deadline")
            continue
        try:
            times = _yoso_parts(rng, rows, hashes, tau, length, getattr(torch, dtype), kind, device, time_it, repeats)
            if length not in sdpa:
                sdpa[length] = _sdpa(length, device, time_it, repeats)
        except Exception as error:  # noqa: BLE001: a failed cell is recorded, the others still run
            traceback.print_exc()
            records.append({"length": length, "dtype": dtype, "codes": kind, "error": repr(error)[:500]})
            print(f"n={length} {dtype} {kind}: FAILED {error!r}"[:300])
            continue
        records.append({"length": length, "dtype": dtype, "codes": kind, "ms": times, "sdpa_ms": sdpa[length],
                        "ratio_fwd_bwd": times["fwd+bwd"] / sdpa[length]["fwd+bwd"],
                        "ratio_forward": times["forward"] / sdpa[length]["forward"]})
    device_name = torch.cuda.get_device_name(0) if device == "cuda" else "CPU (interpreter, dry run)"
    print(f"\nbucket-sorted Triton kernels vs SDPA flash, {device_name}, B*H={rows}, d=D={DIM}, m={hashes}, "
          f"tau={tau}; ms, median of {repeats}")
    print("| n | dtype | codes | forward | dV | eq4 dQ,dK | fwd+bwd | SDPA fwd | SDPA fwd+bwd | x SDPA fwd | x SDPA f+b |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in records:
        if "error" in r:
            print(f"| {r['length']} | {r['dtype']} | {r['codes']} | failed: {r['error'][:80]} |")
            continue
        t, s = r["ms"], r["sdpa_ms"]
        print(f"| {r['length']} | {r['dtype']} | {r['codes']} | {t['forward']:.2f} | {t['dV']:.2f} | "
              f"{t['eq4 dQ,dK']:.2f} | {t['fwd+bwd']:.2f} | {s['forward']:.2f} | {s['fwd+bwd']:.2f} | "
              f"{r['ratio_forward']:.3f} | {r['ratio_fwd_bwd']:.3f} |")
    os.makedirs(args.out_dir, exist_ok=True)
    result = {"command": " ".join(sys.argv), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "device": device_name, "torch": torch.__version__,
              "triton": __import__("triton").__version__, "shape": {"rows": rows, "dim": DIM, "hashes": hashes,
                                                                     "tau": tau}, "records": records}
    with open(os.path.join(args.out_dir, "gpu_triton_kernels.json"), "w") as f:
        json.dump(result, f, indent=1)
    _plot(records, os.path.join(args.out_dir, "gpu_triton_kernels.png"), device_name)
    return 0


def _plot(records, path, device_name):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    good = [r for r in records if "error" not in r and r["codes"] == "uniform"]
    if not good:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    labels = [f"{r['length']}\n{r['dtype']}" for r in good]
    x = np.arange(len(good))
    ax.bar(x - 0.2, [r["ms"]["fwd+bwd"] for r in good], 0.4, label="YOSO Triton fwd+bwd")
    ax.bar(x + 0.2, [r["sdpa_ms"]["fwd+bwd"] for r in good], 0.4, label="SDPA flash bf16 fwd+bwd")
    ax.set_xticks(x, labels)
    ax.set_yscale("log")
    ax.set_ylabel("ms")
    ax.set_title(f"one attention call, {device_name}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
