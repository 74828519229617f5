"""CPU timing of the YOSO ops: custom op vs the keras.ops composite, side by side in one process.

Times the forward `lsh_cumulation` and one backward step of `yoso_cumulation`
(both estimators) at the shapes of the core-ops issue, prints a table, writes
`ops_timing.json` and a bar chart `ops_timing.png`.

    python benchmarks/ops_timing.py [--length 4096 --num-hashes 32 --hash-code-len 8
                                     --value-dim 64 --batch 4 --repeats 5 --out-dir benchmarks/results]

It first prints which keras_yoso it measures and, when the custom ops are not loaded, a line starting
with "!!": then only the composite is timed.
"""

import argparse
import json
import os
import platform
import time

import numpy as np
import tensorflow as tf

import keras_yoso
from keras_yoso import ops

from isolated_run import package_banner


def _timed(fn, repeats):
    fn()  # warm-up (tracing, allocations)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times)), float(np.min(times))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--num-hashes", type=int, default=32)
    parser.add_argument("--hash-code-len", type=int, default=8)
    parser.add_argument("--value-dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out-dir", default=os.path.join(os.path.dirname(__file__), "results"))
    args = parser.parse_args()
    print(package_banner(os.path.dirname(keras_yoso.__file__), ops.custom_ops_load_error()), flush=True)

    n, m, tau, d, b = args.length, args.num_hashes, args.hash_code_len, args.value_dim, args.batch
    rng = np.random.default_rng(0)
    unit = lambda x: (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)
    q, k = tf.constant(unit(rng.normal(size=(b, n, d)))), tf.constant(unit(rng.normal(size=(b, n, d))))
    v = tf.constant(rng.normal(size=(b, n, d)).astype(np.float32))
    dy = tf.constant(rng.normal(size=(b, n, d)).astype(np.float32))
    qc, kc = ops.hash_codes(q, m, tau, seed=1), ops.hash_codes(k, m, tau, seed=1)

    impls = ["custom_op", "composite"] if ops.custom_ops_available() else ["composite"]
    rows = []
    for impl in impls:
        forward = tf.function(lambda: ops.lsh_cumulation(qc, kc, v, 2 ** tau, implementation=impl))
        hashing = tf.function(lambda: ops.hash_codes(q, m, tau, seed=1, method="hadamard", implementation=impl))
        rows.append((impl, "hash_codes (hadamard)", *_timed(hashing, args.repeats)))
        rows.append((impl, "lsh_cumulation forward", *_timed(forward, args.repeats)))
        for backward in ("lower_bound", "collision"):
            if impl == "composite" and backward == "collision" and b * n * n * 4 * 6 > 8e9:
                rows.append((impl, f"backward ({backward})", float("nan"), float("nan")))
                continue

            @tf.function
            def step(backward=backward):
                with tf.GradientTape() as tape:
                    tape.watch([q, k, v])
                    out = ops.yoso_cumulation(q, k, v, qc, kc, tau, backward=backward, implementation=impl)
                return tape.gradient(out, [q, k, v], output_gradients=dy)

            rows.append((impl, f"backward ({backward})", *_timed(step, args.repeats)))

    header = f"B={b} n={n} m={m} tau={tau} D={d}, {os.cpu_count()} CPU threads, TF {tf.__version__}"
    print(header)
    print(f"{'implementation':<12} {'operation':<26} {'median ms':>10} {'min ms':>10}")
    for impl, name, med, best in rows:
        print(f"{impl:<12} {name:<26} {med * 1e3:>10.1f} {best * 1e3:>10.1f}")
    if len(impls) == 2:
        for name in {r[1] for r in rows}:
            c = next(r[2] for r in rows if r[0] == "custom_op" and r[1] == name)
            p = next(r[2] for r in rows if r[0] == "composite" and r[1] == name)
            if np.isfinite(p):
                print(f"speed-up of the custom op, {name}: {p / c:.1f}x")

    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "ops_timing.json"), "w") as f:
        json.dump({"config": vars(args), "machine": platform.platform(), "cpus": os.cpu_count(),
                   "rows": [dict(implementation=i, operation=o, median_s=m_, min_s=b_) for i, o, m_, b_ in rows]},
                  f, indent=2)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: skipping ops_timing.png (pip install matplotlib)")
        return
    names = sorted({r[1] for r in rows})
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(impls)
    for idx, impl in enumerate(impls):
        vals = [next(r[2] for r in rows if r[0] == impl and r[1] == nm) * 1e3 for nm in names]
        ax.bar(np.arange(len(names)) + idx * width, vals, width, label=impl)
    ax.set_xticks(np.arange(len(names)) + width * (len(impls) - 1) / 2, names, rotation=15, fontsize=8)
    ax.set_ylabel("median time (ms)")
    ax.set_yscale("log")
    ax.set_title(header, fontsize=8)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(args.out_dir, "ops_timing.png"), dpi=120)
    print("wrote", os.path.join(args.out_dir, "ops_timing.png"))


if __name__ == "__main__":
    main()
