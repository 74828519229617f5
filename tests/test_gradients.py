"""Gradients: yoso_cumulation's estimators equal the dense formulas; raw-op gradients are exact."""

import numpy as np
import pytest
import tensorflow as tf

import numpy_reference as ref
from conftest import random_mask, unit_rows
from keras_yoso import ops
from keras_yoso.ops.yoso import COLLISION_EPSILON


def _yoso_grads(q, k, v, qc, kc, tau, dy, qm, km, backward, implementation):
    qt, kt, vt = map(tf.constant, (q, k, v))
    with tf.GradientTape() as tape:
        tape.watch([qt, kt, vt])
        out = ops.yoso_cumulation(qt, kt, vt, qc, kc, tau, qm, km, backward=backward,
                                  implementation=implementation)
        loss = tf.reduce_sum(out * dy)
    return [g.numpy() for g in tape.gradient(loss, [qt, kt, vt])]


@pytest.mark.parametrize("backward", ["lower_bound", "collision"])
@pytest.mark.parametrize("nq,nk,d,dv,m,tau,mask_kind", [
    (17, 23, 8, 5, 7, 4, "random"), (40, 31, 16, 16, 32, 8, "none"), (12, 9, 4, 3, 1, 1, "random"),
    (25, 20, 32, 64, 33, 12, "random"), (6, 8, 4, 2, 5, 3, "zeros"),
])
def test_yoso_cumulation_gradients_equal_dense_estimator_formulas(implementation, backward, nq, nk, d, dv,
                                                                   m, tau, mask_kind):
    rng = np.random.default_rng(nq + nk)
    q, k = unit_rows(rng, (2, nq, d)), unit_rows(rng, (2, nk, d))
    v = rng.normal(size=(2, nk, dv)).astype(np.float32)
    # Low-dimensional codes from the real hash so pairs collide often.
    qc = ops.hash_codes(q, m, tau, seed=4).numpy()
    kc = ops.hash_codes(k, m, tau, seed=4).numpy()
    qm, km = random_mask(rng, mask_kind, 2, nq), random_mask(rng, mask_kind, 2, nk)
    dy = rng.normal(size=(2, nq, dv)).astype(np.float32)
    got = _yoso_grads(q, k, v, qc, kc, tau, dy, qm, km, backward, implementation)
    if backward == "lower_bound":
        want = ref.yoso_lower_bound_gradients(q, k, v, qc, kc, tau, dy, qm, km)
    else:
        want = ref.yoso_collision_gradients(q, k, v, qc, kc, tau, dy, COLLISION_EPSILON, qm, km)
    for name, g, w in zip("QKV", got, want):
        np.testing.assert_allclose(g, w, atol=2e-4 * max(1.0, np.abs(w).max()), rtol=1e-4, err_msg=f"d{name}")


def test_masked_positions_get_zero_gradients(implementation):
    rng = np.random.default_rng(1)
    q, k = unit_rows(rng, (1, 10, 8)), unit_rows(rng, (1, 12, 8))
    v = rng.normal(size=(1, 12, 4)).astype(np.float32)
    qc, kc = ops.hash_codes(q, 8, 2, seed=0).numpy(), ops.hash_codes(k, 8, 2, seed=0).numpy()
    qm = np.arange(10)[None] < 6
    km = np.arange(12)[None] < 7
    for backward in ("lower_bound", "collision"):
        dq, dk, dv = _yoso_grads(q, k, v, qc, kc, 2, np.ones((1, 10, 4), np.float32), qm, km, backward, implementation)
        assert not dq[0, 6:].any() and not dk[0, 7:].any() and not dv[0, 7:].any()
        assert dq[0, :6].any() and dv[0, :7].any()


def test_lsh_cumulation_gradient_matches_numerical_jacobian(implementation):
    rng = np.random.default_rng(2)
    qc = rng.integers(0, 4, (2, 3, 5)).astype(np.int32)
    kc = rng.integers(0, 4, (2, 3, 6)).astype(np.int32)
    km = rng.random((2, 6)) > 0.3
    value = tf.constant(rng.normal(size=(2, 6, 3)), tf.float32)
    fn = lambda v: ops.lsh_cumulation(qc, kc, v, 4, key_mask=km, implementation=implementation)
    theoretical, numerical = tf.test.compute_gradient(fn, [value])
    np.testing.assert_allclose(theoretical[0], numerical[0], atol=1e-3)


def test_weighted_lsh_cumulation_gradients_match_numerical_jacobian(implementation):
    rng = np.random.default_rng(3)
    qc = rng.integers(0, 4, (1, 3, 5)).astype(np.int32)
    kc = rng.integers(0, 4, (1, 3, 6)).astype(np.int32)
    qm = rng.random((1, 5)) > 0.3
    args = [tf.constant(rng.normal(size=s), tf.float32) for s in [(1, 5, 2), (1, 6, 2), (1, 6, 3)]]
    fn = lambda qw, kw, v: ops.weighted_lsh_cumulation(qc, qw, kc, kw, v, 4, query_mask=qm,
                                                       implementation=implementation)
    theoretical, numerical = tf.test.compute_gradient(fn, args)
    for t, n in zip(theoretical, numerical):
        np.testing.assert_allclose(t, n, atol=2e-3)


def test_yoso_expectation_exact_gradient_matches_numerical_jacobian():
    rng = np.random.default_rng(4)
    q, k = unit_rows(rng, (1, 4, 3)) * 0.9, unit_rows(rng, (1, 5, 3)) * 0.9
    args = [tf.constant(q, tf.float64), tf.constant(k, tf.float64), tf.constant(rng.normal(size=(1, 5, 2)), tf.float64)]
    fn = lambda a, b, c: ops.yoso_expectation(a, b, c, 4, backward="exact")
    theoretical, numerical = tf.test.compute_gradient(fn, args, delta=1e-3)
    for t, n in zip(theoretical, numerical):
        np.testing.assert_allclose(t, n, atol=2e-3, rtol=2e-3)


def test_yoso_expectation_lower_bound_gradient_follows_appendix_eq3():
    rng = np.random.default_rng(5)
    q, k = unit_rows(rng, (1, 6, 4)), unit_rows(rng, (1, 7, 4))
    v = rng.normal(size=(1, 7, 3)).astype(np.float32)
    dy = rng.normal(size=(1, 6, 3)).astype(np.float32)
    qt, kt, vt = map(tf.constant, (q, k, v))
    with tf.GradientTape() as tape:
        tape.watch([qt, kt, vt])
        loss = tf.reduce_sum(ops.yoso_expectation(qt, kt, vt, 8) * dy)
    dq, dk, dv = [g.numpy() for g in tape.gradient(loss, [qt, kt, vt])]
    e = ref.expectation_matrix(q, k, 8)
    w = np.einsum("bid,bjd->bij", dy, v) * e * 4.0
    np.testing.assert_allclose(dq, np.einsum("bij,bjd->bid", w, k), atol=1e-4)
    np.testing.assert_allclose(dk, np.einsum("bij,bid->bjd", w, q), atol=1e-4)
    np.testing.assert_allclose(dv, np.einsum("bij,bid->bjd", e, dy), atol=1e-4)
