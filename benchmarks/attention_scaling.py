"""Forward+backward time and peak memory of one attention layer vs sequence length.

Forward and forward+backward are timed (median of --repeats after a warm-up). Each
(method, length) runs in a fresh subprocess, so peak RSS (resource.getrusage)
belongs to that configuration alone; a run that exceeds --timeout or dies (e.g.
out of memory) is recorded as such. Prints a table, writes scaling.json and
scaling.png (scaling_model.* with --model): log-log time and memory vs length, like
the paper's Figure 7.

    python benchmarks/attention_scaling.py --lengths 1024 4096 16384 [--methods yoso-32 mha]
    python benchmarks/attention_scaling.py --model      # the paper's profile: 6 blocks, 256 wide, FFN 1024
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
method, length, repeats, heads, key_dim, num_layers = sys.argv[1], *map(int, sys.argv[2:7])
width = heads * key_dim
if method == "mha":
    attention, kwargs = "softmax", {}
elif method.startswith("linear-relative"):
    attention, kwargs = "linear_relative", dict(horizon=16, causal=method.endswith("causal"))
elif method == "yoso-e":
    attention, kwargs = "yoso", dict(use_expectation=True, seed=1)
else:
    attention, kwargs = "yoso", dict(num_hashes=int(method.split("-")[1]), hash_code_len=8, seed=1)
if num_layers == 0:  # one attention layer
    cls = {"softmax": keras.layers.MultiHeadAttention, "yoso": keras_yoso.YosoAttention,
           "linear_relative": keras_yoso.LinearRelativeAttention}[attention]
    layer = cls(heads, key_dim, **kwargs)
    run = lambda x, training: layer(x, x, training=training)
else:  # the paper's profile: a stack of encoder blocks
    blocks = [keras_yoso.TransformerEncoderBlock(heads, 4 * width, attention=attention, attention_kwargs=kwargs,
                                                 dropout=0.0) for _ in range(num_layers)]
    def run(x, training):
        for block in blocks:
            x = block(x, training=training)
        return x
x = tf.random.stateless_normal([1, length, width], [1, 2])
run(x, False)
variables = [v for v in (layer.trainable_variables if num_layers == 0 else
                         [w for b in blocks for w in b.trainable_variables])]
@tf.function
def forward():
    return run(x, False)
@tf.function
def forward_backward():
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = run(x, True)
        loss = tf.reduce_sum(y * y)
    return tape.gradient(loss, [x] + variables)
def median_seconds(fn):
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        _ = [t.numpy() for t in tf.nest.flatten(fn())[:1]]
        times.append(time.perf_counter() - start)
    return float(np.median(times))
forward_s = median_seconds(forward)
seconds = median_seconds(forward_backward)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
print(json.dumps({"forward_s": forward_s, "seconds": seconds, "peak_rss_mib": peak}))
"""


def multiply_adds(method, length, heads, key_dim, hash_code_len=8):
    """Multiply-adds of one forward+backward step of one layer (yoso-m and mha only, else None).

    Projections: 4 dense [width, width] maps, x3 for forward, dX and dW. MHA core, per head:
    QK^T and PV forward, dV, dP, dQ and dK backward, 6 n^2 key_dim. YOSO-m core, per head and
    hash: lsh_cumulation forward and its transpose for dV (4 n key_dim), and the two weighted
    cumulations of the lower-bound backward (dQ, dK). Those take, per bucket of n_b queries and
    n_b keys (uniform codes: n_b = n / 2^tau), the cheaper of the pair product n_b^2 (W + D) and
    the table product 2 n_b W D (W = D = key_dim), as the CPU kernel does. Hashing (sign bits of
    Hadamard transforms: additions) is not counted.
    """
    width = heads * key_dim
    projections = 3 * 4 * length * width * width
    if method == "mha":
        return projections + heads * 6 * length * length * key_dim
    if not method.startswith("yoso-") or method == "yoso-e":
        return None
    num_hashes, buckets = int(method.split("-")[1]), 2 ** hash_code_len
    per_bucket = length / buckets
    weighted = buckets * min(per_bucket ** 2 * 2 * key_dim, 2 * per_bucket * key_dim * key_dim)
    return projections + heads * num_hashes * (4 * length * key_dim + 2 * weighted)


def run_one(method, length, repeats, heads, key_dim, num_layers, timeout):
    return run_isolated(_CHILD, [method, length, repeats, heads, key_dim, num_layers], timeout)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384, 32768])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--key-dim", type=int, default=64)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per (method, length)")
    parser.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    parser.add_argument("--model", action="store_true",
                        help="time the paper's model profile instead of one layer: 6 TransformerEncoderBlocks, "
                             "width heads * key_dim (256), FFN 4 * width (1024)")
    parser.add_argument("--num-layers", type=int, default=6, help="blocks in --model mode")
    parser.add_argument("--quick", action="store_true", help="tiny run that checks the script works")
    args = parser.parse_args()
    if args.quick:
        args.lengths, args.repeats, args.heads, args.key_dim = [64, 128], 1, 2, 8
        args.methods = ["yoso-16", "linear-relative-causal", "mha"]
        args.num_layers = 2
    num_layers = args.num_layers if args.model else 0
    name = "scaling_model" if args.model else "scaling"

    results = []
    print(f"{'method':<22} {'length':>7} {'fwd s':>8} {'fwd+bwd s':>10} {'peak MiB':>9}  status", flush=True)
    for length in args.lengths:
        for method in args.methods:
            r = run_one(method, length, args.repeats, args.heads, args.key_dim, num_layers, args.timeout)
            r.update(method=method, length=length)
            results.append(r)
            fwd = f"{r['forward_s']:.3f}" if r["status"] == "ok" else "-"
            secs = f"{r['seconds']:.3f}" if r["status"] == "ok" else "-"
            mem = f"{r['peak_rss_mib']:.0f}" if r["status"] == "ok" else "-"
            print(f"{method:<22} {length:>7} {fwd:>8} {secs:>10} {mem:>9}  {r['status']}", flush=True)

    ok = {(r["method"], r["length"]): r for r in results if r["status"] == "ok"}
    if "mha" in args.methods:
        for method in [m for m in args.methods if m != "mha"]:
            for length in args.lengths:
                if (method, length) in ok and ("mha", length) in ok:
                    a, b = ok[(method, length)], ok[("mha", length)]
                    macs = [multiply_adds(m, length, args.heads, args.key_dim) for m in (method, "mha")]
                    arithmetic = (f", multiply-add ratio {macs[1] / macs[0]:.1f}x"
                                  if None not in macs and not args.model else "")
                    print(f"{method} vs mha at {length}: speedup {b['seconds'] / a['seconds']:.1f}x, "
                          f"{a['peak_rss_mib'] / b['peak_rss_mib']:.2f}x the peak memory{arithmetic}")

    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, f"{name}.json"), "w") as f:
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
    what = (f"{num_layers} encoder blocks, width {args.heads * args.key_dim}" if args.model
            else "one attention layer")
    fig.suptitle(f"{what}, batch 1, {args.heads} heads, key_dim {args.key_dim}, CPU")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out_dir, f"{name}.png"), dpi=120)
    print("wrote", os.path.join(args.out_dir, f"{name}.png"))


if __name__ == "__main__":
    main()
