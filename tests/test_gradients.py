"""Gradients on every backend: masked positions get none; the cumulations' gradients match finite
differences; YOSO-E follows appendix eq. 2-3. (That yoso_cumulation's gradients equal the dense
estimator formulas is a property of tests/test_op_properties.py.)"""

import numpy as np

import numpy_reference as ref
from conftest import numerical_jacobian_check, to_numpy, unit_rows, vjp
from keras_yoso import ops


def _yoso_grads(q, k, v, qc, kc, tau, dy, qm, km, backward, implementation):
    def attention(q, k, v):
        return ops.yoso_cumulation(q, k, v, qc, kc, tau, qm, km, backward=backward, implementation=implementation)

    return vjp(attention, [q, k, v], dy)[1]


def test_masked_positions_get_zero_gradients(implementation):
    rng = np.random.default_rng(1)
    q, k = unit_rows(rng, (1, 10, 8)), unit_rows(rng, (1, 12, 8))
    v = rng.normal(size=(1, 12, 4)).astype(np.float32)
    qc, kc = to_numpy(ops.hash_codes(q, 8, 2, seed=0)), to_numpy(ops.hash_codes(k, 8, 2, seed=0))
    qm = np.arange(10)[None] < 6
    km = np.arange(12)[None] < 7
    for backward in ("lower_bound", "collision"):
        dq, dk, dv = _yoso_grads(q, k, v, qc, kc, 2, np.ones((1, 10, 4), np.float32), qm, km, backward, implementation)
        assert not dq[0, 6:].any() and not dk[0, 7:].any() and not dv[0, 7:].any()
        assert dq[0, :6].any() and dv[0, :7].any()


def test_lsh_cumulation_gradient_matches_finite_differences(implementation):
    rng = np.random.default_rng(2)
    qc = rng.integers(0, 4, (2, 3, 5)).astype(np.int32)
    kc = rng.integers(0, 4, (2, 3, 6)).astype(np.int32)
    km = rng.random((2, 6)) > 0.3
    value = rng.normal(size=(2, 6, 3)).astype(np.float32)
    numerical_jacobian_check(lambda v: ops.lsh_cumulation(qc, kc, v, 4, key_mask=km, implementation=implementation),
                             [value])


def test_weighted_lsh_cumulation_gradients_match_finite_differences(implementation):
    rng = np.random.default_rng(3)
    qc = rng.integers(0, 4, (1, 3, 5)).astype(np.int32)
    kc = rng.integers(0, 4, (1, 3, 6)).astype(np.int32)
    qm = rng.random((1, 5)) > 0.3
    args = [rng.normal(size=s).astype(np.float32) for s in [(1, 5, 2), (1, 6, 2), (1, 6, 3)]]
    numerical_jacobian_check(lambda qw, kw, v: ops.weighted_lsh_cumulation(qc, qw, kc, kw, v, 4, query_mask=qm,
                                                                           implementation=implementation), args)


def test_yoso_expectation_exact_gradient_matches_finite_differences():
    rng = np.random.default_rng(4)
    q, k = unit_rows(rng, (1, 4, 3)) * 0.9, unit_rows(rng, (1, 5, 3)) * 0.9
    v = rng.normal(size=(1, 5, 2)).astype(np.float32)
    numerical_jacobian_check(lambda a, b, c: ops.yoso_expectation(a, b, c, 4, backward="exact"), [q, k, v],
                             delta=1e-2, atol=5e-3, rtol=5e-3)


def test_yoso_expectation_lower_bound_gradient_follows_appendix_eq3():
    rng = np.random.default_rng(5)
    q, k = unit_rows(rng, (1, 6, 4)), unit_rows(rng, (1, 7, 4))
    v = rng.normal(size=(1, 7, 3)).astype(np.float32)
    dy = rng.normal(size=(1, 6, 3)).astype(np.float32)
    _, (dq, dk, dv) = vjp(lambda a, b, c: ops.yoso_expectation(a, b, c, 8), [q, k, v], dy)
    e = ref.expectation_matrix(q, k, 8)
    w = np.einsum("bid,bjd->bij", dy, v) * e * 4.0
    np.testing.assert_allclose(dq, np.einsum("bij,bjd->bid", w, k), atol=1e-4)
    np.testing.assert_allclose(dk, np.einsum("bij,bid->bjd", w, q), atol=1e-4)
    np.testing.assert_allclose(dv, np.einsum("bij,bid->bjd", e, dy), atol=1e-4)
