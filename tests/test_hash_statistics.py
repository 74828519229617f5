"""Statistical properties of YOSO's LSH: collision rates and convergence to YOSO-E."""

import numpy as np
import pytest

import numpy_reference as ref
from conftest import to_numpy, unit_rows
from keras_yoso import ops


def _pairs_at_angle(rng, count, dim, theta):
    a = unit_rows(rng, (count, dim)).astype(np.float64)
    r = rng.normal(size=(count, dim))
    r -= (r * a).sum(-1, keepdims=True) * a
    r /= np.linalg.norm(r, axis=-1, keepdims=True)
    return a, np.cos(theta) * a + np.sin(theta) * r


@pytest.mark.parametrize("tau", [1, 2, 4])
@pytest.mark.parametrize("theta", [0.3, 1.0, 2.0])
def test_collision_rate_matches_one_minus_angle_over_pi_to_the_tau(tau, theta):
    rng = np.random.default_rng(int(theta * 10) + tau)
    a, b = _pairs_at_angle(rng, 400, 16, theta)
    m = 64
    ca = to_numpy(ops.hash_codes(a[None].astype(np.float32), m, tau, seed=9, method="gaussian"))
    cb = to_numpy(ops.hash_codes(b[None].astype(np.float32), m, tau, seed=9, method="gaussian"))
    rate = (ca == cb).mean()
    expected = (1 - theta / np.pi) ** tau
    trials = 400 * m
    # Hashes of one pair are independent, pairs are independent: binomial standard error.
    assert abs(rate - expected) < 5 * np.sqrt(expected * (1 - expected) / trials) + 1e-3


def test_hadamard_hash_approximates_the_collision_rate_at_moderate_dimension():
    rng = np.random.default_rng(1)
    a, b = _pairs_at_angle(rng, 400, 64, 1.0)
    ca = to_numpy(ops.hash_codes(a[None].astype(np.float32), 64, 2, seed=3, method="hadamard"))
    cb = to_numpy(ops.hash_codes(b[None].astype(np.float32), 64, 2, seed=3, method="hadamard"))
    assert abs((ca == cb).mean() - (1 - 1.0 / np.pi) ** 2) < 0.03


def _mean_angle(x, y):
    cos = (x * y).sum(-1) / (np.linalg.norm(x, axis=-1) * np.linalg.norm(y, axis=-1) + 1e-12)
    return float(np.degrees(np.arccos(np.clip(cos, -1, 1))).mean())


def test_lsh_cumulation_converges_to_yoso_expectation_as_hashes_grow():
    rng = np.random.default_rng(2)
    tau, n = 4, 256
    q, k = unit_rows(rng, (1, n, 16)), unit_rows(rng, (1, n, 16))
    v = rng.normal(size=(1, n, 8)).astype(np.float32)
    expected = ref.yoso_expectation(q, k, v, tau)
    angles = []
    for m in (4, 32, 256):
        qc = to_numpy(ops.hash_codes(q, m, tau, seed=m))
        kc = to_numpy(ops.hash_codes(k, m, tau, seed=m))
        angles.append(_mean_angle(to_numpy(ops.lsh_cumulation(qc, kc, v, 2 ** tau)), expected))
    # A Monte-Carlo average over m hashes: the error shrinks like 1/sqrt(m), ~2.8x per 8x more hashes
    # once it is small (a large angle error saturates, so the first step is weaker).
    assert angles[0] > 1.5 * angles[1] and angles[1] > 2.0 * angles[2], angles
