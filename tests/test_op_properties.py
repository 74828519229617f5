"""Property tests (hypothesis) of the YOSO ops, custom op and composite alike.

Hypothesis draws the shapes (zero-length axes included), the number of hashes, the code
length, the dtype, the mask kind and a seed; NumPy draws the data from that seed. Properties:

- custom op == composite == NumPy reference (hash codes, the three cumulations, the
  gradients of yoso_cumulation: both estimators' dense formulas, on drawn cases and on fixed
  ones with codes hashed from the rows);
- permuting the keys together with their codes, masks, weights and values leaves the
  output unchanged (up to float32 summation order), for the collision estimator too;
- the output is linear in `value`;
- masked keys never contribute, whatever their codes, weights or values (NaN included),
  and masked queries output exactly 0 (collision estimator included);
- outputs are finite for finite inputs; hash codes lie in [0, 2**tau).

The default profile runs 25 examples per property (see conftest.py);
`pytest tests/test_op_properties.py --hypothesis-profile=long` runs 1000.
"""

import keras
import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import numpy_reference as ref
from conftest import IMPLEMENTATIONS, cast, to_numpy, vjp
from keras_yoso import _validation
from keras_yoso import ops

DTYPES = ("bfloat16", "float16", "float32")
# |output - reference| <= RTOL * (the reference computed on |inputs|) + ATOL: float32 sums plus
# the rounding of the output (and, for the linearity test, of the mixed value) to the dtype.
RTOL = {"float32": 2e-5, "float16": 4e-3, "bfloat16": 3e-2}
ATOL = 1e-6


@st.composite
def cumulations(draw, max_length=12, max_width=5):
    """A cumulation problem: sizes, dtype, mask kinds and a data seed."""
    return dict(
        batch=draw(st.integers(0, 3)),
        num_hashes=draw(st.integers(1, 4)),
        hash_code_len=draw(st.integers(1, 6)),
        nq=draw(st.integers(0, max_length)),
        nk=draw(st.integers(0, max_length)),
        value_dim=draw(st.integers(0, max_width)),
        weight_dim=draw(st.integers(0, 4)),
        dtype=draw(st.sampled_from(DTYPES)),
        query_mask=draw(st.sampled_from(["none", "random", "zeros"])),
        key_mask=draw(st.sampled_from(["none", "random", "zeros"])),
        seed=draw(st.integers(0, 2 ** 32 - 1)),
    )


def _rounded(x, dtype):
    """x rounded to dtype, as float32 NumPy (what the op sees, and what the reference uses)."""
    return to_numpy(cast(x, dtype))


def _mask(rng, kind, batch, length):
    if kind == "none":
        return None
    if kind == "zeros":
        return np.zeros((batch, length), bool)
    return rng.random((batch, length)) > 0.4


def _data(case):
    """NumPy inputs of a cumulation problem, rounded to its dtype."""
    rng = np.random.default_rng(case["seed"])
    b, m, nq, nk = case["batch"], case["num_hashes"], case["nq"], case["nk"]
    # Codes from at most 4 buckets, so that collisions are frequent even for large tau.
    high = min(2 ** case["hash_code_len"], 4)
    dtype = case["dtype"]
    return dict(
        qc=rng.integers(0, high, size=(b, m, nq)).astype(np.int32),
        kc=rng.integers(0, high, size=(b, m, nk)).astype(np.int32),
        value=_rounded(rng.uniform(-4, 4, size=(b, nk, case["value_dim"])), dtype),
        qw=_rounded(rng.uniform(-2, 2, size=(b, nq, case["weight_dim"])), dtype),
        kw=_rounded(rng.uniform(-2, 2, size=(b, nk, case["weight_dim"])), dtype),
        qm=_mask(rng, case["query_mask"], b, nq),
        km=_mask(rng, case["key_mask"], b, nk),
    )


def _lsh(case, data, implementation, value=None):
    value = data["value"] if value is None else value
    return ops.lsh_cumulation(data["qc"], data["kc"], cast(value, case["dtype"]), 2 ** case["hash_code_len"],
                              data["qm"], data["km"], implementation=implementation)


def _weighted(case, data, implementation, value=None):
    value = data["value"] if value is None else value
    dtype = case["dtype"]
    return ops.weighted_lsh_cumulation(data["qc"], cast(data["qw"], dtype), data["kc"], cast(data["kw"], dtype),
                                       cast(value, dtype), 2 ** case["hash_code_len"], data["qm"], data["km"],
                                       implementation=implementation)


def _lsh_reference(data, value=None, absolute=False):
    value = data["value"] if value is None else value
    return ref.lsh_cumulation(data["qc"], data["kc"], np.abs(value) if absolute else value, data["qm"], data["km"])


def _weighted_reference(data, value=None, absolute=False):
    value = data["value"] if value is None else value
    f = np.abs if absolute else (lambda x: x)
    return ref.weighted_lsh_cumulation(data["qc"], f(data["qw"]), data["kc"], f(data["kw"]), f(value),
                                       data["qm"], data["km"])


CUMULATIONS = {"lsh": (_lsh, _lsh_reference), "weighted": (_weighted, _weighted_reference)}


def _collision_scale(qc, q, qw, kc, k, kw, tau, qm, km):
    """sum over colliding pairs of |<qw_i, kw_j>| g(<q_i, k_j>) |k_j|: bounds the collision sum's terms."""
    collide = (ref.collision_counts(qc, kc) > 0) * (qm != 0)[:, :, None] * (km != 0)[:, None, :]
    x = np.einsum("bid,bjd->bij", q.astype(np.float64), k.astype(np.float64))
    g = np.abs(np.einsum("biw,bjw->bij", qw.astype(np.float64), kw.astype(np.float64)))
    w = collide * g * ref.collision_derivative(x, tau, _validation.COLLISION_EPSILON)
    return np.einsum("bij,bjd->bid", w, np.abs(k.astype(np.float64)))


def _unit_rows(rng, batch, length, dim):
    x = rng.normal(size=(batch, length, dim))
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def _assert_close(actual, expected, scale, dtype, what):
    actual = to_numpy(actual).astype(np.float64)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    assert np.isfinite(actual).all(), f"{what}: non-finite output for finite inputs"
    error = np.abs(actual - expected)
    bound = RTOL[dtype] * scale + ATOL
    assert (error <= bound).all(), f"{what}: error {error.max()} > bound {bound[error > bound].min()}"


@pytest.mark.parametrize("op", sorted(CUMULATIONS))
@given(case=cumulations())
def test_cumulations_custom_op_composite_and_numpy_agree_and_are_finite(op, case):
    run, reference = CUMULATIONS[op]
    data = _data(case)
    expected, scale = reference(data), reference(data, absolute=True)
    for implementation in IMPLEMENTATIONS:
        out = run(case, data, implementation)
        assert keras.backend.standardize_dtype(out.dtype) == case["dtype"]
        _assert_close(out, expected, scale, case["dtype"], f"{op} {implementation}")


@pytest.mark.parametrize("op", sorted(CUMULATIONS))
@given(case=cumulations(), permutation_seed=st.integers(0, 2 ** 32 - 1))
def test_permuting_keys_with_their_codes_and_values_leaves_the_output_unchanged(op, case, permutation_seed):
    run, reference = CUMULATIONS[op]
    data = _data(case)
    order = np.random.default_rng(permutation_seed).permutation(case["nk"])
    permuted = dict(data, kc=data["kc"][:, :, order], kw=data["kw"][:, order], value=data["value"][:, order],
                    km=None if data["km"] is None else data["km"][:, order])
    scale = reference(data, absolute=True)
    for implementation in IMPLEMENTATIONS:
        original = to_numpy(run(case, data, implementation)).astype(np.float64)
        _assert_close(run(case, permuted, implementation), original, 2 * scale, case["dtype"],
                      f"{op} {implementation}")


@pytest.mark.parametrize("op", sorted(CUMULATIONS))
@given(case=cumulations(), a=st.floats(-3, 3), b=st.floats(-3, 3), other_seed=st.integers(0, 2 ** 32 - 1))
def test_output_is_linear_in_value(op, case, a, b, other_seed):
    run, reference = CUMULATIONS[op]
    data = _data(case)
    dtype = case["dtype"]
    v1 = data["value"]
    v2 = _rounded(np.random.default_rng(other_seed).uniform(-4, 4, size=v1.shape), dtype)
    mixed = _rounded(a * v1.astype(np.float64) + b * v2, dtype)
    scale = abs(a) * reference(data, v1, absolute=True) + abs(b) * reference(data, v2, absolute=True)
    for implementation in IMPLEMENTATIONS:
        f1, f2 = (to_numpy(run(case, data, implementation, v)).astype(np.float64) for v in (v1, v2))
        _assert_close(run(case, data, implementation, mixed), a * f1 + b * f2, 3 * scale, dtype,
                      f"{op} {implementation}")


@pytest.mark.parametrize("op", sorted(CUMULATIONS))
@given(case=cumulations(), garbage_seed=st.integers(0, 2 ** 32 - 1))
def test_masked_keys_never_contribute_and_masked_queries_output_zero(op, case, garbage_seed):
    run, _ = CUMULATIONS[op]
    data = _data(case)
    rng = np.random.default_rng(garbage_seed)
    km = data["km"] if data["km"] is not None else rng.random((case["batch"], case["nk"])) > 0.5
    data = dict(data, km=km)
    masked = ~km
    garbage = dict(data)
    kc = data["kc"].copy()
    kc[np.broadcast_to(masked[:, None, :], kc.shape)] = rng.integers(0, 2 ** case["hash_code_len"],
                                                                     size=int(masked.sum()) * case["num_hashes"])
    garbage["kc"] = kc
    for name in ("value", "kw"):
        x = data[name].copy()
        x[masked] = rng.choice([np.nan, np.inf, -np.inf, 3e4], size=x[masked].shape)
        garbage[name] = x
    for implementation in IMPLEMENTATIONS:
        clean = to_numpy(run(case, data, implementation))
        dirty = to_numpy(run(case, garbage, implementation))
        assert np.array_equal(clean, dirty), f"{op} {implementation}: a masked key changed the output"
        if data["qm"] is not None:
            assert (dirty[~data["qm"]] == 0).all(), f"{op} {implementation}: a masked query is not 0"


# Unit rows in >= 4 dimensions: pairs within float32 rounding of parallel (where the *YOSO
# derivative 1 / sqrt(1 - x^2 + eps) turns rounding into large differences) are then vanishingly rare.
def _collision_data(case, dim):
    """Inputs of the *YOSO collision estimator: codes and masks of `case`, unit q/k rows, weights."""
    rng = np.random.default_rng(case["seed"])
    data = _data(dict(case, dtype="float32"))
    b, nq, nk, w = case["batch"], case["nq"], case["nk"], case["value_dim"]
    q, k = _unit_rows(rng, b, nq, dim), _unit_rows(rng, b, nk, dim)
    qw, kw = (rng.uniform(-2, 2, size=(b, n, w)).astype(np.float32) for n in (nq, nk))
    qm = np.ones((b, nq), np.float32) if data["qm"] is None else data["qm"].astype(np.float32)
    km = np.ones((b, nk), np.float32) if data["km"] is None else data["km"].astype(np.float32)
    return dict(qc=data["qc"], q=q, qw=qw, qm=qm, kc=data["kc"], k=k, kw=kw, km=km, tau=case["hash_code_len"])


def _collision(d, implementation):
    return ops.collision_cumulation(d["qc"], d["q"], d["qw"], d["kc"], d["k"], d["kw"], d["tau"], d["qm"], d["km"],
                                    implementation=implementation)


def _collision_bound(d):
    return _collision_scale(d["qc"], d["q"], d["qw"], d["kc"], d["k"], d["kw"], d["tau"], d["qm"], d["km"])


@given(case=cumulations(max_width=4), dim=st.integers(4, 8))
def test_collision_cumulation_custom_op_composite_and_numpy_agree(case, dim):
    d = _collision_data(case, dim)
    expected = ref.collision_cumulation(d["qc"], d["q"], d["qw"], d["kc"], d["k"], d["kw"], d["tau"],
                                        _validation.COLLISION_EPSILON, d["qm"], d["km"])
    for implementation in IMPLEMENTATIONS:
        _assert_close(_collision(d, implementation), expected, 100 * _collision_bound(d), "float32",
                      f"collision {implementation}")


@given(case=cumulations(max_width=4), dim=st.integers(4, 8), permutation_seed=st.integers(0, 2 ** 32 - 1))
def test_collision_estimator_is_unchanged_by_permuting_keys_with_their_codes_and_weights(case, dim,
                                                                                       permutation_seed):
    d = _collision_data(case, dim)
    order = np.random.default_rng(permutation_seed).permutation(case["nk"])
    permuted = dict(d, kc=d["kc"][:, :, order], k=d["k"][:, order], kw=d["kw"][:, order], km=d["km"][:, order])
    for implementation in IMPLEMENTATIONS:
        original = to_numpy(_collision(d, implementation)).astype(np.float64)
        _assert_close(_collision(permuted, implementation), original, 200 * _collision_bound(d), "float32",
                      f"collision {implementation}")


@given(case=cumulations(max_width=4), dim=st.integers(4, 8), garbage_seed=st.integers(0, 2 ** 32 - 1))
def test_collision_estimator_ignores_masked_keys_whatever_their_codes_and_content(case, dim, garbage_seed):
    d = _collision_data(case, dim)
    rng = np.random.default_rng(garbage_seed)
    masked = d["km"] == 0
    garbage = dict(d, kc=d["kc"].copy(), k=d["k"].copy(), kw=d["kw"].copy())
    garbage["kc"][np.broadcast_to(masked[:, None, :], d["kc"].shape)] = rng.integers(
        0, 2 ** d["tau"], size=int(masked.sum()) * case["num_hashes"])
    for name in ("k", "kw"):
        garbage[name][masked] = rng.choice([np.nan, np.inf, -np.inf, 3e4], size=garbage[name][masked].shape)
    for implementation in IMPLEMENTATIONS:
        clean, dirty = to_numpy(_collision(d, implementation)), to_numpy(_collision(garbage, implementation))
        assert np.array_equal(clean, dirty), f"collision {implementation}: a masked key changed the output"
        assert (dirty[d["qm"] == 0] == 0).all(), f"collision {implementation}: a masked query is not 0"


# Fixed cases with codes hashed from the rows (over up to 2**hash_code_len buckets, where the drawn codes
# take at most 4): wide heads, many hashes, long codes. (nq, nk, dim, value_dim, num_hashes, hash_code_len, masks)
HASHED_CASES = [(17, 23, 8, 5, 7, 4, "random"), (40, 31, 16, 16, 32, 8, "none"), (12, 9, 4, 3, 1, 1, "random"),
                (25, 20, 32, 64, 33, 12, "random"), (6, 8, 4, 2, 5, 3, "zeros")]


def _hashed_examples(test):
    """`test` with the HASHED_CASES, under each sampled backward, as explicit examples of its @given."""
    for backward in _validation.SAMPLED_BACKWARDS:
        for nq, nk, dim, value_dim, num_hashes, hash_code_len, masks in HASHED_CASES:
            case = dict(batch=2, num_hashes=num_hashes, hash_code_len=hash_code_len, nq=nq, nk=nk,
                        value_dim=value_dim, weight_dim=0, dtype="float32", query_mask=masks, key_mask=masks,
                        seed=nq + nk)
            test = example(case=case, dim=dim, backward=backward, hashed=True)(test)
    return test


@_hashed_examples
@given(case=cumulations(max_width=4), dim=st.integers(4, 8),
       backward=st.sampled_from(_validation.SAMPLED_BACKWARDS), hashed=st.booleans())
def test_yoso_cumulation_gradients_custom_op_composite_and_numpy_agree(case, dim, backward, hashed):
    rng = np.random.default_rng(case["seed"])
    data = _data(dict(case, dtype="float32"))
    b, nq, nk, dv, tau = case["batch"], case["nq"], case["nk"], case["value_dim"], case["hash_code_len"]
    qc, kc, qm, km, v = data["qc"], data["kc"], data["qm"], data["km"], data["value"]
    q, k = _unit_rows(rng, b, nq, dim), _unit_rows(rng, b, nk, dim)
    if hashed:
        qc, kc = (to_numpy(ops.hash_codes(x, case["num_hashes"], tau, seed=4)) for x in (q, k))
    dy = rng.normal(size=(b, nq, dv)).astype(np.float32)
    if backward == "lower_bound":
        expected = ref.yoso_lower_bound_gradients(q, k, v, qc, kc, tau, dy, qm, km)
        scale = ref.yoso_lower_bound_gradients(np.abs(q), np.abs(k), np.abs(v), qc, kc, tau, np.abs(dy), qm, km)
    else:
        expected = ref.yoso_collision_gradients(q, k, v, qc, kc, tau, dy, _validation.COLLISION_EPSILON, qm, km)
        ones = lambda n: np.ones((b, n))  # noqa: E731
        qmf, kmf = (ones(nq) if qm is None else qm), (ones(nk) if km is None else km)
        scale = (_collision_scale(qc, q, dy, kc, k, v, tau, qmf, kmf),
                 _collision_scale(kc, k, v, qc, q, dy, tau, kmf, qmf),
                 ref.lsh_cumulation(kc, qc, np.abs(dy), km, qm))
    for implementation in IMPLEMENTATIONS:
        def attention(q, k, v, implementation=implementation):
            return ops.yoso_cumulation(q, k, v, qc, kc, tau, qm, km, backward=backward, implementation=implementation)

        _, grads = vjp(attention, [q, k, v], dy)
        for name, grad, want, bound in zip("qkv", grads, expected, scale):
            what = f"d{name} {backward} {implementation}"
            _assert_close(grad, want, 100 * bound, "float32", what)
            # And within 2e-4 of the largest entry (at least 1) plus 1e-4 relative: the dense formulas' bound.
            np.testing.assert_allclose(to_numpy(grad), want, atol=2e-4 * max(1.0, np.abs(want).max(initial=0)),
                                       rtol=1e-4, err_msg=what)


@given(batch=st.integers(0, 2), length=st.integers(0, 9), dim=st.integers(1, 20), num_hashes=st.integers(1, 5),
       hash_code_len=st.integers(1, 12), method=st.sampled_from(_validation.HASH_METHODS),
       dtype=st.sampled_from(DTYPES), nan_rows=st.integers(0, 3), seed=st.integers(0, 2 ** 32 - 1))
def test_hash_codes_agree_across_implementations_are_in_range_and_nan_rows_hash_to_zero(
        batch, length, dim, num_hashes, hash_code_len, method, dtype, nan_rows, seed):
    rng = np.random.default_rng(seed)
    x = _rounded(rng.normal(size=(batch, length, dim)) * 10.0 ** rng.integers(-3, 4), dtype)
    nan = np.zeros((batch, length), bool)
    if batch * length:
        nan.flat[rng.integers(0, batch * length, size=nan_rows)] = True
        x[nan, rng.integers(0, dim)] = np.nan
    params = to_numpy(ops.hash_parameters(dim, num_hashes, hash_code_len, seed % 1000, method))
    expected = ref.hash_codes(
        np.nan_to_num(x), params, num_hashes, hash_code_len, method)
    # Bits whose projection is within float32 rounding of 0 may differ between implementations;
    # exact zeros (structural zeros of the Hadamard transform) may not.
    matrix = params if method == "gaussian" else ref.hadamard_projection_matrix(
        params, dim, method == "hadamard_interleaved")
    x64 = np.nan_to_num(x).astype(np.float64)
    projected = np.einsum("bnd,dk->bnk", x64, matrix)[..., :num_hashes * hash_code_len]
    magnitude = np.einsum("bnd,dk->bnk", np.abs(x64), np.abs(matrix))[..., :num_hashes * hash_code_len]
    bits = (np.abs(projected) <= 1e-5 * magnitude) & (magnitude > 0)
    bits = bits.reshape(batch, length, num_hashes, hash_code_len)
    ambiguous = np.transpose((bits * (1 << np.arange(hash_code_len))).sum(-1), (0, 2, 1))
    expected = np.where(nan[:, None, :], 0, expected)
    for implementation in IMPLEMENTATIONS:
        codes = to_numpy(ops.hash_codes(cast(x, dtype), num_hashes, hash_code_len, seed % 1000, method,
                                        implementation=implementation))
        assert codes.shape == (batch, num_hashes, length) and codes.dtype == np.int32
        assert codes.size == 0 or (codes.min() >= 0 and codes.max() < 2 ** hash_code_len)
        assert (codes.transpose(0, 2, 1)[nan] == 0).all(), f"{implementation}: a NaN row did not hash to 0"
        assert ((codes ^ expected) & ~ambiguous == 0).all(), f"{method} {implementation}: codes differ"
