"""Every op equals its dense NumPy reference, on every backend and implementation, over a grid of shapes."""

import keras
import numpy as np
import pytest

import numpy_reference as ref
from conftest import IMPLEMENTATIONS, cast, random_mask, rounded, to_numpy, unit_rows
from keras_yoso import _validation
from keras_yoso import ops

# Each value of every axis appears at least once (Nq != Nk throughout):
# (Nq, Nk, D, m, tau, mask kind)
CUMULATION_GRID = [
    (7, 9, 3, 5, 8, "random"),
    (0, 7, 3, 5, 8, "random"),
    (7, 0, 3, 5, 8, "random"),
    (1, 7, 64, 1, 1, "none"),
    (1000, 700, 64, 32, 8, "random"),
    (700, 1000, 100, 33, 12, "random"),
    (7, 1, 1, 33, 12, "zeros"),
    (64, 48, 100, 32, 1, "none"),
    (37, 29, 3, 5, 12, "zeros"),
]
DTYPES = [("float32", 1e-5), ("float16", 2e-2), ("bfloat16", 8e-2)]


def _codes(rng, batch, m, n, tau):
    return rng.integers(0, 2 ** tau, size=(batch, m, n)).astype(np.int32)


def _assert_close(actual, expected, tol):
    actual = to_numpy(actual)
    scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
    np.testing.assert_allclose(actual, expected, atol=tol * scale, rtol=tol)


@pytest.mark.parametrize("nq,nk,d,m,tau,mask_kind", CUMULATION_GRID)
def test_lsh_cumulation_matches_reference(implementation, nq, nk, d, m, tau, mask_kind):
    rng = np.random.default_rng(nq + 3 * nk + d)
    qc, kc = _codes(rng, 2, m, nq, tau), _codes(rng, 2, m, nk, tau)
    value = rng.normal(size=(2, nk, d)).astype(np.float32)
    qm, km = random_mask(rng, mask_kind, 2, nq), random_mask(rng, mask_kind, 2, nk)
    out = ops.lsh_cumulation(qc, kc, value, 2 ** tau, qm, km, implementation=implementation)
    assert out.shape == (2, nq, d)
    _assert_close(out, ref.lsh_cumulation(qc, kc, value, qm, km), 1e-5)


@pytest.mark.parametrize("nq,nk,d,m,tau,mask_kind", CUMULATION_GRID)
def test_weighted_lsh_cumulation_matches_reference(implementation, nq, nk, d, m, tau, mask_kind):
    rng = np.random.default_rng(7 * nq + nk + d)
    width = 1 + d % 5
    qc, kc = _codes(rng, 2, m, nq, tau), _codes(rng, 2, m, nk, tau)
    qw = rng.normal(size=(2, nq, width)).astype(np.float32)
    kw = rng.normal(size=(2, nk, width)).astype(np.float32)
    value = rng.normal(size=(2, nk, d)).astype(np.float32)
    qm, km = random_mask(rng, mask_kind, 2, nq), random_mask(rng, mask_kind, 2, nk)
    out = ops.weighted_lsh_cumulation(qc, qw, kc, kw, value, 2 ** tau, qm, km, implementation=implementation)
    _assert_close(out, ref.weighted_lsh_cumulation(qc, qw, kc, kw, value, qm, km), 1e-5)


@pytest.mark.parametrize("dtype,tol", DTYPES, ids=lambda v: str(v))
def test_half_precision_inputs_accumulate_in_float32(implementation, dtype, tol):
    rng = np.random.default_rng(5)
    qc, kc = _codes(rng, 3, 32, 300, 4), _codes(rng, 3, 32, 200, 4)
    value = rng.normal(size=(3, 200, 16)).astype(np.float32)
    out = ops.lsh_cumulation(qc, kc, cast(value, dtype), 16, implementation=implementation)
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    # Reference on the rounded inputs: the only error left is the output rounding.
    _assert_close(out, ref.lsh_cumulation(qc, kc, rounded(value, dtype)), tol)
    qw = rng.normal(size=(3, 300, 4))
    kw = rng.normal(size=(3, 200, 4))
    out = ops.weighted_lsh_cumulation(qc, cast(qw, dtype), kc, cast(kw, dtype), cast(value, dtype), 16,
                                      implementation=implementation)
    expected = ref.weighted_lsh_cumulation(qc, rounded(qw, dtype), kc, rounded(kw, dtype), rounded(value, dtype))
    _assert_close(out, expected, tol)


@pytest.mark.parametrize("method", _validation.HASH_METHODS)
@pytest.mark.parametrize("n,d,m,tau", [(7, 3, 5, 8), (0, 16, 4, 4), (1, 64, 32, 8), (300, 100, 33, 12), (50, 5, 1, 1)])
def test_hash_codes_match_reference(implementation, method, n, d, m, tau):
    rng = np.random.default_rng(n + d)
    x = rng.normal(size=(2, n, d)).astype(np.float32)
    codes = to_numpy(ops.hash_codes(x, m, tau, seed=11, method=method, implementation=implementation))
    params = to_numpy(ops.hash_parameters(d, m, tau, 11, method))
    expected = ref.hash_codes(x, params, m, tau, method)
    assert codes.shape == (2, m, n) and codes.dtype == np.int32
    assert codes.size == 0 or (codes.min() >= 0 and codes.max() < 2 ** tau)
    # A sign can only differ from the float64 reference where the projection is ~0.
    assert (codes == expected).mean() >= 0.995 if codes.size else True


@pytest.mark.parametrize("method", _validation.HASH_METHODS)
def test_hash_codes_agree_between_implementations(method):
    if len(IMPLEMENTATIONS) < 2:
        pytest.skip("no custom ops expected (backend or KERAS_YOSO_DISABLE_CUSTOM_OPS=1)")
    x = np.random.default_rng(0).normal(size=(3, 500, 48)).astype(np.float32)
    for seed in (7, [1, 2]):
        a = to_numpy(ops.hash_codes(x, 16, 8, seed=seed, method=method, implementation="custom_op"))
        b = to_numpy(ops.hash_codes(x, 16, 8, seed=seed, method=method, implementation="composite"))
        assert (a == b).mean() >= 0.999


def test_same_seed_gives_same_hash_functions_and_other_seeds_differ():
    x = np.random.default_rng(0).normal(size=(1, 64, 16)).astype(np.float32)
    a = to_numpy(ops.hash_codes(x, 8, 8, seed=5))
    assert np.array_equal(a, to_numpy(ops.hash_codes(x, 8, 8, seed=5)))
    assert not np.array_equal(a, to_numpy(ops.hash_codes(x, 8, 8, seed=6)))
    for seed in ([3, 4], np.array([3, 4], np.int64)):
        assert np.array_equal(to_numpy(ops.hash_codes(x, 8, 8, seed=seed)), to_numpy(ops.hash_codes(x, 8, 8, [3, 4])))
    assert not np.array_equal(to_numpy(ops.hash_codes(x, 8, 8, seed=[3, 5])), to_numpy(ops.hash_codes(x, 8, 8, [3, 4])))


def test_int_seeds_give_the_same_hash_functions_on_every_backend():
    """Pinned values of NumPy's frozen RandomState stream: the same on TensorFlow, JAX and torch."""
    gaussian = to_numpy(ops.hash_parameters(3, 2, 2, 0, "gaussian"))
    np.testing.assert_allclose(gaussian[0], [-0.3625903, -0.41597474, 0.9548649, -0.9255024], rtol=1e-6)
    signs = to_numpy(ops.hash_parameters(3, 2, 2, 0, "hadamard"))
    assert signs.shape == (1, 3, 4)
    np.testing.assert_array_equal(signs[0], [[1, 1, 1, -1], [-1, -1, 1, 1], [1, -1, -1, -1]])


@pytest.mark.parametrize("nq,nk,d,dv,m,tau,mask_kind", [
    (9, 13, 8, 4, 5, 4, "random"), (31, 17, 16, 3, 32, 8, "random"), (12, 12, 4, 1, 1, 1, "none"),
    (0, 5, 4, 2, 3, 4, "none"), (6, 5, 4, 2, 3, 4, "zeros"), (40, 64, 64, 64, 33, 12, "random"),
])
def test_collision_cumulation_matches_reference(implementation, nq, nk, d, dv, m, tau, mask_kind):
    rng = np.random.default_rng(nq * nk + d)
    q, k = unit_rows(rng, (2, nq, d)), unit_rows(rng, (2, nk, d))
    qw = rng.normal(size=(2, nq, dv)).astype(np.float32)
    kw = rng.normal(size=(2, nk, dv)).astype(np.float32)
    qc, kc = _codes(rng, 2, m, nq, tau), _codes(rng, 2, m, nk, tau)
    qm, km = random_mask(rng, mask_kind, 2, nq), random_mask(rng, mask_kind, 2, nk)
    out = ops.collision_cumulation(qc, q, qw, kc, k, kw, tau, qm, km, implementation=implementation)
    expected = ref.collision_cumulation(qc, q, qw, kc, k, kw, tau, _validation.COLLISION_EPSILON, qm, km)
    _assert_close(out, expected, 1e-4)


def test_yoso_expectation_matches_reference():
    rng = np.random.default_rng(3)
    q, k = unit_rows(rng, (2, 19, 8)), unit_rows(rng, (2, 23, 8))
    v = rng.normal(size=(2, 23, 5)).astype(np.float32)
    qm, km = random_mask(rng, "random", 2, 19), random_mask(rng, "random", 2, 23)
    out = ops.yoso_expectation(q, k, v, 8, qm, km)
    _assert_close(out, ref.yoso_expectation(q, k, v, 8, qm, km), 1e-5)


def test_yoso_expectation_is_finite_at_parallel_and_antiparallel_pairs():
    from conftest import vjp
    q = np.array([[[1.0, 0.0], [0.0, 1.0]]], np.float32)
    k = np.array([[[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0]]], np.float32)
    v = np.ones((1, 3, 2), np.float32)
    for backward in ("lower_bound", "exact"):
        out, grads = vjp(lambda a, b, c: ops.yoso_expectation(a, b, c, 8, backward=backward), [q, k, v],
                         np.ones((1, 2, 2)))
        assert np.isfinite(out).all()
        assert all(np.isfinite(g).all() for g in grads)


def test_yoso_expectation_weights_match_reference_and_drive_yoso_expectation():
    rng = np.random.default_rng(6)
    q, k = unit_rows(rng, (2, 11, 8)), unit_rows(rng, (2, 13, 8))
    v = rng.normal(size=(2, 13, 4)).astype(np.float32)
    qm, km = random_mask(rng, "random", 2, 11), random_mask(rng, "random", 2, 13)
    weights = to_numpy(ops.yoso_expectation_weights(q, k, 6, qm, km))
    expected = ref.expectation_matrix(q, k, 6) * qm[:, :, None] * km[:, None, :]
    _assert_close(weights, expected, 1e-5)
    _assert_close(ops.yoso_expectation(q, k, v, 6, qm, km), np.einsum("bij,bjd->bid", expected, v), 1e-5)
