"""Where one YosoAttention layer's forward+backward time goes, part by part, on TensorFlow.

Times, each alone in a `tf.function` (median of --repeats after a warm-up): the whole layer and
keras.layers.MultiHeadAttention (4 heads x 64, width 256, batch 1, training=True), the four
256 x 256 projections forward+backward, the hash codes of queries and keys (m = 32, tau = 8,
the default Hadamard hashing), `yoso_cumulation` forward and forward+backward (lower bound,
eq. 4) on [4, n, 64], eq. 4's dQ and dK alone (the native provider's `lower_bound_gradients`:
one fused pass since 2026-11-26, two weighted cumulations before) and one
`weighted_lsh_cumulation`. Prints a table and writes layer_profile.png (a bar per part).

With --baseline TREE it profiles, in alternating fresh processes (--rounds each), the installed
keras_yoso and the one in the source tree TREE (its libraries built in place, imported through
PYTHONPATH), and prints both columns and their ratio per part (the median over rounds).

    python benchmarks/layer_profile.py --length 4096
    python benchmarks/layer_profile.py --length 4096 --baseline ../before --rounds 3
"""

import argparse
import json
import os
import subprocess
import sys

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

    from keras_yoso.ops import _dispatch

    provider = _dispatch.provider("custom_op", (q,))
    keep = tf.ones((4, length), tf.float32)
    # The native provider's eq. 4 backward (dQ, dK): the same call in trees before and after the fusion.
    lower_bound = tf.function(lambda: provider.lower_bound_gradients(keep, qc, q, keep, kc, k, v, v, 256, 4.0))

    return [("YosoAttention fwd+bwd", fwd_bwd(keras_yoso.YosoAttention(4, 64, num_hashes=32, hash_code_len=8,
                                                                     seed=1))),
            ("MultiHeadAttention fwd+bwd", fwd_bwd(keras.layers.MultiHeadAttention(4, 64))),
            ("4 projections fwd+bwd", projections),
            ("hash codes of q and k", hashes),
            ("yoso_cumulation fwd", tf.function(lambda: ops.yoso_cumulation(q, k, v, qc, kc, 8))),
            ("yoso_cumulation fwd+bwd", cumulation),
            ("eq. 4 dQ and dK", lower_bound),
            ("one weighted_lsh_cumulation", tf.function(lambda: ops.weighted_lsh_cumulation(qc, v, kc, v, k, 256)))]


def profile(length, repeats):
    """[(part, seconds)] of this process's keras_yoso."""
    return [(name, median_seconds(fn, repeats)) for name, fn in parts(length)]


def profile_in_process(tree, args):
    """profile() in a fresh process of the installed keras_yoso (tree None) or of TREE's."""
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    if tree is not None:
        env["PYTHONPATH"] = tree
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--length", str(args.length), "--repeats",
                           str(args.repeats), "--json"], capture_output=True, text=True, env=env,
                          cwd=os.path.dirname(os.path.abspath(__file__)))
    if proc.returncode != 0:
        sys.exit(f"profiling {tree or 'the installed keras_yoso'} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--baseline", default=None, metavar="TREE",
                        help="also profile the keras_yoso of this source tree, in alternating processes")
    parser.add_argument("--rounds", type=int, default=3, help="processes per package with --baseline")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = parser.parse_args()
    os.environ["KERAS_BACKEND"] = "tensorflow"
    if args.json:
        import keras_yoso

        print(json.dumps({"path": os.path.dirname(keras_yoso.__file__), "parts": profile(args.length, args.repeats)}))
        return
    if args.baseline:
        packages = [("now", None), ("before", os.path.abspath(args.baseline))]
        runs = {label: [] for label, _ in packages}
        for _ in range(args.rounds):
            for label, tree in packages:
                result = profile_in_process(tree, args)
                runs[label].append(dict(result["parts"]))
                if len(runs[label]) == 1:
                    print(f"{label}: keras_yoso from {result['path']}", flush=True)
        names = list(runs["now"][0])  # in profile()'s order
        columns = {label: {n: sorted(r[n] for r in runs[label])[len(runs[label]) // 2] for n in names}
                   for label in runs}
    else:
        import keras_yoso
        from isolated_run import package_banner

        print(package_banner(os.path.dirname(keras_yoso.__file__), keras_yoso.ops.custom_ops_load_error()), flush=True)
        rows = profile(args.length, args.repeats)
        names = [name for name, _ in rows]
        columns = {"now": dict(rows)}
    print(f"n = {args.length}")
    header = f"{'part':<30} " + " ".join(f"{label:>10}" for label in columns)
    print(header + ("   before / now" if args.baseline else ""))
    for name in names:
        cells = " ".join(f"{columns[label][name] * 1000:7.1f} ms" for label in columns)
        ratio = f"   {columns['before'][name] / columns['now'][name]:8.2f}x" if args.baseline else ""
        print(f"{name:<30} {cells}{ratio}", flush=True)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    height = 0.8 / len(columns)
    rows = [len(names) - 1 - j for j in range(len(names))]  # the first part on top
    for i, (label, column) in enumerate(columns.items()):
        ax.barh([y + i * height for y in rows], [column[n] * 1000 for n in names], height=height, label=label)
    ax.set_yticks([y + (len(columns) - 1) * height / 2 for y in rows], names)
    ax.set_xlabel("milliseconds (median)")
    ax.set_title(f"One YosoAttention layer on TensorFlow, n = {args.length}")
    if args.baseline:
        ax.legend()
    fig.tight_layout()
    os.makedirs(args.out_dir, exist_ok=True)
    path = os.path.join(args.out_dir, "layer_profile.png")
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
