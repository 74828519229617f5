"""YOSO (native and composite, bidirectional and causal) and LinearRelative attention under
keras_yoso.distribution.SequenceParallel on 8 virtual CPU devices: outputs and gradients equal one
device within mesh_comparison.TOL, the sequence is split (the compiled HLO holds a collective), and
every native call sees its device's block of the sequence, never the whole sequence.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 KERAS_BACKEND=jax \
        python tests/programs/sequence_parallel_ops.py MESH CASE [CASE ...]

MESH is "DxS" (D devices on the batch axis, S on the sequence axis); each CASE (a name of CASES)
runs and reports on its own (program_cases.run_cases).
"""

import sys

import jax
import numpy as np

import keras_yoso
from keras_yoso import ops as yops
from keras_yoso.ops.parallel import yoso_tables
from mesh_comparison import TOL, max_diff, mesh_of, native_shapes
from program_cases import run_cases

B, N, d, m, tau, horizon = 4, 64, 6, 3, 3, 3  # distinct dims: the HLO check tells them apart
rng = np.random.default_rng(0)


def unit(x):
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype("float32")


q, k = unit(rng.normal(size=(B, N, d))), unit(rng.normal(size=(B, N, d)))
v = rng.normal(size=(B, N, d)).astype("float32")
rel = rng.normal(size=(2 * horizon + 1, d)).astype("float32")
cotangent = rng.normal(size=(B, N, d)).astype("float32")
mask = np.ones((B, N), bool)
mask[1, N - 5:] = False      # padding at the end of the last shard
mask[3, N - 12:] = False     # and reaching into the one before (1x8, 2x4)


def yoso(impl, causal):
    def f(q, k, v):
        qc = yops.hash_codes(q, m, tau, 7, implementation=impl)
        kc = yops.hash_codes(k, m, tau, 7, implementation=impl)
        return yops.yoso_cumulation(q, k, v, qc, kc, tau, mask, mask, implementation=impl, causal=causal)
    return f


def linear(causal, with_horizon):
    def f(q, k, v):
        return yops.linear_relative_attention(q, k, v, rel if with_horizon else None, horizon if with_horizon else None,
                                              causal, mask, mask, chunk_size=4)
    return f


def forward_backward(f, cotangent):
    def run(q, k, v):
        out, vjp = jax.vjp(f, q, k, v)
        return (out,) + vjp(cotangent)
    return run


def self_attention(f, native):
    """f on the 64 queries and keys: equal to one device, the sequence split, native calls per block."""
    def check(mesh, dist):
        run = forward_backward(f, cotangent)
        want = jax.jit(run)(q, k, v)
        with dist.scope():
            mapped = jax.jit(lambda q, k, v: run(q, k, v))   # a new function: traced under the mesh
            got = mapped(q, k, v)
            text = mapped.lower(q, k, v).compile().as_text()
        diff = max_diff(want, got)
        assert diff <= TOL, diff
        collectives = [c for c in ("all-reduce", "collective-permute", "all-gather") if c in text]
        seq = mesh.shape[1]
        if seq > 1:
            assert collectives, "no collective: the sequence was not split"
        if native:
            shapes = native_shapes(text)
            assert shapes, "no native call in the compiled HLO"
            # Every native call sees its device's block: N / seq positions, never the whole sequence.
            lengths = ({s[-1] for s in shapes if len(s) == 3 and s[1] == m}
                       | {s[1] for s in shapes if len(s) == 3 and s[2] == d})
            assert lengths == {N // seq}, (lengths, shapes)
        print("  max diff", diff, collectives)
    return check


def cross_attention(f):
    """f with 32 queries over the 64 keys (each side in blocks of its own length): equal to one device."""
    def check(mesh, dist):
        run = forward_backward(f, cotangent[:, :32])
        short = q[:, :32]
        want = jax.jit(run)(short, k, v)
        with dist.scope():
            got = jax.jit(lambda q, k, v: run(q, k, v))(short, k, v)
        assert max_diff(want, got) <= TOL, max_diff(want, got)
    return check


def small_limits(mesh, dist):
    """Small limits: the tables in several hash groups (one collective each), positions in several chunks."""
    limits = yoso_tables.TABLE_FLOATS_PER_COLLECTIVE, yoso_tables.CHUNK_FLOATS
    yoso_tables.TABLE_FLOATS_PER_COLLECTIVE, yoso_tables.CHUNK_FLOATS = 2 ** 8, 2 ** 6
    try:
        for causal in (False, True):
            run = forward_backward(yoso("custom_op", causal), cotangent)
            want = jax.jit(run)(q, k, v)
            with dist.scope():
                got = jax.jit(lambda q, k, v: run(q, k, v))(q, k, v)
            assert max_diff(want, got) <= TOL, (causal, max_diff(want, got))
    finally:
        yoso_tables.TABLE_FLOATS_PER_COLLECTIVE, yoso_tables.CHUNK_FLOATS = limits


CASES = {
    "yoso_native": self_attention(yoso("custom_op", False), native=True),
    "yoso_composite": self_attention(yoso("composite", False), native=False),
    "yoso_causal_native": self_attention(yoso("custom_op", True), native=True),
    "yoso_causal_composite": self_attention(yoso("composite", True), native=False),
    "linear_relative": self_attention(linear(False, True), native=False),
    "linear_relative_causal": self_attention(linear(True, True), native=False),
    "linear_causal_no_horizon": self_attention(linear(True, False), native=False),
    "yoso_cross": cross_attention(lambda q, k, v: yops.yoso_cumulation(
        q, k, v, yops.hash_codes(q, m, tau, 7), yops.hash_codes(k, m, tau, 7), tau, None, mask)),
    "linear_cross": cross_attention(lambda q, k, v: yops.linear_relative_attention(q, k, v, key_mask=mask)),
    "linear_relative_cross_sequence_kept_whole": cross_attention(lambda q, k, v: yops.linear_relative_attention(
        q, k, v, rel, horizon, key_mask=mask)),
    "yoso_small_table_and_chunk_limits": small_limits,
}


if __name__ == "__main__":
    mesh = mesh_of(sys.argv[1])
    run_cases(CASES, sys.argv[2:], mesh, keras_yoso.distribution.SequenceParallel(mesh))
