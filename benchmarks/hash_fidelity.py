"""Does the hash give the paper's kernel, and what does it cost? The hash methods side by side.

YOSO's attention weight is the probability that a query's and a key's codes collide, which the
paper takes to be (1 - theta/pi)^tau for vectors at angle theta (eq. 1; tau sign bits of independent
random hyperplanes). This script measures, for each `keras_yoso.ops.hash_codes` method:

1. the collision rate against that formula over head sizes, tau and angles (the mean over
   `--draws` int seeds of 32 hashes x `--pairs` random pairs per angle), printed as measured /
   formula with its standard error, plotted per head size;
2. the hashing time of the native kernels (implementation="custom_op") at `--length` rows of each
   head size, m = 32, tau = 8, median of `--repeats`, and the ratio of each method to "hadamard"
   (the default before 2026-11) measured in the same process;
3. the forward + backward time of a YosoAttention layer (default settings) with each method.

    python benchmarks/hash_fidelity.py [--dims 8 16 64 128] [--draws 16] [--repeats 7] [--out-dir DIR]

Writes hash_fidelity.json and hash_fidelity.png. Run it on a quiet machine for the timings.
"""

import argparse
import json
import os
import platform
import time

import keras
import numpy as np

import keras_yoso
from keras_yoso import ops

from isolated_run import median_seconds, package_banner

METHODS = ("hadamard", "hadamard_interleaved", "gaussian")
ANGLES = (0.25, 0.5, 1.0, 1.5, 2.0)


def pairs_at_angle(rng, count, dim, theta):
    """Two [count, dim] float32 arrays of unit rows, row i of the second at angle theta to row i of the first."""
    a = rng.normal(size=(count, dim))
    a /= np.linalg.norm(a, axis=-1, keepdims=True)
    r = rng.normal(size=(count, dim))
    r -= (r * a).sum(-1, keepdims=True) * a
    r /= np.linalg.norm(r, axis=-1, keepdims=True)
    return a.astype(np.float32), (np.cos(theta) * a + np.sin(theta) * r).astype(np.float32)


def collision_ratios(dim, tau, method, draws, pairs, num_hashes=32):
    """(measured / formula, standard error of that ratio, formula) per angle of ANGLES."""
    rng = np.random.default_rng(dim * 100 + tau)
    rates = []
    for seed in range(draws):
        sides = [pairs_at_angle(rng, pairs, dim, theta) for theta in ANGLES]
        x = np.concatenate([np.concatenate(side) for side in sides])[None]
        codes = keras.ops.convert_to_numpy(ops.hash_codes(x, num_hashes, tau, seed=seed, method=method))
        codes = codes[0].reshape(num_hashes, len(ANGLES), 2, pairs)
        rates.append((codes[:, :, 0] == codes[:, :, 1]).mean(axis=(0, 2)))
    rates = np.array(rates)
    formula = (1 - np.array(ANGLES) / np.pi) ** tau
    return rates.mean(0) / formula, rates.std(0, ddof=1) / np.sqrt(draws) / formula, formula


def hashing_seconds(dim, method, length, repeats):
    x = np.random.default_rng(0).normal(size=(1, length, dim)).astype(np.float32)
    return median_seconds(lambda: keras.ops.convert_to_numpy(
        ops.hash_codes(x, 32, 8, seed=1, method=method, implementation="custom_op")), repeats)


def layer_seconds(dim, method, length, repeats):
    """Forward + backward of YosoAttention(4 heads of `dim`, training=True) on [2, length, 4 dim]."""
    layer = keras_yoso.layers.YosoAttention(4, dim, hash_method=method, seed=0)
    x = keras.ops.convert_to_tensor(np.random.default_rng(0).normal(size=(2, length, 4 * dim)).astype(np.float32))
    layer(x, x)
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        def loss(weights, x):
            out, _ = layer.stateless_call(weights, [v.value for v in layer.non_trainable_variables], x, x,
                                          training=True)
            return (out ** 2).mean()

        step = jax.jit(jax.grad(loss))
        weights = [v.value for v in layer.trainable_variables]
        return median_seconds(lambda: jax.block_until_ready(step(weights, x)), repeats)
    if backend == "tensorflow":
        import tensorflow as tf

        def step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(layer(x, x, training=True) ** 2)
            return tape.gradient(loss, layer.trainable_variables)

        return median_seconds(step, repeats)
    import torch

    def step():
        layer.zero_grad()
        (layer(x, x, training=True) ** 2).mean().backward()

    return median_seconds(step, repeats)


def plot(fidelity, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dims = sorted({r["dim"] for r in fidelity})
    fig, axes = plt.subplots(1, len(dims), figsize=(3.2 * len(dims), 3.2), sharey=True)
    styles = {"hadamard": "s--", "hadamard_interleaved": "^-", "gaussian": "o:"}
    for ax, dim in zip(np.atleast_1d(axes), dims):
        for r in fidelity:
            if r["dim"] == dim and r["tau"] == 8:
                ax.errorbar(ANGLES, r["ratio"], yerr=r["error"], fmt=styles[r["method"]], label=r["method"],
                            capsize=2)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_title(f"head size {dim}, tau 8")
        ax.set_xlabel("angle theta (rad)")
    np.atleast_1d(axes)[0].set_ylabel("collision rate / (1 - theta/pi)^tau")
    np.atleast_1d(axes)[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dims", type=int, nargs="+", default=[8, 16, 64, 128])
    parser.add_argument("--taus", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--draws", type=int, default=16)
    parser.add_argument("--pairs", type=int, default=256)
    parser.add_argument("--length", type=int, default=16384, help="rows hashed per timing")
    parser.add_argument("--layer-length", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out-dir", default=os.path.join(os.path.dirname(__file__), "results"))
    args = parser.parse_args()
    print(package_banner(os.path.dirname(keras_yoso.__file__), ops.custom_ops_load_error()), flush=True)
    os.makedirs(args.out_dir, exist_ok=True)

    fidelity = []
    print("\ncollision rate / (1 - theta/pi)^tau (+- standard error); angles " + ", ".join(map(str, ANGLES)))
    for dim in args.dims:
        for tau in args.taus:
            for method in METHODS:
                ratio, error, formula = collision_ratios(dim, tau, method, args.draws, args.pairs)
                fidelity.append({"dim": dim, "tau": tau, "method": method, "ratio": ratio.tolist(),
                                 "error": error.tolist(), "formula": formula.tolist()})
                cells = "  ".join(f"{r:5.3f}+-{e:5.3f}" if f > 1e-3 else "    (p<1e-3)" for r, e, f in
                                  zip(ratio, error, formula))
                print(f"d={dim:<4} tau={tau:<3} {method:<21} {cells}", flush=True)

    timing = []
    print(f"\nhash_codes custom_op, {args.length} rows, m=32, tau=8 (median of {args.repeats}; ms)")
    for dim in args.dims:
        row = {"dim": dim, **{m: 1e3 * hashing_seconds(dim, m, args.length, args.repeats) for m in METHODS}}
        timing.append(row)
        print(f"d={dim:<4} " + "  ".join(f"{m} {row[m]:7.2f}" for m in METHODS)
              + f"   interleaved / hadamard {row['hadamard_interleaved'] / row['hadamard']:.2f}x", flush=True)

    layers = []
    print(f"\nYosoAttention forward+backward, 4 heads, batch 2 x {args.layer_length} "
          f"({keras.backend.backend()}; median of {args.repeats}; ms)")
    for dim in args.dims:
        row = {"dim": dim, **{m: 1e3 * layer_seconds(dim, m, args.layer_length, args.repeats) for m in METHODS}}
        layers.append(row)
        print(f"head {dim:<4} " + "  ".join(f"{m} {row[m]:8.1f}" for m in METHODS)
              + f"   interleaved / hadamard {row['hadamard_interleaved'] / row['hadamard']:.2f}x", flush=True)

    record = {"backend": keras.backend.backend(), "machine": platform.processor() or platform.machine(),
              "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d"), "args": vars(args),
              "fidelity": fidelity, "hashing_ms": timing, "layer_ms": layers}
    with open(os.path.join(args.out_dir, "hash_fidelity.json"), "w") as f:
        json.dump(record, f, indent=1)
    plot(fidelity, os.path.join(args.out_dir, "hash_fidelity.png"))
    print(f"\nwrote {args.out_dir}/hash_fidelity.json and hash_fidelity.png")


if __name__ == "__main__":
    main()
