"""keras_yoso.ops.linear_relative_attention against the dense NumPy oracle of Scaleformer eq. 9-11, on
every backend (graph, XLA and memory tests: TensorFlow)."""

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

import numpy_reference as ref
from conftest import TENSORFLOW, cast, requires_tensorflow, to_numpy, vjp
from keras_yoso import ops

if TENSORFLOW:
    import tensorflow as tf

# name -> (batch, query_length, key_length, depth, value_depth, horizon)
SHAPES = {
    "equal_lengths": (2, 9, 9, 4, 3, 2),
    "fewer_queries": (2, 5, 11, 4, 3, 2),
    "more_queries": (2, 11, 5, 4, 3, 2),
    "keys_beyond_horizon": (1, 3, 12, 4, 2, 2),
    "shorter_than_horizon": (2, 3, 4, 3, 2, 5),
    "horizon_one": (3, 8, 8, 4, 3, 1),
    "single_position": (2, 1, 1, 3, 2, 2),
    "single_query": (2, 1, 7, 3, 2, 2),
    "single_key": (2, 6, 1, 3, 2, 2),
}
PADDINGS = ["none", "right", "left"]


def _padding_mask(kind, batch, length, rng):
    if kind == "none":
        return None
    lengths = rng.integers(0, length + 1, size=batch)
    lengths[0] = max(1, length - 1)  # at least one row with real padding and keys left
    positions = np.arange(length)[None, :]
    if kind == "right":
        return positions < lengths[:, None]
    return positions >= (length - lengths)[:, None]


def _inputs(shape, seed, shared_embeddings=True, scale=1.0):
    batch, q_len, k_len, depth, value_depth, horizon = shape
    rng = np.random.default_rng(seed)
    query = (scale * rng.normal(size=(batch, q_len, depth))).astype(np.float32)
    key = (scale * rng.normal(size=(batch, k_len, depth))).astype(np.float32)
    value = rng.normal(size=(batch, k_len, value_depth)).astype(np.float32)
    rel_shape = (2 * horizon + 1, depth) if shared_embeddings else (batch, 2 * horizon + 1, depth)
    rel = (scale * rng.normal(size=rel_shape)).astype(np.float32)
    return rng, query, key, value, rel


def _run_with_gradients(query, key, value, rel, horizon, out_grad, **kwargs):
    if rel is None:
        return vjp(lambda q, k, v: ops.linear_relative_attention(q, k, v, horizon=horizon, **kwargs),
                   [query, key, value], out_grad)
    return vjp(lambda q, k, v, r: ops.linear_relative_attention(q, k, v, r, horizon, **kwargs),
               [query, key, value, rel], out_grad)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("with_relative", [True, False], ids=["relative", "horizon_none"])
@pytest.mark.parametrize("shape_name", list(SHAPES))
def test_forward_and_gradients_match_dense_oracle(shape_name, with_relative, padding, causal):
    shape = SHAPES[shape_name]
    batch, q_len, k_len, _, value_depth, horizon = shape
    rng, query, key, value, rel = _inputs(shape, seed=hash((shape_name, padding, causal)) % 2 ** 31,
                                          shared_embeddings=batch % 2 == 0)
    if not with_relative:
        rel, horizon = None, None
    query_mask = _padding_mask(padding, batch, q_len, rng)
    key_mask = _padding_mask(padding, batch, k_len, rng)
    out_grad = rng.normal(size=(batch, q_len, value_depth)).astype(np.float32)
    kwargs = dict(causal=causal, query_mask=query_mask, key_mask=key_mask, chunk_size=3)

    out, grads = _run_with_gradients(query, key, value, rel, horizon, out_grad, **kwargs)
    kwargs.pop("chunk_size")
    expected = ref.linear_relative_attention(query, key, value, rel, horizon, **kwargs)
    expected_grads = ref.linear_relative_attention_gradients(query, key, value, out_grad, rel, horizon, **kwargs)

    np.testing.assert_allclose(out, expected, rtol=2e-4, atol=2e-5)
    for name, got, want in zip(["query", "key", "value", "relative_embeddings"], grads, expected_grads):
        scale = max(1.0, np.abs(want).max())
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=2e-4 * scale, err_msg=f"gradient of {name}")


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("chunk_size", [1, 3, 7, 16, 37, 200])
def test_chunk_size_does_not_change_result(chunk_size, causal):
    shape = (2, 37, 29, 8, 5, 4)
    rng, query, key, value, rel = _inputs(shape, seed=7)
    key_mask = _padding_mask("right", 2, 29, rng)
    out_grad = rng.normal(size=(2, 37, 5)).astype(np.float32)
    kwargs = dict(causal=causal, key_mask=key_mask)
    # chunk_size >= Lq: one dense masked Lq x Lq block, i.e. no chunking at all; it is itself the oracle's.
    unchunked, unchunked_grads = _run_with_gradients(query, key, value, rel, 4, out_grad, chunk_size=37, **kwargs)
    np.testing.assert_allclose(unchunked, ref.linear_relative_attention(query, key, value, rel, 4, **kwargs),
                               rtol=2e-4, atol=2e-5)
    out, grads = _run_with_gradients(query, key, value, rel, 4, out_grad, chunk_size=chunk_size, **kwargs)
    np.testing.assert_allclose(out, unchunked, rtol=1e-5, atol=1e-6)
    for got, want in zip(grads, unchunked_grads):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("with_relative", [True, False], ids=["relative", "horizon_none"])
def test_causal_output_ignores_future_keys_and_values(with_relative):
    shape = (2, 40, 40, 6, 4, 3)
    rng, query, key, value, rel = _inputs(shape, seed=11)
    horizon = 3 if with_relative else None
    rel = rel if with_relative else None
    base = to_numpy(ops.linear_relative_attention(query, key, value, rel, horizon, causal=True, chunk_size=8))
    for i in (0, 7, 8, 23, 39):
        key2, value2 = key.copy(), value.copy()
        key2[:, i + 1:] = rng.normal(size=key2[:, i + 1:].shape) * 5
        value2[:, i + 1:] = rng.normal(size=value2[:, i + 1:].shape) * 5
        changed = to_numpy(ops.linear_relative_attention(query, key2, value2, rel, horizon, causal=True, chunk_size=8))
        np.testing.assert_array_equal(changed[:, :i + 1], base[:, :i + 1])


def test_padded_keys_with_nan_do_not_reach_outputs():
    shape = (2, 10, 10, 4, 3, 2)
    rng, query, key, value, rel = _inputs(shape, seed=3)
    key_mask = np.ones((2, 10), bool)
    key_mask[:, 7:] = False
    clean = to_numpy(ops.linear_relative_attention(query, key, value, rel, 2, key_mask=key_mask))
    key[:, 7:] = np.nan
    value[:, 7:] = np.inf
    dirty = to_numpy(ops.linear_relative_attention(query, key, value, rel, 2, key_mask=key_mask))
    np.testing.assert_array_equal(dirty, clean)


def test_padded_queries_and_rows_without_keys_output_zero():
    shape = (2, 6, 6, 4, 3, 2)
    _, query, key, value, rel = _inputs(shape, seed=5)
    query_mask = np.array([[1, 1, 1, 0, 0, 0], [1] * 6], bool)
    key_mask = np.array([[1] * 6, [0] * 6], bool)
    out = ops.linear_relative_attention(query, key, value, rel, 2, query_mask=query_mask, key_mask=key_mask)
    out = to_numpy(out)
    assert np.all(out[0, 3:] == 0)
    assert np.all(out[1] == 0)
    assert np.all(np.isfinite(out))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_half_precision_outputs_are_finite_for_large_inputs(dtype, causal):
    shape = (2, 50, 50, 16, 8, 4)
    rng, query, key, value, rel = _inputs(shape, seed=13, scale=20.0)
    rounded = [to_numpy(cast(t, dtype)) for t in (query, key, value, rel)]
    out = ops.linear_relative_attention(*(cast(t, dtype) for t in (query, key, value, rel)), horizon=4,
                                        causal=causal, chunk_size=16)
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    half = lambda x: keras.ops.cast(x, dtype)  # noqa: E731
    _, grads = vjp(lambda q, k, v, r: ops.linear_relative_attention(half(q), half(k), half(v), half(r), 4,
                                                                    causal=causal, chunk_size=16),
                   rounded, np.ones((2, 50, 8)))
    assert np.all(np.isfinite(to_numpy(out)))
    for grad in grads:
        assert np.all(np.isfinite(grad))
    expected = ref.linear_relative_attention(*rounded, horizon=4, causal=causal)
    np.testing.assert_allclose(to_numpy(out), expected, rtol=0.05, atol=0.05)


@requires_tensorflow
def test_unknown_dims_inside_tf_function_match_eager():
    shape = (2, 13, 17, 4, 3, 2)
    rng, query, key, value, rel = _inputs(shape, seed=17)
    key_mask = _padding_mask("left", 2, 17, rng)
    spec = [tf.TensorSpec([None, None, 4]), tf.TensorSpec([None, None, 4]), tf.TensorSpec([None, None, 3]),
            tf.TensorSpec([5, 4]), tf.TensorSpec([None, None], tf.bool)]

    @tf.function(input_signature=spec)
    def graph_fn(q, k, v, r, m):
        return ops.linear_relative_attention(q, k, v, r, 2, key_mask=m, chunk_size=4)

    eager = ops.linear_relative_attention(query, key, value, rel, 2, key_mask=key_mask, chunk_size=4)
    np.testing.assert_allclose(graph_fn(query, key, value, rel, key_mask).numpy(), eager.numpy(), rtol=1e-6,
                               atol=1e-7)


@requires_tensorflow
def test_jit_compile_matches_eager():
    shape = (2, 20, 20, 4, 3, 2)
    _, query, key, value, rel = _inputs(shape, seed=19)
    fn = tf.function(lambda *a: ops.linear_relative_attention(*a, horizon=2, causal=True, chunk_size=8),
                     jit_compile=True)
    eager = ops.linear_relative_attention(query, key, value, rel, 2, causal=True, chunk_size=8)
    np.testing.assert_allclose(fn(query, key, value, rel).numpy(), eager.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kwargs, message", [
    (dict(horizon=0), "horizon must be None or an integer >= 1"),
    (dict(horizon=2, relative_embeddings=None), "relative_embeddings and horizon go together"),
    (dict(horizon=None, relative_embeddings=np.zeros((5, 4), np.float32)), "go together"),
    (dict(horizon=3, relative_embeddings=np.zeros((5, 4), np.float32)), "2 \\* horizon \\+ 1 = 7 rows"),
    (dict(horizon=2, relative_embeddings=np.zeros((5, 3), np.float32)), "relative_embeddings depths"),
    (dict(horizon=2, relative_embeddings=np.zeros((5,), np.float32)), "must have shape \\[2 \\* horizon"),
    (dict(epsilon=0.0), "epsilon must be a finite float > 0"),
    (dict(chunk_size=0), "chunk_size must be None or an integer >= 1"),
    (dict(causal="yes"), "causal must be a bool"),
    (dict(query=np.zeros((2, 5, 3), np.float32)), "query and key depths"),
    (dict(value=np.zeros((2, 4, 3), np.float32)), "key and value lengths"),
    (dict(value=np.zeros((3, 6, 3), np.float32)), "batch sizes"),
    (dict(key_mask=np.ones((2, 5), bool)), "key lengths"),
    (dict(query_mask=np.ones((2, 6, 1), bool)), "query_mask must have shape \\[batch, length\\]"),
    (dict(query=np.zeros((2, 5), np.float32)), "query must have rank 3"),
    (dict(key=np.zeros((2, 6, 4), np.int32)), "key must be a floating-point tensor"),
])
def test_bad_arguments_raise_naming_the_argument(kwargs, message):
    args = dict(query=np.zeros((2, 5, 4), np.float32), key=np.zeros((2, 6, 4), np.float32),
                value=np.zeros((2, 6, 3), np.float32))
    args.update(kwargs)
    with pytest.raises((ValueError, TypeError), match=message):
        ops.linear_relative_attention(**args)


@requires_tensorflow
def test_mismatched_unknown_lengths_raise_at_run_time():
    spec = [tf.TensorSpec([None, None, 4]), tf.TensorSpec([None, None, 4]), tf.TensorSpec([None, None, 3])]
    fn = tf.function(lambda q, k, v: ops.linear_relative_attention(q, k, v), input_signature=spec)
    with pytest.raises(tf.errors.InvalidArgumentError, match="key and value lengths must agree"):
        fn(np.zeros((2, 5, 4), np.float32), np.zeros((2, 6, 4), np.float32), np.zeros((2, 4, 3), np.float32))


_MEMORY_PROBE = textwrap.dedent("""
    import resource, sys
    import numpy as np
    import tensorflow as tf
    from keras_yoso import ops
    length = int(sys.argv[1])
    rng = np.random.default_rng(0)
    q = tf.constant(rng.normal(size=(1, length, 64)).astype(np.float32))
    v = tf.constant(rng.normal(size=(1, length, 64)).astype(np.float32))
    r = tf.constant(rng.normal(size=(33, 64)).astype(np.float32))
    @tf.function
    def fn(q, v, r):  # forward and backward: the gradient keeps the chunk activations alive
        with tf.GradientTape() as tape:
            tape.watch([q, v, r])
            loss = tf.reduce_sum(ops.linear_relative_attention(q, q, v, r, 16, causal=True) ** 2)
        return tape.gradient(loss, [q, v, r])
    fn.get_concrete_function(q, v, r)  # trace before measuring
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    [g.numpy() for g in fn(q, v, r)]
    print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
""")


def _peak_growth_bytes(length):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    result = subprocess.run([sys.executable, "-c", _MEMORY_PROBE, str(length)], capture_output=True, text=True,
                            env=env, timeout=300, check=True)
    return int(result.stdout.strip().splitlines()[-1])


@requires_tensorflow
def test_causal_peak_memory_grows_linearly_in_length():
    # Forward + backward, d = 64, chunk 64, k = 16: measured ~6.8 KiB/position (inputs, gradients, the
    # per-chunk scores, bands, key windows and states). Algorithm 1's [L, d, d] states alone would be
    # 16 KiB/position forward and twice that with their gradient.
    small, large = 8192, 32768
    small_growth, large_growth = _peak_growth_bytes(small), _peak_growth_bytes(large)
    per_position = (large_growth - small_growth) / (large - small)
    assert per_position < 12 * 1024, (small_growth, large_growth)
    # Quadratic growth would make the 4x longer run use ~16x the memory.
    assert large_growth < 8 * max(small_growth, 16 * 2 ** 20), (small_growth, large_growth)
