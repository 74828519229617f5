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

    python benchmarks/attention_scaling.py --lengths 4096 16384 --methods yoso-32 mha \
        --backends tensorflow jax torch --implementations auto composite   # every backend, side by side

Methods: yoso-16, yoso-32 (YosoAttention, tau = 8), yoso-e (use_expectation=True),
linear-relative, linear-relative-causal (LinearRelativeAttention, horizon 16), mha
(keras.layers.MultiHeadAttention). Batch 1, 4 heads, key_dim 64, model width 256.
--backends: Keras backends (TensorFlow: tf.function + GradientTape; JAX: jax.jit of
stateless_call and jax.grad; PyTorch: eager with torch.autograd.grad). The "YOSO ops" column says
which implementation each YOSO row ran (custom_op or composite). The processes import the installed
keras_yoso (not ./keras_yoso of a checkout); the script first prints its path and, for each backend
whose native kernels are not loaded there, a line starting with "!!" that says the composite is measured.
"""

import argparse
import json
import os

from isolated_run import announce_package
from isolated_run import run_isolated

METHODS = ("yoso-16", "yoso-32", "yoso-e", "linear-relative", "linear-relative-causal", "mha")

_CHILD = r"""
import json, os, resource, sys, time
backend, method, implementation = sys.argv[1:4]
length, repeats, heads, key_dim, num_layers = map(int, sys.argv[4:9])
os.environ["KERAS_BACKEND"] = backend
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np, keras
import keras_yoso
width = heads * key_dim
if method == "mha":
    attention, kwargs = "softmax", {}
elif method.startswith("linear-relative"):
    attention, kwargs = "linear_relative", dict(horizon=16, causal=method.endswith("causal"))
elif method == "yoso-e":
    attention, kwargs = "yoso", dict(use_expectation=True, seed=1)
else:
    attention, kwargs = "yoso", dict(num_hashes=int(method.split("-")[1]), hash_code_len=8, seed=1)
if attention == "yoso":
    kwargs["implementation"] = implementation
if num_layers == 0:  # one attention layer
    cls = {"softmax": keras.layers.MultiHeadAttention, "yoso": keras_yoso.YosoAttention,
           "linear_relative": keras_yoso.LinearRelativeAttention}[attention]
    model = cls(heads, key_dim, **kwargs)
    run = lambda x, training: model(x, x, training=training)
else:  # the paper's profile: a stack of encoder blocks
    blocks = [keras_yoso.TransformerEncoderBlock(heads, 4 * width, attention=attention, attention_kwargs=kwargs,
                                                 dropout=0.0) for _ in range(num_layers)]
    model = keras.Sequential(blocks)
    run = lambda x, training: model(x, training=training)
x_np = np.random.default_rng(1).standard_normal((1, length, width)).astype("float32")
x = keras.ops.convert_to_tensor(x_np)
run(x, False)
# Which YOSO implementation ran: "auto" resolves per call (custom op on TF with the library loaded).
ran = (implementation if implementation != "auto" else keras_yoso.ops.implementation_in_use()) \
    if attention == "yoso" and method != "yoso-e" else "-"

if backend == "tensorflow":
    import tensorflow as tf
    forward = tf.function(lambda: run(x, False))
    @tf.function
    def forward_backward():
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = run(x, True)
            loss = tf.reduce_sum(y * y)
        return tape.gradient(loss, [x] + model.trainable_variables)
    finish = lambda out: [t.numpy() for t in tf.nest.flatten(out)]
elif backend == "jax":
    import jax
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]
    def apply(trainable, xs, training):
        if num_layers == 0:
            return model.stateless_call(trainable, non_trainable, xs, xs, training=training)[0]
        return model.stateless_call(trainable, non_trainable, xs, training=training)[0]
    jit_forward = jax.jit(lambda t, xs: apply(t, xs, False))
    jit_grad = jax.jit(jax.grad(lambda t, xs: (apply(t, xs, True) ** 2).sum(), argnums=(0, 1)))
    forward = lambda: jit_forward(trainable, x)
    forward_backward = lambda: jit_grad(trainable, x)
    finish = lambda out: jax.block_until_ready(out)
else:  # torch
    import torch
    x.requires_grad_(True)
    def forward():
        with torch.no_grad():
            return run(x, False)
    def forward_backward():
        loss = (run(x, True) ** 2).sum()
        return torch.autograd.grad(loss, [x] + [v.value for v in model.trainable_variables])
    finish = lambda out: out

def median_seconds(fn):
    finish(fn())  # warm-up (and compilation)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        finish(fn())
        times.append(time.perf_counter() - start)
    return float(np.median(times))
forward_s = median_seconds(forward)
seconds = median_seconds(forward_backward)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
print(json.dumps({"forward_s": forward_s, "seconds": seconds, "peak_rss_mib": peak, "implementation": ran}))
"""


def multiply_adds(method, length, heads, key_dim, hash_code_len=8):
    """Multiply-adds of one forward+backward step of one layer (yoso-m and mha only, else None).

    Projections: 4 dense [width, width] maps, x3 for forward, dX and dW. MHA core, per head:
    QK^T and PV forward, dV, dP, dQ and dK backward, 6 n^2 key_dim. YOSO-m core, per head and
    hash: lsh_cumulation forward and its transpose for dV (4 n key_dim), and the fused lower-bound
    backward (dQ and dK, the primitive lower_bound_gradients). It takes, per bucket of n_b queries
    and n_b keys (uniform codes: n_b = n / 2^tau), the cheaper of the pair products n_b^2 (W + 2 D)
    (each pair's weight once, applied to both sides) and the two tables' 4 n_b W D (W = D =
    key_dim), as the CPU kernel does. Hashing (sign bits of Hadamard transforms: additions) is not
    counted.
    """
    width = heads * key_dim
    projections = 3 * 4 * length * width * width
    if method == "mha":
        return projections + heads * 6 * length * length * key_dim
    if not method.startswith("yoso-") or method == "yoso-e":
        return None
    num_hashes, buckets = int(method.split("-")[1]), 2 ** hash_code_len
    per_bucket = length / buckets
    backward = buckets * min(per_bucket ** 2 * 3 * key_dim, 4 * per_bucket * key_dim * key_dim)
    return projections + heads * num_hashes * (4 * length * key_dim + backward)


def run_one(backend, method, implementation, length, repeats, heads, key_dim, num_layers, timeout):
    return run_isolated(_CHILD, [backend, method, implementation, length, repeats, heads, key_dim, num_layers],
                        timeout)


def _configurations(args):
    """(backend, method, implementation) rows: YOSO methods once per --implementations, others once."""
    for backend in args.backends:
        for method in args.methods:
            yoso_lsh = method.startswith("yoso-") and method != "yoso-e"
            implementations = args.implementations if yoso_lsh else ["auto"]
            for implementation in implementations:
                yield backend, method, implementation


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384, 32768])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--backends", nargs="+", default=["tensorflow"], choices=("tensorflow", "jax", "torch"),
                        help="Keras backends, each in its own processes (default: tensorflow)")
    parser.add_argument("--implementations", nargs="+", default=["auto"], choices=("auto", "custom_op", "composite"),
                        help="YosoAttention implementation(s) of the yoso-m methods; the table says which ran")
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
        args.lengths, args.repeats, args.heads, args.key_dim = [128], 1, 2, 8  # one child per method (CI time)
        args.methods = ["yoso-16", "linear-relative-causal", "mha"]
        args.num_layers = 2
    num_layers = args.num_layers if args.model else 0
    name = "scaling_model" if args.model else "scaling"
    yoso_lsh = any(m.startswith("yoso-") and m != "yoso-e" for m in args.methods)
    announce_package(args.backends, expect_custom_ops=yoso_lsh and set(args.implementations) != {"composite"})

    results = []
    print(f"{'backend':<11} {'method':<22} {'YOSO ops':<10} {'length':>7} {'fwd s':>8} {'fwd+bwd s':>10} "
          f"{'peak MiB':>9}  status", flush=True)
    configurations = list(_configurations(args))
    for length in args.lengths:
        for backend, method, implementation in configurations:
            r = run_one(backend, method, implementation, length, args.repeats, args.heads, args.key_dim, num_layers,
                        args.timeout)
            r.update(backend=backend, method=method, requested=implementation, length=length)
            r.setdefault("implementation", implementation if method.startswith("yoso-") else "-")
            results.append(r)
            fwd = f"{r['forward_s']:.3f}" if r["status"] == "ok" else "-"
            secs = f"{r['seconds']:.3f}" if r["status"] == "ok" else "-"
            mem = f"{r['peak_rss_mib']:.0f}" if r["status"] == "ok" else "-"
            print(f"{backend:<11} {method:<22} {r['implementation']:<10} {length:>7} {fwd:>8} {secs:>10} {mem:>9}  "
                  f"{r['status']}", flush=True)

    def label(r):
        return f"{r['backend']} {r['method']}" + (f" ({r['implementation']})" if r["implementation"] != "-" else "")

    ok = {(label(r), r["length"]): r for r in results if r["status"] == "ok"}
    for r in results:
        mha = ok.get((f"{r['backend']} mha", r["length"]))
        if r["status"] != "ok" or r["method"] == "mha" or mha is None:
            continue
        macs = [multiply_adds(m, r["length"], args.heads, args.key_dim) for m in (r["method"], "mha")]
        arithmetic = f", multiply-add ratio {macs[1] / macs[0]:.1f}x" if None not in macs and not args.model else ""
        print(f"{label(r)} vs mha at {r['length']}: speedup {mha['seconds'] / r['seconds']:.2f}x, "
              f"{r['peak_rss_mib'] / mha['peak_rss_mib']:.2f}x the peak memory{arithmetic}")
    labels = list(dict.fromkeys(label(r) for r in results))

    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, f"{name}.json"), "w") as f:
        json.dump({"config": vars(args), "results": results}, f, indent=2)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name_ in labels:
        pts = sorted((L, ok[(name_, L)]) for L in args.lengths if (name_, L) in ok)
        if pts:
            axes[0].loglog([p[0] for p in pts], [p[1]["seconds"] for p in pts], "o-", label=name_)
            axes[1].loglog([p[0] for p in pts], [p[1]["peak_rss_mib"] for p in pts], "o-", label=name_)
    axes[0].set(xlabel="sequence length", ylabel="forward+backward time (s)", title="time")
    axes[1].set(xlabel="sequence length", ylabel="peak RSS (MiB)", title="memory")
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8)  # outside the curves
    what = (f"{num_layers} encoder blocks, width {args.heads * args.key_dim}" if args.model
            else "one attention layer")
    fig.suptitle(f"{what}, batch 1, {args.heads} heads, key_dim {args.key_dim}, CPU")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out_dir, f"{name}.png"), dpi=120)
    print("wrote", os.path.join(args.out_dir, f"{name}.png"))


if __name__ == "__main__":
    main()
