"""Causal against bidirectional YOSO: one YosoAttention layer's forward+backward, and the core op.

For each length (--lengths), times side by side in one process (median of --repeats after a
warm-up, the two variants alternating so that machine noise hits both): one YosoAttention layer
(4 heads x 64, width 256, batch 1, m = 32, tau = 8, training=True) forward+backward with
use_causal_mask=True and without, and `keras_yoso.ops.yoso_cumulation` forward+backward on
[4, n, 64] with causal=True and False. Runs on the backend of KERAS_BACKEND with
`--implementation` (default "auto": the native kernels). Prints a table with the causal /
bidirectional ratio (target: <= 1.5) and writes causal_yoso.png and causal_yoso.json.

    KERAS_BACKEND=jax python benchmarks/causal_yoso.py --lengths 4096 16384
"""

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _gradient_runner(fn, inputs):
    """A zero-argument function computing the gradients of sum(fn(*inputs)^2) with respect to `inputs` (and
    the variables fn reads), compiled where the backend allows it."""
    import keras

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        tensors = [tf.constant(x) for x in inputs]

        @tf.function
        def run():
            with tf.GradientTape() as tape:
                tape.watch(tensors)
                loss = tf.reduce_sum(fn(*tensors) ** 2)
            return tape.gradient(loss, tensors)
        return run
    if backend == "jax":
        import jax

        grad = jax.jit(jax.grad(lambda *xs: (fn(*xs) ** 2).sum(), argnums=tuple(range(len(inputs)))))
        arrays = [jax.numpy.asarray(x) for x in inputs]
        return lambda: jax.block_until_ready(grad(*arrays))
    import torch

    tensors = [torch.tensor(x, requires_grad=True) for x in inputs]

    def run():
        loss = (fn(*tensors) ** 2).sum()
        return torch.autograd.grad(loss, tensors)
    return run


def variants(length, implementation):
    """{(what, causal): zero-argument runner}."""
    import numpy as np

    import keras_yoso
    from keras_yoso import ops

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, length, 256)).astype("float32")
    unit = [rng.standard_normal((4, length, 64)).astype("float32") for _ in range(2)]
    q, k = [u / np.linalg.norm(u, axis=-1, keepdims=True) for u in unit]
    v = rng.standard_normal((4, length, 64)).astype("float32")
    qc = ops.hash_codes(q, 32, 8, 1, implementation=implementation)
    kc = ops.hash_codes(k, 32, 8, 1, implementation=implementation)
    runners = {}
    for causal in (False, True):
        layer = keras_yoso.YosoAttention(4, 64, num_hashes=32, hash_code_len=8, seed=1, implementation=implementation)
        layer(x[:, :8], x[:, :8])
        runners[("YosoAttention layer", causal)] = _gradient_runner(
            lambda t, layer=layer, causal=causal: layer(t, t, training=True, use_causal_mask=causal), [x])
        runners[("yoso_cumulation op", causal)] = _gradient_runner(
            lambda a, b, c, causal=causal: ops.yoso_cumulation(a, b, c, qc, kc, 8, implementation=implementation,
                                                               causal=causal), [q, k, v])
    return runners


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--implementation", default="auto", choices=("auto", "custom_op", "composite"))
    parser.add_argument("--out-dir", default=".")
    args = parser.parse_args()
    import keras

    from keras_yoso import ops

    backend = keras.backend.backend()
    rows = []
    for length in args.lengths:
        runners = variants(length, args.implementation)
        times = {key: [] for key in runners}
        for run in runners.values():
            run()  # warm-up / compile
        for _ in range(args.repeats):
            for key, run in runners.items():
                start = time.perf_counter()
                run()
                times[key].append(time.perf_counter() - start)
        for what in ("YosoAttention layer", "yoso_cumulation op"):
            bidirectional = sorted(times[(what, False)])[args.repeats // 2]
            causal = sorted(times[(what, True)])[args.repeats // 2]
            rows.append({"what": what, "length": length, "bidirectional_s": bidirectional, "causal_s": causal,
                         "ratio": causal / bidirectional})
    implementation = ops.implementation_in_use(args.implementation)
    print(f"backend {backend}, implementation {implementation}, fwd+bwd, median of {args.repeats}")
    print(f"{'what':<22} {'n':>7} {'bidirectional s':>16} {'causal s':>10} {'causal/bidir':>13}")
    for row in rows:
        print(f"{row['what']:<22} {row['length']:>7} {row['bidirectional_s']:>16.3f} {row['causal_s']:>10.3f} "
              f"{row['ratio']:>13.2f}")
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "causal_yoso.json"), "w") as f:
        json.dump({"backend": backend, "implementation": implementation, "rows": rows}, f, indent=2)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, what in zip(axes, ("YosoAttention layer", "yoso_cumulation op")):
        chosen = [r for r in rows if r["what"] == what]
        lengths = [r["length"] for r in chosen]
        ax.plot(lengths, [r["bidirectional_s"] for r in chosen], "o-", label="bidirectional")
        ax.plot(lengths, [r["causal_s"] for r in chosen], "s-", label="causal")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length n")
        ax.set_ylabel("fwd+bwd seconds")
        ax.set_title(f"{what} ({backend}, {implementation})")
        ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(args.out_dir, "causal_yoso.png"), dpi=120)
    print(f"wrote {os.path.join(args.out_dir, 'causal_yoso.png')} and causal_yoso.json")


if __name__ == "__main__":
    main()
