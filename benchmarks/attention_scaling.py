"""Forward+backward time and peak memory of one attention layer vs sequence length.

Each (method, length) runs in a fresh subprocess, so peak RSS (resource.getrusage)
belongs to that configuration alone; a run that exceeds --timeout or dies (e.g.
out of memory) is recorded as such. Prints a table, writes scaling.json and
scaling.png (log-log time and memory vs length, like the paper's Figure 7).

    python benchmarks/attention_scaling.py --lengths 1024 4096 16384 [--methods yoso-32 mha]
    python benchmarks/attention_scaling.py --quick      # tiny sizes, for the test suite

Methods: yoso-16, yoso-32 (YosoAttention, tau = 8), yoso-e (use_expectation=True),
linear-relative, linear-relative-causal (LinearRelativeAttention, horizon 16), mha
(keras.layers.MultiHeadAttention). Batch 1, 4 heads, key_dim 64, model width 256.
"""

import argparse
import json
import os

from isolated_run import run_isolated

METHODS = ("yoso-16", "yoso-32", "yoso-e", "linear-relative", "linear-relative-causal", "mha")

_CHILD = r"""
import json, os, resource, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np, tensorflow as tf, keras
import keras_yoso
method, length, repeats, heads, key_dim = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
width = heads * key_dim
if method == "mha":
    layer = keras.layers.MultiHeadAttention(heads, key_dim)
elif method.startswith("linear-relative"):
    layer = keras_yoso.LinearRelativeAttention(heads, key_dim, horizon=16, causal=method.endswith("causal"))
elif method == "yoso-e":
    layer = keras_yoso.YosoAttention(heads, key_dim, use_expectation=True, seed=1)
else:
    layer = keras_yoso.YosoAttention(heads, key_dim, num_hashes=int(method.split("-")[1]), hash_code_len=8, seed=1)
x = tf.random.stateless_normal([1, length, width], [1, 2])
layer(x, x)
@tf.function
def step():
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, x, training=True)
        loss = tf.reduce_sum(y * y)
    return tape.gradient(loss, [x] + layer.trainable_variables)
step()
times = []
for _ in range(repeats):
    start = time.perf_counter()
    grads = step()
    _ = [g.numpy() for g in grads[:1]]
    times.append(time.perf_counter() - start)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
print(json.dumps({"seconds": float(np.median(times)), "peak_rss_mib": peak}))
"""


def run_one(method, length, repeats, heads, key_dim, timeout):
    return run_isolated(_CHILD, [method, length, repeats, heads, key_dim], timeout)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384, 32768])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--key-dim", type=int, default=64)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per (method, length)")
    parser.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    parser.add_argument("--quick", action="store_true", help="tiny run that checks the script works")
    args = parser.parse_args()
    if args.quick:
        args.lengths, args.repeats, args.heads, args.key_dim = [64, 128], 1, 2, 8
        args.methods = ["yoso-16", "linear-relative-causal", "mha"]

    results = []
    print(f"{'method':<22} {'length':>7} {'fwd+bwd s':>10} {'peak MiB':>9}  status", flush=True)
    for length in args.lengths:
        for method in args.methods:
            r = run_one(method, length, args.repeats, args.heads, args.key_dim, args.timeout)
            r.update(method=method, length=length)
            results.append(r)
            secs = f"{r['seconds']:.3f}" if r["status"] == "ok" else "-"
            mem = f"{r['peak_rss_mib']:.0f}" if r["status"] == "ok" else "-"
            print(f"{method:<22} {length:>7} {secs:>10} {mem:>9}  {r['status']}", flush=True)

    ok = {(r["method"], r["length"]): r for r in results if r["status"] == "ok"}
    if "mha" in args.methods:
        for method in [m for m in args.methods if m != "mha"]:
            for length in args.lengths:
                if (method, length) in ok and ("mha", length) in ok:
                    a, b = ok[(method, length)], ok[("mha", length)]
                    print(f"{method} vs mha at {length}: {b['seconds'] / a['seconds']:.1f}x faster, "
                          f"{a['peak_rss_mib'] / b['peak_rss_mib']:.2f}x the peak memory")

    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "scaling.json"), "w") as f:
        json.dump({"config": vars(args), "results": results}, f, indent=2)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for method in args.methods:
        pts = sorted((L, ok[(method, L)]) for L in args.lengths if (method, L) in ok)
        if pts:
            axes[0].loglog([p[0] for p in pts], [p[1]["seconds"] for p in pts], "o-", label=method)
            axes[1].loglog([p[0] for p in pts], [p[1]["peak_rss_mib"] for p in pts], "o-", label=method)
    axes[0].set(xlabel="sequence length", ylabel="forward+backward time (s)", title="time")
    axes[1].set(xlabel="sequence length", ylabel="peak RSS (MiB)", title="memory")
    for ax in axes:
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(f"one attention layer, batch 1, {args.heads} heads, key_dim {args.key_dim}, CPU")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out_dir, "scaling.png"), dpi=120)
    print("wrote", os.path.join(args.out_dir, "scaling.png"))


if __name__ == "__main__":
    main()
