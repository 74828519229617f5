"""The contract every native provider keeps (the TensorFlow op library, the XLA FFI handlers on JAX,
the torch.library ops), run on the running backend's: the numbers of the NumPy reference and of the
composite in float32, float16 and bfloat16, gradients through the backend's autodiff, and out-of-range
codes refused naming the codes. What only one provider has (jit and vmap, opcheck and torch.compile,
threads) stays in test_jax_native.py and test_torch_native.py."""

import keras
import numpy as np
import pytest

import numpy_reference as ref
from conftest import CUSTOM_OPS_EXPECTED, DATA_ERROR, cast, random_mask, rounded, to_numpy, unit_rows, vjp
from keras_yoso import _validation
from keras_yoso import ops

if not CUSTOM_OPS_EXPECTED:
    pytest.skip("native kernels disabled (KERAS_YOSO_DISABLE_CUSTOM_OPS=1)", allow_module_level=True)

# Tolerance of each dtype, relative to max(1, |expected|), for outputs computed from inputs of that dtype.
DTYPES = [("float32", 1e-5), ("float16", 2e-2), ("bfloat16", 8e-2)]
EPSILON = _validation.COLLISION_EPSILON


def _assert_close(actual, expected, tol):
    expected = np.asarray(expected)
    scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
    np.testing.assert_allclose(to_numpy(actual).astype(np.float64), expected, atol=tol * scale, rtol=tol)


def _codes(rng, batch, m, n, tau):
    return rng.integers(0, 2 ** tau, size=(batch, m, n)).astype(np.int32)


@pytest.mark.parametrize("method", _validation.HASH_METHODS)
@pytest.mark.parametrize("dtype", [d for d, _ in DTYPES])
def test_hash_codes_match_reference_and_composite(method, dtype):
    x = np.random.default_rng(1).normal(size=(2, 200, 24)).astype(np.float32)
    codes = ops.hash_codes(cast(x, dtype), 8, 6, seed=3, method=method, implementation="custom_op")
    assert keras.backend.standardize_dtype(codes.dtype) == "int32" and tuple(codes.shape) == (2, 8, 200)
    params = to_numpy(ops.hash_parameters(24, 8, 6, 3, method))
    expected = ref.hash_codes(
        rounded(x, dtype), params, 8, 6, method)
    composite = ops.hash_codes(cast(x, dtype), 8, 6, seed=3, method=method, implementation="composite")
    # A sign can only differ where a projection is ~0 (half precision rounds the projections).
    agree = 0.995 if dtype == "float32" else 0.95
    assert (to_numpy(codes) == expected).mean() >= agree
    assert (to_numpy(codes) == to_numpy(composite)).mean() >= agree


@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_cumulations_match_reference_and_composite(dtype, tol):
    rng = np.random.default_rng(2)
    qc, kc = _codes(rng, 2, 6, 40, 4), _codes(rng, 2, 6, 30, 4)
    qm, km = random_mask(rng, "random", 2, 40), random_mask(rng, "random", 2, 30)
    qw, kw = rng.normal(size=(2, 40, 3)), rng.normal(size=(2, 30, 3))
    v = rng.normal(size=(2, 30, 5))
    for implementation in ("custom_op", "composite"):
        out = ops.lsh_cumulation(qc, kc, cast(v, dtype), 16, qm, km, implementation=implementation)
        assert keras.backend.standardize_dtype(out.dtype) == dtype
        _assert_close(out, ref.lsh_cumulation(qc, kc, rounded(v, dtype), qm, km), tol)
        out = ops.weighted_lsh_cumulation(qc, cast(qw, dtype), kc, cast(kw, dtype), cast(v, dtype), 16, qm, km,
                                          implementation=implementation)
        assert keras.backend.standardize_dtype(out.dtype) == dtype
        expected = ref.weighted_lsh_cumulation(qc, rounded(qw, dtype), kc, rounded(kw, dtype), rounded(v, dtype),
                                               qm, km)
        _assert_close(out, expected, tol)


@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_collision_cumulation_matches_reference_and_composite(dtype, tol):
    rng = np.random.default_rng(3)
    q, k = unit_rows(rng, (2, 20, 8)), unit_rows(rng, (2, 25, 8))
    qw, kw = rng.normal(size=(2, 20, 3)), rng.normal(size=(2, 25, 3))
    qc, kc = _codes(rng, 2, 4, 20, 3), _codes(rng, 2, 4, 25, 3)
    qm, km = random_mask(rng, "random", 2, 20), random_mask(rng, "random", 2, 25)
    args = [cast(a, dtype) for a in (q, qw, k, kw)]
    custom = ops.collision_cumulation(qc, args[0], args[1], kc, args[2], args[3], 3, qm, km,
                                      implementation="custom_op")
    composite = ops.collision_cumulation(qc, args[0], args[1], kc, args[2], args[3], 3, qm, km,
                                         implementation="composite")
    expected = ref.collision_cumulation(qc, rounded(q, dtype), rounded(qw, dtype), kc, rounded(k, dtype),
                                        rounded(kw, dtype), 3, EPSILON, qm, km)
    assert keras.backend.standardize_dtype(custom.dtype) == dtype
    _assert_close(custom, expected, 10 * tol)  # the derivative's 1/sqrt(1 - x^2) amplifies rounding
    _assert_close(custom, to_numpy(composite), 10 * tol)


@pytest.mark.parametrize("backward", ["lower_bound", "collision"])
@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_yoso_cumulation_gradients_through_autodiff_match_reference_and_composite(backward, dtype, tol):
    rng = np.random.default_rng(4)
    q, k = unit_rows(rng, (2, 16, 8)), unit_rows(rng, (2, 12, 8))
    v = rng.normal(size=(2, 12, 4)).astype(np.float32)
    qc, kc = _codes(rng, 2, 8, 16, 3), _codes(rng, 2, 8, 12, 3)
    qm, km = random_mask(rng, "random", 2, 16), random_mask(rng, "random", 2, 12)
    cotangent = rng.normal(size=(2, 16, 4)).astype(np.float32)
    results = {}
    for implementation in ("custom_op", "composite"):
        def attention(a, b, c, implementation=implementation):
            a, b, c = (keras.ops.cast(t, dtype) for t in (a, b, c))
            return ops.yoso_cumulation(a, b, c, qc, kc, 3, qm, km, backward=backward, implementation=implementation)

        results[implementation] = vjp(attention, [q, k, v], cotangent)
    args = [rounded(a, dtype) for a in (q, k, v)] + [qc, kc, 3, rounded(cotangent, dtype)]
    if backward == "lower_bound":
        expected = ref.yoso_lower_bound_gradients(*args, qm, km)
    else:
        expected = ref.yoso_collision_gradients(*args, EPSILON, qm, km)
    out, grads = results["custom_op"]
    _assert_close(out, ref.lsh_cumulation(qc, kc, rounded(v, dtype), qm, km), tol)
    for name, grad, want, composite in zip("qkv", grads, expected, results["composite"][1]):
        gradient_tol = tol if name == "v" or backward == "lower_bound" else 10 * tol
        _assert_close(grad, want, gradient_tol)
        _assert_close(grad, composite, gradient_tol)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tau,length", [(1, 150), (7, 300)])
@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_fused_lower_bound_backward_matches_reference_on_table_and_pair_buckets(tau, length, causal, dtype, tol):
    # tau = 1: two buckets of ~75 queries and keys each, cheaper through the per-bucket tables; tau = 7:
    # buckets of ~2, pair by pair. Widths 20 and 24 are not whole register tiles (16 floats).
    rng = np.random.default_rng(7)
    q, k = unit_rows(rng, (2, length, 20)), unit_rows(rng, (2, length, 20))
    v, dy = rng.normal(size=(2, length, 24)), rng.normal(size=(2, length, 24))
    qc, kc = _codes(rng, 2, 5, length, tau), _codes(rng, 2, 5, length, tau)
    qm, km = random_mask(rng, "random", 2, length), random_mask(rng, "random", 2, length)

    def attention(a, b, c):
        a, b, c = (keras.ops.cast(t, dtype) for t in (a, b, c))
        return ops.yoso_cumulation(a, b, c, qc, kc, tau, qm, km, implementation="custom_op", causal=causal)

    _, (dq, dk, dv) = vjp(attention, [q, k, v], dy.astype(np.float32))
    want = ref.yoso_lower_bound_gradients(*(rounded(a, dtype) for a in (q, k, v)), qc, kc, tau,
                                          rounded(dy, dtype), qm, km, causal=causal)
    for got, expected in zip((dq, dk, dv), want):
        _assert_close(got, expected, tol)


@pytest.mark.parametrize("side", ["query_codes", "key_codes"])
def test_out_of_range_codes_are_refused_naming_the_codes_by_every_op(side):
    rng = np.random.default_rng(6)
    q, k = unit_rows(rng, (2, 7, 4)), unit_rows(rng, (2, 5, 4))
    v, dy = rng.normal(size=(2, 5, 3)).astype(np.float32), rng.normal(size=(2, 7, 3)).astype(np.float32)
    qc, kc = _codes(rng, 2, 3, 7, 3), _codes(rng, 2, 3, 5, 3)
    (qc if side == "query_codes" else kc)[0, 0, 0] = 2 ** 3
    calls = [lambda: ops.lsh_cumulation(qc, kc, v, 8, implementation="custom_op"),
             lambda: ops.weighted_lsh_cumulation(qc, dy, kc, v, k, 8, implementation="custom_op"),
             lambda: ops.collision_cumulation(qc, q, dy, kc, k, v, 3, implementation="custom_op"),
             lambda: ops.yoso_cumulation(q, k, v, qc, kc, 3, implementation="custom_op")]
    for call in calls:
        with pytest.raises((ValueError, DATA_ERROR), match=rf"{side} has 1 codes outside \[0, num_buckets\)"):
            to_numpy(call())
