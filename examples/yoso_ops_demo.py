"""YOSO in a few lines: LSH attention converges to its expectation, in linear time.

Hashes random unit queries/keys, computes N-YOSO-m with `yoso_cumulation` for
growing numbers of hashes m and compares it with the exact expectation YOSO-E
(mean angle between the l2-normalized outputs, as in the paper's §4.4), then
times one forward+backward step at a long sequence length.

    python examples/yoso_ops_demo.py [--length 1024] [--long-length 16384]
"""

import argparse
import time

import numpy as np
import tensorflow as tf

from keras_yoso import ops


def mean_angle_degrees(a, b):
    a, b = tf.math.l2_normalize(a, -1), tf.math.l2_normalize(b, -1)
    cos = tf.clip_by_value(tf.reduce_sum(a * b, -1), -1.0, 1.0)
    return float(tf.reduce_mean(tf.acos(cos)) * 180.0 / np.pi)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=1024, help="sequence length of the accuracy check")
    parser.add_argument("--long-length", type=int, default=16384, help="sequence length of the timing")
    parser.add_argument("--hash-code-len", type=int, default=8)
    args = parser.parse_args()

    tau = args.hash_code_len
    print(f"custom ops loaded: {ops.custom_ops_available()}")
    gen = tf.random.Generator.from_seed(0)
    q = tf.math.l2_normalize(gen.normal([4, args.length, 32]), -1)
    # Keys near the queries so attention is peaked, as in a trained model.
    k = tf.math.l2_normalize(q + 0.5 * gen.normal([4, args.length, 32]) / np.sqrt(32.0), -1)
    v = gen.normal([4, args.length, 32])
    exact = ops.yoso_expectation(q, k, v, tau)
    print(f"\nN-YOSO-m vs N-YOSO-E, n={args.length}, tau={tau}: mean angle between outputs")
    for m in (8, 32, 128):
        qc, kc = ops.hash_codes(q, m, tau, seed=m), ops.hash_codes(k, m, tau, seed=m)
        approx = ops.yoso_cumulation(q, k, v, qc, kc, tau)
        print(f"  m={m:<4d} {mean_angle_degrees(approx, exact):6.2f} degrees")

    n = args.long_length
    q = tf.math.l2_normalize(gen.normal([4, n, 64]), -1)
    k = tf.math.l2_normalize(gen.normal([4, n, 64]), -1)
    v = gen.normal([4, n, 64])

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            qc, kc = ops.hash_codes(q, 32, tau, seed=1), ops.hash_codes(k, 32, tau, seed=1)
            y = ops.yoso_cumulation(q, k, v, qc, kc, tau)
        return y, tape.gradient(y, [q, k, v])

    step()
    start = time.perf_counter()
    y, grads = step()
    elapsed = time.perf_counter() - start
    dense_gib = 4 * n * n * 4 / 2 ** 30
    print(f"\nforward+backward, batch*heads=4, n={n}, d=64, m=32: {elapsed:.2f} s; output {tuple(y.shape)}, "
          f"finite gradients: {all(bool(tf.reduce_all(tf.math.is_finite(g))) for g in grads)}")
    print(f"(a dense attention matrix at this length would take {dense_gib:.1f} GiB per layer)")


if __name__ == "__main__":
    main()
