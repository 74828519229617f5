"""The causal native cumulations: `causal` of the native provider's lsh_cumulation and
weighted_lsh_cumulation (custom_ops/cc/kernels/yoso_cpu.h), called directly on the running
backend's native provider (TensorFlow's op library, the native library's XLA FFI handlers on JAX,
its torch.library ops on PyTorch).

causal=1: key j counts for query i only when j <= i; causal=-1: only when j >= i (the transposed
cumulations of a causal backward); causal=0: every key. Compared with tests/numpy_reference.py,
with masks, with every position in one bucket (the weighted kernel's running [W, D] state over
several key chunks) and with random codes (small buckets, pair by pair).
"""

import keras
import numpy as np
import pytest

import numpy_reference as ref
from conftest import BACKEND, CUSTOM_OPS_EXPECTED, DATA_ERROR, cast, random_mask, rounded, to_numpy
from keras_yoso.ops import _dispatch

pytestmark = pytest.mark.skipif(not CUSTOM_OPS_EXPECTED,
                                reason="no native kernels expected (KERAS_YOSO_DISABLE_CUSTOM_OPS=1)")

M = 3
DIRECTIONS = [1, -1]
# codes: "random" spreads the positions over 2**tau buckets (a few per bucket: pair by pair);
# "one_bucket" puts every position of every hash in one bucket: with n = 300 and the masks, about
# 200 keys, 4 chunks of 64, where the weighted kernel keeps the running state.
CODES = {"random": (40, 3), "one_bucket": (300, 3)}


def _native():
    """The running backend's native provider (a build that did not load fails the test)."""
    provider, error = _dispatch.native_provider()
    assert provider is not None, f"the native kernels are expected but not loaded: {error}"
    return provider


def _close(actual, expected, tol=1e-5):
    expected = np.asarray(expected)
    scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
    np.testing.assert_allclose(to_numpy(actual), expected, atol=tol * scale, rtol=tol)


def _inputs(seed, codes="random", weight_dim=3, value_dim=5, n=None, num_keys=None, masks=True):
    """Codes, masks, weights and values of 2 rows; n queries and num_keys (default n) keys."""
    rng = np.random.default_rng(seed)
    default_n, tau = CODES[codes]
    nq = n or default_n
    nk = num_keys or nq
    if codes == "one_bucket":
        qc = np.full((2, M, nq), 2 ** tau - 1, np.int32)
        kc = np.full((2, M, nk), 2 ** tau - 1, np.int32)
    else:
        qc = rng.integers(0, 2 ** tau, (2, M, nq)).astype(np.int32)
        kc = rng.integers(0, 2 ** tau, (2, M, nk)).astype(np.int32)
    kind = "random" if masks else "none"
    return dict(qc=qc, kc=kc, num_buckets=2 ** tau,
                qm=random_mask(rng, kind, 2, nq), km=random_mask(rng, kind, 2, nk),
                qw=rng.normal(size=(2, nq, weight_dim)).astype(np.float32),
                kw=rng.normal(size=(2, nk, weight_dim)).astype(np.float32),
                v=rng.normal(size=(2, nk, value_dim)).astype(np.float32))


def _masks(t):
    n_q, n_k = t["qc"].shape[2], t["kc"].shape[2]
    qm = np.ones((2, n_q), bool) if t["qm"] is None else t["qm"]
    km = np.ones((2, n_k), bool) if t["km"] is None else t["km"]
    return qm, km


def _tensors(t):
    """Codes and masks of `t` as backend tensors (the providers take the backend's tensors)."""
    qm, km = _masks(t)
    return [keras.ops.convert_to_tensor(a) for a in (t["qc"], t["kc"], qm, km)]


def _lsh(t, causal, dtype="float32"):
    qc, kc, qm, km = _tensors(t)
    return _native().run("lsh_cumulation", qm, qc, km, kc, cast(t["v"], dtype), t["num_buckets"], causal)


def _weighted(t, causal, dtype="float32"):
    qc, kc, qm, km = _tensors(t)
    return _native().run("weighted_lsh_cumulation", qm, qc, cast(t["qw"], dtype), km, kc, cast(t["kw"], dtype),
                         cast(t["v"], dtype), t["num_buckets"], causal)


def _lsh_reference(t, causal, dtype="float32"):
    return ref.lsh_cumulation(t["qc"], t["kc"], rounded(t["v"], dtype), t["qm"], t["km"], causal=causal)


def _weighted_reference(t, causal, dtype="float32"):
    return ref.weighted_lsh_cumulation(t["qc"], rounded(t["qw"], dtype), t["kc"], rounded(t["kw"], dtype),
                                       rounded(t["v"], dtype), t["qm"], t["km"], causal=causal)


@pytest.mark.parametrize("codes", sorted(CODES))
@pytest.mark.parametrize("causal", DIRECTIONS)
def test_causal_lsh_cumulation_sums_only_the_keys_on_its_side_of_each_query(causal, codes):
    t = _inputs(0, codes, value_dim=70)  # 70 columns: two column blocks of the kernel
    _close(_lsh(t, causal), _lsh_reference(t, causal))


@pytest.mark.parametrize("widths", [(3, 5), (16, 32)])
@pytest.mark.parametrize("codes", sorted(CODES))
@pytest.mark.parametrize("causal", DIRECTIONS)
def test_causal_weighted_lsh_cumulation_sums_only_the_keys_on_its_side_of_each_query(causal, codes, widths):
    # (3, 5): values copied into padded rows; (16, 32): whole register tiles, read in place.
    t = _inputs(1, codes, *widths)
    _close(_weighted(t, causal), _weighted_reference(t, causal))


@pytest.mark.parametrize("causal", DIRECTIONS)
def test_causal_weighted_lsh_cumulation_without_masks_matches_the_reference(causal):
    t = _inputs(2, "one_bucket", 8, 20, masks=False)
    _close(_weighted(t, causal), _weighted_reference(t, causal))
    t = _inputs(3, "random", 8, 20, n=200, masks=False)
    _close(_weighted(t, causal), _weighted_reference(t, causal))


@pytest.mark.parametrize("causal", DIRECTIONS)
def test_a_query_sees_the_key_at_its_own_position_in_both_directions(causal):
    # Three positions in one bucket, value j = e_j: query i sums e_j over j <= i (causal=1) or j >= i.
    codes, mask, value, weight = (keras.ops.convert_to_tensor(a) for a in (
        np.zeros((1, 1, 3), np.int32), np.ones((1, 3), bool), np.eye(3, dtype=np.float32)[None],
        np.ones((1, 3, 1), np.float32)))
    expected = np.tril(np.ones((3, 3))) if causal == 1 else np.triu(np.ones((3, 3)))
    out = _native().run("lsh_cumulation", mask, codes, mask, codes, value, 1, causal)
    np.testing.assert_array_equal(to_numpy(out)[0], expected)
    out = _native().run("weighted_lsh_cumulation", mask, codes, weight, mask, codes, weight, value, 1, causal)
    np.testing.assert_array_equal(to_numpy(out)[0], expected)


@pytest.mark.parametrize("codes", sorted(CODES))
@pytest.mark.parametrize("causal", DIRECTIONS)
def test_a_key_never_reaches_a_query_on_the_other_side_not_even_as_nan(causal, codes):
    # The last key in walk order (the last position for causal=1, the first for -1) holds NaN
    # weights and values: only its own query may see it; every other output is the reference's.
    t = _inputs(4, codes, 16, 32, masks=False)
    edge = -1 if causal == 1 else 0
    t["kw"][:, edge] = np.nan
    t["v"][:, edge] = np.nan
    others = slice(0, -1) if causal == 1 else slice(1, None)
    clean = dict(t, km=np.ones((2, t["kc"].shape[2]), bool))
    clean["km"][:, edge] = False
    _close(to_numpy(_lsh(t, causal))[:, others], _lsh_reference(clean, causal)[:, others])
    _close(to_numpy(_weighted(t, causal))[:, others], _weighted_reference(clean, causal)[:, others])


@pytest.mark.parametrize("codes", sorted(CODES))
@pytest.mark.parametrize("causal", DIRECTIONS)
def test_causal_cumulations_take_float16_and_return_float16(causal, codes):
    t = _inputs(5, codes, 8, 16)
    out = _lsh(t, causal, "float16")
    assert "float16" in str(out.dtype)
    _close(out, _lsh_reference(t, causal, "float16"), tol=2e-2)
    out = _weighted(t, causal, "float16")
    assert "float16" in str(out.dtype)
    _close(out, _weighted_reference(t, causal, "float16"), tol=2e-2)


@pytest.mark.parametrize("causal", DIRECTIONS)
def test_causal_cumulations_give_the_same_bits_on_every_call(causal):
    t = _inputs(6, "one_bucket", 16, 32)
    np.testing.assert_array_equal(to_numpy(_weighted(t, causal)), to_numpy(_weighted(t, causal)))
    np.testing.assert_array_equal(to_numpy(_lsh(t, causal)), to_numpy(_lsh(t, causal)))


def test_causal_zero_is_the_bidirectional_cumulation_with_any_lengths():
    t = _inputs(7, "random", n=13, num_keys=11)
    qc, kc, qm, km = _tensors(t)
    qw, kw, v = (cast(t[name], "float32") for name in ("qw", "kw", "v"))
    provider = _native()
    _close(provider.run("lsh_cumulation", qm, qc, km, kc, v, t["num_buckets"], 0), _lsh_reference(t, 0))
    _close(provider.run("weighted_lsh_cumulation", qm, qc, qw, km, kc, kw, v, t["num_buckets"], 0),
           _weighted_reference(t, 0))


@pytest.mark.parametrize("causal", DIRECTIONS)
def test_causal_needs_as_many_queries_as_keys(causal):
    t = _inputs(8, "random", n=5, num_keys=7)
    message = f"causal = {causal} needs as many queries as keys .*num_queries = 5 and num_keys = 7"
    with pytest.raises(DATA_ERROR, match=message):
        to_numpy(_lsh(t, causal))
    with pytest.raises(DATA_ERROR, match=message):
        to_numpy(_weighted(t, causal))


@pytest.mark.parametrize("causal", [2, -2])
def test_causal_outside_minus_one_to_one_is_rejected(causal):
    t = _inputs(9, "random", n=6)
    message = f"causal must be -1, 0 or 1, got {causal}"
    with pytest.raises(DATA_ERROR, match=message):
        to_numpy(_lsh(t, causal))
    with pytest.raises(DATA_ERROR, match=message):
        to_numpy(_weighted(t, causal))


# --- what each backend adds ------------------------------------------------------------------------


@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow raw ops only")
@pytest.mark.parametrize("causal", DIRECTIONS)
def test_tf_raw_op_gradients_run_the_transposed_cumulations_in_the_opposite_direction(causal):
    import tensorflow as tf

    from keras_yoso.ops.providers import tensorflow as tf_provider

    lib = tf_provider.library()
    t = _inputs(10, "one_bucket", 8, 16, masks=False)
    qm, km = (tf.constant(m, tf.float32) for m in _masks(t))
    qw, kw, v = tf.constant(t["qw"]), tf.constant(t["kw"]), tf.constant(t["v"])
    dy = np.random.default_rng(11).normal(size=(2, t["qc"].shape[2], 16)).astype(np.float32)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([qw, kw, v])
        plain = lib.yoso_lsh_cumulation(qm, t["qc"], km, t["kc"], v, num_buckets=t["num_buckets"], causal=causal)
        weighted = lib.yoso_weighted_lsh_cumulation(qm, t["qc"], qw, km, t["kc"], kw, v,
                                                    num_buckets=t["num_buckets"], causal=causal)
    _close(tape.gradient(plain, v, output_gradients=dy), ref.lsh_cumulation(t["kc"], t["qc"], dy, causal=-causal))
    d_qw, d_kw, d_v = tape.gradient(weighted, [qw, kw, v], output_gradients=dy)
    _close(d_qw, ref.weighted_lsh_cumulation(t["qc"], dy, t["kc"], t["v"], t["kw"], causal=causal))
    _close(d_kw, ref.weighted_lsh_cumulation(t["kc"], t["v"], t["qc"], dy, t["qw"], causal=-causal))
    _close(d_v, ref.weighted_lsh_cumulation(t["kc"], t["kw"], t["qc"], t["qw"], dy, causal=-causal))


@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow raw ops only")
@pytest.mark.parametrize("causal", [0, 1])
def test_tf_fused_lower_bound_raw_op_has_the_gradient_of_its_two_weighted_cumulations(causal):
    # YosoLowerBoundGradients = (W(qm, qc, dY, km, kc, V, K), W(km, kc, V, qm, qc, dY, Q)): a graph that
    # differentiates it (a second-order gradient) gets the sum of the two cumulations' gradients.
    import tensorflow as tf

    from keras_yoso.ops.providers import tensorflow as tf_provider

    lib = tf_provider.library()
    t = _inputs(13, "random", 8, 16)
    qm, km = (tf.constant(m, tf.float32) for m in _masks(t))
    rng = np.random.default_rng(14)
    q, k = tf.constant(t["qw"]), tf.constant(t["kw"])
    v, dy = tf.constant(t["v"]), tf.constant(rng.normal(size=(2, t["qc"].shape[2], 16)).astype(np.float32))
    g_q, g_k = (tf.constant(rng.normal(size=x.shape).astype(np.float32)) for x in (q, k))
    nb = t["num_buckets"]
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([q, k, v, dy])
        fused = lib.yoso_lower_bound_gradients(qm, t["qc"], q, km, t["kc"], k, v, dy, num_buckets=nb, causal=causal)
        two = (lib.yoso_weighted_lsh_cumulation(qm, t["qc"], dy, km, t["kc"], v, k, num_buckets=nb, causal=causal),
               lib.yoso_weighted_lsh_cumulation(km, t["kc"], v, qm, t["qc"], dy, q, num_buckets=nb, causal=-causal))
    for a, b in zip(fused, two):
        _close(a, b)
    got = tape.gradient(fused, [q, k, v, dy], output_gradients=[g_q, g_k])
    want = tape.gradient(two, [q, k, v, dy], output_gradients=[g_q, g_k])
    for a, b in zip(got, want):
        _close(a, b)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow raw ops only")
def test_tf_shape_function_rejects_causal_lengths_that_differ_while_the_graph_is_built():
    import tensorflow as tf

    from keras_yoso.ops.providers import tensorflow as tf_provider

    lib = tf_provider.library()
    t = _inputs(12, "random", n=5, num_keys=7)
    qm, km = (tf.constant(m, tf.float32) for m in _masks(t))
    with pytest.raises(ValueError, match="num_queries = 5 and num_keys = 7"):
        tf.function(lambda: lib.yoso_lsh_cumulation(qm, t["qc"], km, t["kc"], t["v"], num_buckets=8,
                                                    causal=1)).get_concrete_function()
    with pytest.raises(ValueError, match="causal must be -1, 0 or 1, got 3"):
        tf.function(lambda: lib.yoso_lsh_cumulation(qm, t["qc"], km, t["kc"], t["v"], num_buckets=8,
                                                    causal=3)).get_concrete_function()


@pytest.mark.skipif(BACKEND != "jax", reason="JAX XLA FFI handlers only")
@pytest.mark.parametrize("causal", DIRECTIONS)
def test_jax_causal_cumulations_run_inside_jit_with_the_eager_bits(causal):
    import jax

    t = _inputs(13, "one_bucket", 8, 16)
    qc, kc, qm, km = _tensors(t)
    provider, nb = _native(), t["num_buckets"]
    jitted = jax.jit(lambda qw, kw, v: provider.run("weighted_lsh_cumulation", qm, qc, qw, km, kc, kw, v, nb, causal))
    np.testing.assert_array_equal(to_numpy(jitted(t["qw"], t["kw"], t["v"])), to_numpy(_weighted(t, causal)))


@pytest.mark.skipif(BACKEND != "jax", reason="JAX XLA FFI handlers only")
def test_jax_causal_cumulations_under_vmap_match_one_call_per_slice():
    import jax

    provider = _native()
    inputs = [_inputs(17 + k, "random", 8, 16) for k in range(3)]
    stacked = {name: np.stack([t[name] for t in inputs]) for name in ("qc", "kc", "qw", "kw", "v")}
    stacked_masks = [np.stack([_masks(t)[side] for t in inputs]) for side in (0, 1)]

    def one(qc, kc, qw, kw, v, qm, km):
        return provider.run("weighted_lsh_cumulation", qm, qc, qw, km, kc, kw, v, 8, 1)

    batched = jax.vmap(one)(stacked["qc"], stacked["kc"], stacked["qw"], stacked["kw"], stacked["v"],
                            *stacked_masks)
    for k, t in enumerate(inputs):
        np.testing.assert_array_equal(to_numpy(batched[k]), to_numpy(_weighted(t, 1)))


@pytest.mark.skipif(BACKEND != "jax", reason="JAX XLA FFI handlers only")
def test_jax_custom_calls_without_a_causal_attribute_run_bidirectionally():
    # Custom calls traced before `causal` existed (e.g. jax.export artifacts) name no such attribute.
    import jax
    import jax.numpy as jnp

    _native()
    t = _inputs(14, "random", n=9, num_keys=6, masks=False)
    qm, km = (np.ones(m.shape, np.float32) for m in _masks(t))
    result = jax.ShapeDtypeStruct((2, 9, 5), jnp.float32)
    call = jax.ffi.ffi_call("keras_yoso_lsh_cumulation", result, vmap_method="broadcast_all")
    out = call(qm, t["qc"], km, t["kc"], t["v"], num_buckets=np.int64(8), num_threads=np.int64(0))
    _close(out, _lsh_reference(t, 0))
    with pytest.raises(Exception, match="unexpected attribute"):
        jax.block_until_ready(call(qm, t["qc"], km, t["kc"], t["v"], num_buckets=np.int64(8),
                                   num_threads=np.int64(0), direction=np.int64(1)))


@pytest.mark.skipif(BACKEND != "torch", reason="torch.library ops only")
@pytest.mark.parametrize("causal", DIRECTIONS)
def test_torch_causal_ops_pass_torch_library_opcheck(causal):
    import torch

    _native()
    t = _inputs(15, "random")
    qm, km = (torch.tensor(m, dtype=torch.float32) for m in _masks(t))
    qc, kc = torch.tensor(t["qc"]), torch.tensor(t["kc"])
    qw, kw, v = torch.tensor(t["qw"]), torch.tensor(t["kw"]), torch.tensor(t["v"])
    torch.library.opcheck(torch.ops.keras_yoso.lsh_cumulation.default, (qm, qc, km, kc, v, 8, causal))
    torch.library.opcheck(torch.ops.keras_yoso.weighted_lsh_cumulation.default,
                          (qm, qc, qw, km, kc, kw, v, 8, causal))


@pytest.mark.skipif(BACKEND != "torch", reason="torch.library ops only (their thread count is torch's)")
@pytest.mark.parametrize("causal", DIRECTIONS)
def test_torch_causal_results_do_not_depend_on_the_thread_count(causal):
    import torch

    t = _inputs(16, "one_bucket", 16, 32)
    previous = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append([to_numpy(_lsh(t, causal)), to_numpy(_weighted(t, causal))])
    finally:
        torch.set_num_threads(previous)
    for one, two in zip(*results):
        np.testing.assert_array_equal(one, two)
