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


_ANGLES = (0.3, 1.0, 1.5)


def _collision_rates(dim, tau, method, implementation, draws=16, pairs=256, num_hashes=32):
    """[draws, angles]: per hash draw (int seed), the fraction of (pair, hash) trials whose codes
    collide, for `pairs` random pairs of unit `dim`-vectors at each angle of _ANGLES."""
    rng = np.random.default_rng(dim * 100 + tau)
    rates = []
    for seed in range(draws):
        sides = [_pairs_at_angle(rng, pairs, dim, theta) for theta in _ANGLES]
        x = np.concatenate([np.concatenate(side) for side in sides])[None].astype(np.float32)
        codes = to_numpy(ops.hash_codes(x, num_hashes, tau, seed=seed, method=method, implementation=implementation))
        codes = codes[0].reshape(num_hashes, len(_ANGLES), 2, pairs)
        rates.append((codes[:, :, 0] == codes[:, :, 1]).mean(axis=(0, 2)))
    return np.array(rates)


@pytest.mark.parametrize("dim", [8, 24, 64, 128])
def test_default_hash_collides_with_probability_one_minus_angle_over_pi_to_the_tau(dim, implementation):
    """YOSO eq. 1 for the default hash, over angles, head sizes (24: zero-padded to 32) and tau in
    [1, 16], on this backend and provider: within 4 standard errors of the mean over 16 hash
    draws (each draw: 32 hashes of 256 random pairs per angle)."""
    for tau in (1, 4, 8, 16):
        rates = _collision_rates(dim, tau, "hadamard_interleaved", implementation)
        expected = (1 - np.array(_ANGLES) / np.pi) ** tau
        measured, error = rates.mean(0), rates.std(0, ddof=1) / np.sqrt(len(rates))
        kept = expected > 1e-3  # enough collisions to measure at this sample size
        assert np.all(np.abs(measured - expected)[kept] <= 4 * error[kept] + 1e-4), (tau, measured, expected, error)


def test_legacy_hadamard_hash_falls_short_of_the_formula_at_small_head_sizes(implementation):
    """Why the default changed: "hadamard" takes a hash's tau bits from orthogonal rows of one block,
    whose signs are dependent; at d = 16, tau = 8 it collides far less often than (1 - theta/pi)^tau
    at wide angles (the same measurement as the test above, which it fails)."""
    rates = _collision_rates(16, 8, "hadamard", implementation).mean(0)
    expected = (1 - np.array(_ANGLES) / np.pi) ** 8
    assert rates[2] < 0.6 * expected[2], (rates, expected)


def _mean_angle(x, y):
    cos = (x * y).sum(-1) / (np.linalg.norm(x, axis=-1) * np.linalg.norm(y, axis=-1) + 1e-12)
    return float(np.degrees(np.arccos(np.clip(cos, -1, 1))).mean())


def _errors_of_the_mean_over_hash_draws(method):
    """{D: relative Frobenius error of the mean of sampled YOSO (eq. 2, 64 hashes of 8 bits) over D
    independent hash draws, against YOSO-E E.V} at D = 4, 16, 64; head size 16."""
    rng = np.random.default_rng(5)
    tau, n, m = 8, 128, 64
    q, k = unit_rows(rng, (1, n, 16)), unit_rows(rng, (1, n, 16))
    k = q + 0.6 * k  # keys near the queries, so the kernel has weight to estimate at tau = 8
    k = (k / np.linalg.norm(k, axis=-1, keepdims=True)).astype(np.float32)
    v = rng.normal(size=(1, n, 4)).astype(np.float32)
    expected = ref.yoso_expectation(q, k, v, tau)[0]
    total, errors = np.zeros_like(expected), {}
    for draw in range(1, 65):
        qc = to_numpy(ops.hash_codes(q, m, tau, seed=draw, method=method))
        kc = to_numpy(ops.hash_codes(k, m, tau, seed=draw, method=method))
        total += to_numpy(ops.lsh_cumulation(qc, kc, v, 2 ** tau))[0]
        if draw in (4, 16, 64):
            errors[draw] = np.linalg.norm(total / draw - expected) / np.linalg.norm(expected)
    return errors


@pytest.mark.parametrize("method", ["hadamard_interleaved", "gaussian"])
def test_sampled_yoso_averaged_over_hash_draws_converges_to_the_expectation(method):
    """The mean over D hash draws converges to YOSO-E like 1/sqrt(D) (each 4x more draws: about 2x
    smaller), with no floor, at head size 16 and tau 8, with the default hash as with Gaussian ones."""
    errors = _errors_of_the_mean_over_hash_draws(method)
    assert errors[16] < 0.65 * errors[4] and errors[64] < 0.65 * errors[16] and errors[64] < 0.08, errors


def test_legacy_hadamard_hash_converges_to_another_kernel():
    """The same mean with "hadamard" stops about 20% away from YOSO-E (its bits are dependent)."""
    errors = _errors_of_the_mean_over_hash_draws("hadamard")
    assert errors[64] > 0.15 and errors[64] > 0.75 * errors[16], errors


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
