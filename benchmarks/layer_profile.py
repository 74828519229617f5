"""Where one YosoAttention layer's forward+backward time goes, part by part, on TensorFlow.

Times, each alone in a `tf.function` (median of --repeats after a warm-up): the whole layer and
keras.layers.MultiHeadAttention (4 heads x 64, width 256, batch 1, training=True), the four
256 x 256 projections forward+backward, the hash codes of queries and keys (m = 32, tau = 8,
Hadamard), `yoso_cumulation` forward and forward+backward (lower bound, eq. 4) on [4, n, 64],
and one `weighted_lsh_cumulation` (one of the two that eq. 4's dQ and dK take). Prints a table
and writes layer_profile.png (a bar per part).

    python benchmarks/layer_profile.py --length 4096
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from isolated_run import median_seconds  # noqa: E402


def parts(length):
    """[(name, zero-argument tf.function)] of the parts to time."""
    import keras
    import numpy as np
    import tensorflow as tf

    import keras_yoso
    from keras_yoso import ops

    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((1, length, 256)).astype("float32"))

    def fwd_bwd(layer):
        layer(x, x)

        @tf.function
        def run():
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = layer(x, x, training=True)
                loss = tf.reduce_sum(y * y)
            return tape.gradient(loss, [x] + layer.trainable_variables)
        return run

    def unit(shape):
        return tf.math.l2_normalize(tf.constant(rng.standard_normal(shape).astype("float32")), -1)

    q, k = unit((4, length, 64)), unit((4, length, 64))
    v = tf.constant(rng.standard_normal((4, length, 64)).astype("float32"))
    hashes = tf.function(lambda: (ops.hash_codes(q, 32, 8, 1), ops.hash_codes(k, 32, 8, 1)))
    qc, kc = hashes()
    weights = [tf.Variable(rng.standard_normal((256, 256)).astype("float32") * 0.05) for _ in range(4)]

    @tf.function
    def projections():
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = sum(tf.reduce_sum(tf.einsum("btd,de->bte", x, w) ** 2) for w in weights)
        return tape.gradient(loss, [x] + weights)

    @tf.function
    def cumulation():
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            loss = tf.reduce_sum(ops.yoso_cumulation(q, k, v, qc, kc, 8) ** 2)
        return tape.gradient(loss, [q, k, v])

    return [("YosoAttention fwd+bwd", fwd_bwd(keras_yoso.YosoAttention(4, 64, num_hashes=32, hash_code_len=8,
                                                                     seed=1))),
            ("MultiHeadAttention fwd+bwd", fwd_bwd(keras.layers.MultiHeadAttention(4, 64))),
            ("4 projections fwd+bwd", projections),
            ("hash codes of q and k", hashes),
            ("yoso_cumulation fwd", tf.function(lambda: ops.yoso_cumulation(q, k, v, qc, kc, 8))),
            ("yoso_cumulation fwd+bwd", cumulation),
            ("one weighted_lsh_cumulation", tf.function(lambda: ops.weighted_lsh_cumulation(qc, v, kc, v, k, 256)))]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = parser.parse_args()
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import keras_yoso
    from isolated_run import package_banner

    print(package_banner(os.path.dirname(keras_yoso.__file__), keras_yoso.ops.custom_ops_load_error()), flush=True)
    rows = [(name, median_seconds(fn, args.repeats)) for name, fn in parts(args.length)]
    print(f"n = {args.length}")
    for name, seconds in rows:
        print(f"{name:<30} {seconds * 1000:9.1f} ms", flush=True)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.barh([name for name, _ in rows][::-1], [s * 1000 for _, s in rows][::-1])
    ax.set_xlabel("milliseconds (median)")
    ax.set_title(f"One YosoAttention layer on TensorFlow, n = {args.length}")
    fig.tight_layout()
    os.makedirs(args.out_dir, exist_ok=True)
    path = os.path.join(args.out_dir, "layer_profile.png")
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
