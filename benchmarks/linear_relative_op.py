"""Time and peak memory of `keras_yoso.ops.linear_relative_attention` vs the dense O(L^2) formula.

Both compute Scaleformer eq. 9-11 (phi = elu + 1, Shaw relative positions clipped
to a horizon k): "linear" is the library op (O(L)), "dense" forms the [L, L]
score matrix. Each (method, mode, length) runs in a fresh subprocess (peak RSS is
its own); forward and forward+backward are timed (median of --repeats, after a
warm-up), and a run out of memory or time is recorded as such. Prints a table,
writes linear_relative_op.json and linear_relative_op.png.

    python benchmarks/linear_relative_op.py                      # L = 1024, 4096, 16384; d = 64, k = 16
    python benchmarks/linear_relative_op.py --quick              # tiny sizes, for the test suite
"""

import argparse
import json
import os

from isolated_run import announce_package
from isolated_run import run_isolated

_CHILD = r"""
import json, resource, sys, time
import numpy as np, tensorflow as tf
from keras_yoso import ops
from keras_yoso.ops.linear_relative import elu_plus_one
method, mode, length, depth, horizon, repeats = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7])
causal = mode == "causal"

def dense(q, k, v, rel):
    phi_q, phi_k, phi_rel = elu_plus_one(q[0]), elu_plus_one(k[0]), elu_plus_one(rel)
    rows = tf.clip_by_value(tf.range(length)[None, :] - tf.range(length)[:, None], -horizon, horizon) + horizon
    scores = tf.matmul(phi_q, phi_k, transpose_b=True)
    scores += tf.gather(tf.matmul(phi_q, phi_rel, transpose_b=True), rows, batch_dims=1)
    if causal:
        scores = tf.linalg.band_part(scores, -1, 0)
    return (tf.matmul(scores, v[0]) / (tf.reduce_sum(scores, -1, keepdims=True) + 1e-6))[None]

def linear(q, k, v, rel):
    return ops.linear_relative_attention(q, k, v, rel, horizon, causal=causal)

attention = dense if method == "dense" else linear
rng = np.random.default_rng(0)
q, k, v = (tf.constant(rng.normal(size=(1, length, depth)).astype(np.float32)) for _ in range(3))
rel = tf.constant(rng.normal(size=(2 * horizon + 1, depth)).astype(np.float32))

@tf.function
def forward():
    return attention(q, k, v, rel)

@tf.function
def forward_backward():
    with tf.GradientTape() as tape:
        tape.watch([q, k, v, rel])
        loss = tf.reduce_sum(attention(q, k, v, rel) ** 2)
    return tape.gradient(loss, [q, k, v, rel])

def median_seconds(fn):
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        _ = [t.numpy() for t in tf.nest.flatten(fn())]
        times.append(time.perf_counter() - start)
    return float(np.median(times))

base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
fwd = median_seconds(forward)
fwd_bwd = median_seconds(forward_backward)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"forward_s": fwd, "forward_backward_s": fwd_bwd, "peak_rss_mib": peak / 1024.0,
                  "growth_mib": (peak - base) / 1024.0}))
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--depth", type=int, default=64)
    parser.add_argument("--horizon", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per configuration")
    parser.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    parser.add_argument("--quick", action="store_true", help="tiny run that checks the script works")
    args = parser.parse_args()
    if args.quick:
        args.lengths, args.depth, args.horizon, args.repeats = [64, 128], 8, 2, 1

    announce_package(["tensorflow"], expect_custom_ops=False)  # one implementation: TensorFlow ops
    rows = []
    print(f"{'mode':<14} {'length':>7} {'method':<7} {'fwd s':>8} {'fwd+bwd s':>10} {'peak MiB':>9} "
          f"{'growth MiB':>10}  status", flush=True)
    for mode in ("bidirectional", "causal"):
        for length in args.lengths:
            for method in ("linear", "dense"):
                r = run_isolated(_CHILD, [method, mode, length, args.depth, args.horizon, args.repeats],
                                 args.timeout)
                r.update(method=method, mode=mode, length=length)
                rows.append(r)
                if r["status"] == "ok":
                    print(f"{mode:<14} {length:>7} {method:<7} {r['forward_s']:>8.4f} "
                          f"{r['forward_backward_s']:>10.4f} {r['peak_rss_mib']:>9.0f} {r['growth_mib']:>10.0f}  ok",
                          flush=True)
                else:
                    print(f"{mode:<14} {length:>7} {method:<7} {'-':>8} {'-':>10} {'-':>9} {'-':>10}  {r['status']}",
                          flush=True)

    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "linear_relative_op.json"), "w") as f:
        json.dump({"config": vars(args), "results": rows}, f, indent=2)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for mode, style in (("bidirectional", "-"), ("causal", "--")):
        for method in ("linear", "dense"):
            pts = sorted((r["length"], r) for r in rows
                         if r["status"] == "ok" and r["mode"] == mode and r["method"] == method)
            if pts:
                lengths = [p[0] for p in pts]
                axes[0].loglog(lengths, [p[1]["forward_backward_s"] for p in pts], "o" + style,
                               label=f"{method}, {mode}")
                axes[1].loglog(lengths, [p[1]["peak_rss_mib"] for p in pts], "o" + style, label=f"{method}, {mode}")
    axes[0].set(xlabel="sequence length", ylabel="forward+backward time (s)", title="time")
    axes[1].set(xlabel="sequence length", ylabel="peak RSS (MiB)", title="memory")
    for ax in axes:
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(f"linear_relative_attention vs dense formula, d={args.depth}, k={args.horizon}, CPU")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out_dir, "linear_relative_op.png"), dpi=120)
    print("wrote", os.path.join(args.out_dir, "linear_relative_op.png"))


if __name__ == "__main__":
    main()
