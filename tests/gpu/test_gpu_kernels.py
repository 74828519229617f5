"""Every launcher of custom_ops/cc/kernels/yoso_gpu.h against the NumPy references.

Runs without TensorFlow: build.sh compiles yoso_gpu.cu with the extern "C" shims
of harness_api.cu into build/libyoso_gpu_harness.so, which is called here through
ctypes on CuPy arrays and CuPy's current stream. Skipped (not failed) where CuPy
or a CUDA device is missing, e.g. on the CPU-only CI machine.

Inputs are rounded to the kernel dtype first and the float64 references of
tests/numpy_reference.py see the rounded values, so the only differences are
float32 accumulation and the final rounding of the output. Every case prints
its max abs error; the module ends with a per-op summary (run with -s).

Run: bash tests/gpu/build.sh && python -m pytest tests/gpu -q -s
"""

import itertools
import os
import sys
import zlib

import numpy as np
import pytest

cp = pytest.importorskip("cupy")


def _cuda_device_count():
    try:
        return cp.cuda.runtime.getDeviceCount()
    except cp.cuda.runtime.CUDARuntimeError:
        return 0


if _cuda_device_count() == 0:
    pytest.skip("no CUDA device", allow_module_level=True)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness_library import DTYPE_CODES  # noqa: E402
from harness_library import load_library  # noqa: E402
from numpy_reference import (  # noqa: E402
    collision_cumulation,
    gaussian_hash_codes,
    hadamard_hash_codes,
    lsh_cumulation,
    weighted_lsh_cumulation,
)

# The max abs error allowed relative to max(1, max |ref|).
TOLERANCE = {"float32": 1e-4, "float16": 2e-3, "bfloat16": 1.6e-2}
CUDA_ERROR_INVALID_VALUE = 1

LENGTH_PAIRS = [(0, 7), (7, 0), (1, 1), (7, 1000), (1000, 7), (1000, 1000)]
VALUE_DIMS = [1, 3, 64, 100]
NUM_HASHES = [1, 5, 32, 33]
CODE_LENS = [1, 8, 12]
MASK_MODES = ["none", "random", "zero"]
DTYPES = list(DTYPE_CODES)
WEIGHT_DIMS = [0, 1, 4, 33]
BATCH = 2
EPSILON = 1e-2

RESULTS = []  # (op, case id, dtype, max abs error, allowed error)

@pytest.fixture(scope="module")
def lib():
    return load_library()


@pytest.fixture(scope="module", autouse=True)
def _print_summary():
    yield
    if not RESULTS:
        return
    print("\n[gpu] summary: op | dtype | cases | worst error | worst error / allowed"
          " (error: max abs error; for hash codes the fraction of codes that differ)")
    for op, dtype in sorted({(r[0], r[2]) for r in RESULTS}):
        rows = [r for r in RESULTS if r[0] == op and r[2] == dtype]
        worst = max(r[3] for r in rows)
        ratio = max(r[3] / r[4] if r[4] > 0 else 0.0 for r in rows)
        print(f"[gpu] {op} | {dtype} | {len(rows)} | {worst:.3e} | {ratio:.3f}")


def _stream():
    return cp.cuda.get_current_stream().ptr


def _ptr(array):
    return array.data.ptr


def _sync():
    cp.cuda.get_current_stream().synchronize()


# ---------------------------------------------------------------------------
# Element types. bfloat16 travels as uint16 bit patterns (CuPy has no bfloat16).

def _to_bfloat16_bits(values):
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def _from_bfloat16_bits(bits):
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


def _to_device(values, dtype):
    """(device array in dtype, the rounded values as float64)."""
    if dtype == "bfloat16":
        bits = _to_bfloat16_bits(values)
        return cp.asarray(bits), _from_bfloat16_bits(bits).astype(np.float64)
    rounded = np.asarray(values).astype(dtype)
    return cp.asarray(rounded), rounded.astype(np.float64)


def _empty_output(shape, dtype):
    """Device output pre-filled with NaN, so an element the kernel skips shows up."""
    if dtype == "bfloat16":
        return cp.full(shape, 0x7FC0, dtype=cp.uint16)
    return cp.full(shape, np.nan, dtype=dtype)


def _to_host(array, dtype):
    host = cp.asnumpy(array)
    if dtype == "bfloat16":
        host = _from_bfloat16_bits(host)
    return host.astype(np.float64)


def _record(op, case, dtype, got, want):
    allowed = TOLERANCE[dtype] * max(1.0, float(np.max(np.abs(want), initial=0.0)))
    error = float(np.max(np.abs(got - want), initial=0.0)) if got.size else 0.0
    RESULTS.append((op, case, dtype, error, allowed))
    print(f"[gpu] {op} {case} {dtype}: max_abs_err={error:.3e} allowed={allowed:.3e}")
    assert got.shape == want.shape
    assert error <= allowed, f"{op} {case} {dtype}: max abs error {error} > {allowed}"


# ---------------------------------------------------------------------------
# Inputs.

def _codes(rng, batch, num_hashes, length, num_buckets):
    """Codes drawn from a few buckets (the top one included), so keys and queries collide."""
    pool = np.unique(np.append(rng.integers(0, num_buckets, size=4), num_buckets - 1))
    return pool[rng.integers(0, len(pool), size=(batch, num_hashes, length))].astype(np.int32)


def _mask(rng, mode, batch, length):
    """(mask for the kernel, mask for the reference). Kept entries are any nonzero value."""
    if mode == "none":
        return np.ones((batch, length), np.float32), None
    if mode == "zero":
        mask = np.zeros((batch, length), np.float32)
    else:
        mask = rng.choice(np.array([0.0, 1.0, 2.5], np.float32), size=(batch, length))
    return mask, mask


def _poison_masked_rows(values, mask):
    """NaN in every row a mask drops: a kernel that reads them fails the comparison."""
    values = np.array(values, np.float64)
    values[mask == 0] = np.nan
    return values


def _unit_rows(rng, batch, length, dim):
    x = rng.standard_normal((batch, length, dim))
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def _seed(*parts):
    return zlib.crc32("-".join(str(p) for p in parts).encode())


def _workspace(nbytes):
    return cp.empty(max(int(nbytes), 1), dtype=cp.uint8)


def _cumulation_cases():
    """(Nq, Nk) x mask x dtype, with D, m, tau rotating so every value of each is used."""
    cases = []
    for k, ((nq, nk), mode, dtype) in enumerate(
            itertools.product(LENGTH_PAIRS, MASK_MODES, DTYPES)):
        cases.append((nq, nk, VALUE_DIMS[k % 4], NUM_HASHES[(k // 4) % 4],
                      CODE_LENS[(k // 16) % 3], mode, dtype))
    for dim, num_hashes, tau in itertools.product(VALUE_DIMS, NUM_HASHES, CODE_LENS):
        cases.append((7, 1000, dim, num_hashes, tau, "random", "float32"))
    return cases


CUMULATION_CASES = _cumulation_cases()


def _case_id(case):
    nq, nk, dim, num_hashes, tau, mode, dtype = case
    return f"Nq{nq}-Nk{nk}-D{dim}-m{num_hashes}-tau{tau}-{mode}-{dtype}"


# ---------------------------------------------------------------------------
# Launcher calls.

def _run_lsh(lib, dims, dtype, qm, qc, km, kc, value, workspace_bytes=None):
    batch, num_hashes, nq, nk, value_dim, num_buckets = dims
    d8 = (batch, num_hashes, nq, nk, 0, value_dim, 0, num_buckets)
    required = lib.yoso_lsh_cumulation_workspace_bytes(*d8)
    nbytes = required if workspace_bytes is None else workspace_bytes
    workspace = _workspace(nbytes)
    out = _empty_output((batch, nq, value_dim), dtype)
    status = lib.yoso_lsh_cumulation(*d8, DTYPE_CODES[dtype], _ptr(qm), _ptr(qc), _ptr(km),
                                     _ptr(kc), _ptr(value), _ptr(out), _ptr(workspace), nbytes,
                                     _stream())
    _sync()
    return status, out


def _run_weighted(lib, dims, dtype, qm, qc, qw, km, kc, kw, value):
    batch, num_hashes, nq, nk, weight_dim, value_dim, num_buckets = dims
    d8 = (batch, num_hashes, nq, nk, weight_dim, value_dim, 0, num_buckets)
    nbytes = lib.yoso_weighted_lsh_cumulation_workspace_bytes(*d8)
    workspace = _workspace(nbytes)
    out = _empty_output((batch, nq, value_dim), dtype)
    status = lib.yoso_weighted_lsh_cumulation(
        *d8, DTYPE_CODES[dtype], _ptr(qm), _ptr(qc), _ptr(qw), _ptr(km), _ptr(kc), _ptr(kw),
        _ptr(value), _ptr(out), _ptr(workspace), nbytes, _stream())
    _sync()
    return status, out


def _run_collision(lib, dims, dtype, tau, qm, qc, q, qw, km, kc, k, kw):
    batch, num_hashes, nq, nk, weight_dim, vector_dim, num_buckets = dims
    d8 = (batch, num_hashes, nq, nk, weight_dim, 0, vector_dim, num_buckets)  # CumulationDims: W in weight_dim
    nbytes = lib.yoso_collision_cumulation_workspace_bytes(*d8)
    workspace = _workspace(nbytes)
    out = _empty_output((batch, nq, vector_dim), dtype)
    status = lib.yoso_collision_cumulation(
        *d8, DTYPE_CODES[dtype], tau, EPSILON, _ptr(qm), _ptr(qc), _ptr(q), _ptr(qw), _ptr(km),
        _ptr(kc), _ptr(k), _ptr(kw), _ptr(out), _ptr(workspace), nbytes, _stream())
    _sync()
    return status, out


# ---------------------------------------------------------------------------
# Cumulations.

@pytest.mark.parametrize("case", CUMULATION_CASES, ids=_case_id)
def test_lsh_cumulation_matches_reference(lib, case):
    nq, nk, value_dim, num_hashes, tau, mode, dtype = case
    rng = np.random.default_rng(_seed("lsh", _case_id(case)))
    num_buckets = 2**tau
    qc = _codes(rng, BATCH, num_hashes, nq, num_buckets)
    kc = _codes(rng, BATCH, num_hashes, nk, num_buckets)
    qm, qm_ref = _mask(rng, mode, BATCH, nq)
    km, km_ref = _mask(rng, mode, BATCH, nk)
    value, value_ref = _to_device(
        _poison_masked_rows(rng.standard_normal((BATCH, nk, value_dim)), km), dtype)
    status, out = _run_lsh(lib, (BATCH, num_hashes, nq, nk, value_dim, num_buckets), dtype,
                           cp.asarray(qm), cp.asarray(qc), cp.asarray(km), cp.asarray(kc), value)
    assert status == 0
    want = lsh_cumulation(qc, kc, value_ref, qm_ref, km_ref)
    _record("lsh_cumulation", _case_id(case), dtype, _to_host(out, dtype), want)


@pytest.mark.parametrize("case", CUMULATION_CASES, ids=_case_id)
def test_weighted_lsh_cumulation_matches_reference(lib, case):
    nq, nk, value_dim, num_hashes, tau, mode, dtype = case
    rng = np.random.default_rng(_seed("weighted", _case_id(case)))
    weight_dim = WEIGHT_DIMS[(value_dim + num_hashes + tau) % len(WEIGHT_DIMS)]
    num_buckets = 2**tau
    qc = _codes(rng, BATCH, num_hashes, nq, num_buckets)
    kc = _codes(rng, BATCH, num_hashes, nk, num_buckets)
    qm, qm_ref = _mask(rng, mode, BATCH, nq)
    km, km_ref = _mask(rng, mode, BATCH, nk)
    qw, qw_ref = _to_device(
        _poison_masked_rows(rng.standard_normal((BATCH, nq, weight_dim)), qm), dtype)
    kw, kw_ref = _to_device(
        _poison_masked_rows(rng.standard_normal((BATCH, nk, weight_dim)), km), dtype)
    value, value_ref = _to_device(
        _poison_masked_rows(rng.standard_normal((BATCH, nk, value_dim)), km), dtype)
    status, out = _run_weighted(
        lib, (BATCH, num_hashes, nq, nk, weight_dim, value_dim, num_buckets), dtype,
        cp.asarray(qm), cp.asarray(qc), qw, cp.asarray(km), cp.asarray(kc), kw, value)
    assert status == 0
    want = weighted_lsh_cumulation(qc, qw_ref, kc, kw_ref, value_ref, qm_ref, km_ref)
    _record("weighted_lsh_cumulation", f"{_case_id(case)}-W{weight_dim}", dtype,
            _to_host(out, dtype), want)


@pytest.mark.parametrize("case", CUMULATION_CASES, ids=_case_id)
def test_collision_cumulation_matches_reference(lib, case):
    nq, nk, weight_dim, num_hashes, tau, mode, dtype = case
    rng = np.random.default_rng(_seed("collision", _case_id(case)))
    vector_dim = VALUE_DIMS[(weight_dim + tau) % len(VALUE_DIMS)]
    num_buckets = 2**tau
    qc = _codes(rng, BATCH, num_hashes, nq, num_buckets)
    kc = _codes(rng, BATCH, num_hashes, nk, num_buckets)
    qm, qm_ref = _mask(rng, mode, BATCH, nq)
    km, km_ref = _mask(rng, mode, BATCH, nk)
    q, q_ref = _to_device(_poison_masked_rows(_unit_rows(rng, BATCH, nq, vector_dim), qm), dtype)
    k, k_ref = _to_device(_poison_masked_rows(_unit_rows(rng, BATCH, nk, vector_dim), km), dtype)
    # Weights scaled so <query_weight, key_weight> ~ N(0, 1) and float16 sums stay finite.
    scale = weight_dim ** -0.25
    qw, qw_ref = _to_device(
        _poison_masked_rows(scale * rng.standard_normal((BATCH, nq, weight_dim)), qm), dtype)
    kw, kw_ref = _to_device(
        _poison_masked_rows(scale * rng.standard_normal((BATCH, nk, weight_dim)), km), dtype)
    status, out = _run_collision(
        lib, (BATCH, num_hashes, nq, nk, weight_dim, vector_dim, num_buckets), dtype, tau,
        cp.asarray(qm), cp.asarray(qc), q, qw, cp.asarray(km), cp.asarray(kc), k, kw)
    assert status == 0
    want = collision_cumulation(qc, q_ref, qw_ref, kc, k_ref, kw_ref, tau, EPSILON, qm_ref,
                                km_ref)
    _record("collision_cumulation", f"{_case_id(case)}-d{vector_dim}", dtype,
            _to_host(out, dtype), want)


def test_invalid_codes_are_counted_and_skipped(lib):
    rng = np.random.default_rng(7)
    batch, num_hashes, nq, nk, value_dim, tau = 2, 5, 300, 400, 16, 4
    num_buckets = 2**tau
    qc = _codes(rng, batch, num_hashes, nq, num_buckets)
    kc = _codes(rng, batch, num_hashes, nk, num_buckets)
    # Query codes too large and key codes negative: an invalid pair can never look equal.
    bad_q = rng.random(qc.shape) < 0.2
    bad_k = rng.random(kc.shape) < 0.2
    qc[bad_q] = rng.choice(np.array([num_buckets, num_buckets + 7, 2**31 - 1]), bad_q.sum())
    kc[bad_k] = rng.choice(np.array([-1, -num_buckets, -2**31]), bad_k.sum())

    count = cp.zeros(1, dtype=cp.uint64)
    count[0] = 12345  # the launcher must reset it
    for codes, bad in ((qc, bad_q), (kc, bad_k)):
        codes_dev = cp.asarray(codes)
        assert lib.yoso_count_invalid_codes(_ptr(codes_dev), codes.size, num_buckets,
                                            _ptr(count), _stream()) == 0
        _sync()
        assert int(count.get()[0]) == int(bad.sum())

    # The reference sees the invalid codes as buckets no other code shares.
    qc_ref = np.where(bad_q, -1, qc)
    kc_ref = np.where(bad_k, -2, kc)
    qm = np.ones((batch, nq), np.float32)
    km = np.ones((batch, nk), np.float32)
    dtype = "float32"
    value, value_ref = _to_device(rng.standard_normal((batch, nk, value_dim)), dtype)
    qw, qw_ref = _to_device(rng.standard_normal((batch, nq, 3)), dtype)
    kw, kw_ref = _to_device(rng.standard_normal((batch, nk, 3)), dtype)
    q, q_ref = _to_device(_unit_rows(rng, batch, nq, value_dim), dtype)
    k, k_ref = _to_device(_unit_rows(rng, batch, nk, value_dim), dtype)
    args = [cp.asarray(a) for a in (qm, qc, km, kc)]

    status, out = _run_lsh(lib, (batch, num_hashes, nq, nk, value_dim, num_buckets), dtype,
                           *args, value)
    assert status == 0
    _record("lsh_cumulation", "invalid-codes", dtype, _to_host(out, dtype),
            lsh_cumulation(qc_ref, kc_ref, value_ref))

    status, out = _run_weighted(lib, (batch, num_hashes, nq, nk, 3, value_dim, num_buckets),
                                dtype, args[0], args[1], qw, args[2], args[3], kw, value)
    assert status == 0
    _record("weighted_lsh_cumulation", "invalid-codes", dtype, _to_host(out, dtype),
            weighted_lsh_cumulation(qc_ref, qw_ref, kc_ref, kw_ref, value_ref))

    status, out = _run_collision(lib, (batch, num_hashes, nq, nk, 3, value_dim, num_buckets),
                                 dtype, tau, args[0], args[1], q, qw, args[2], args[3], k, kw)
    assert status == 0
    _record("collision_cumulation", "invalid-codes", dtype, _to_host(out, dtype),
            collision_cumulation(qc_ref, q_ref, qw_ref, kc_ref, k_ref, kw_ref, tau, EPSILON))


@pytest.mark.parametrize("batch,nq,nk,value_dim", [(0, 5, 5, 4), (2, 0, 0, 4), (2, 5, 5, 0)])
def test_empty_cumulations_succeed(lib, batch, nq, nk, value_dim):
    rng = np.random.default_rng(3)
    num_hashes, num_buckets, dtype = 3, 16, "float32"
    qc = cp.asarray(_codes(rng, batch, num_hashes, nq, num_buckets))
    kc = cp.asarray(_codes(rng, batch, num_hashes, nk, num_buckets))
    qm = cp.ones((batch, nq), cp.float32)
    km = cp.ones((batch, nk), cp.float32)
    value = cp.ones((batch, nk, value_dim), cp.float32)
    weights = cp.ones((batch, nk, 2), cp.float32)
    q_weights = cp.ones((batch, nq, 2), cp.float32)
    q = cp.ones((batch, nq, value_dim), cp.float32)
    k = cp.ones((batch, nk, value_dim), cp.float32)
    status, out = _run_lsh(lib, (batch, num_hashes, nq, nk, value_dim, num_buckets), dtype,
                           qm, qc, km, kc, value)
    assert status == 0 and out.shape == (batch, nq, value_dim)
    status, out = _run_weighted(lib, (batch, num_hashes, nq, nk, 2, value_dim, num_buckets),
                                dtype, qm, qc, q_weights, km, kc, weights, value)
    assert status == 0 and out.shape == (batch, nq, value_dim)
    status, out = _run_collision(lib, (batch, num_hashes, nq, nk, 2, value_dim, num_buckets),
                                 dtype, 4, qm, qc, q, q_weights, km, kc, k, weights)
    assert status == 0 and out.shape == (batch, nq, value_dim)


def test_too_small_workspace_is_rejected(lib):
    rng = np.random.default_rng(5)
    batch, num_hashes, nq, nk, value_dim, num_buckets = 2, 3, 10, 12, 4, 16
    d8 = (batch, num_hashes, nq, nk, 0, value_dim, 0, num_buckets)
    required = lib.yoso_lsh_cumulation_workspace_bytes(*d8)
    assert required > 0
    args = [cp.asarray(a) for a in (
        np.ones((batch, nq), np.float32), _codes(rng, batch, num_hashes, nq, num_buckets),
        np.ones((batch, nk), np.float32), _codes(rng, batch, num_hashes, nk, num_buckets))]
    value = cp.ones((batch, nk, value_dim), cp.float32)
    status, _ = _run_lsh(lib, (batch, num_hashes, nq, nk, value_dim, num_buckets), "float32",
                         *args, value, workspace_bytes=required - 1)
    assert status == CUDA_ERROR_INVALID_VALUE


# ---------------------------------------------------------------------------
# Hash codes. Small-integer inputs make every projection exact in float32 (and
# in float16 / bfloat16 inputs), so the codes must match the reference bit for
# bit, zeros included (a bit is set only for a projection strictly > 0).

HASH_CASES = [
    (n, dim, num_hashes, tau, DTYPES[k % 3])
    for k, (n, dim, num_hashes, tau) in enumerate(
        itertools.product([0, 1, 7, 1000], VALUE_DIMS, NUM_HASHES, CODE_LENS))
]


def _hash_id(case):
    n, dim, num_hashes, tau, dtype = case
    return f"N{n}-d{dim}-m{num_hashes}-tau{tau}-{dtype}"


def _run_gaussian(lib, x, dtype, projection, num_hashes, tau):
    batch, n, dim = x.shape
    codes = cp.full((batch, num_hashes, n), -12345, dtype=cp.int32)
    status = lib.yoso_gaussian_hash_codes(batch, n, dim, num_hashes, tau, DTYPE_CODES[dtype],
                                          _ptr(x), _ptr(projection), _ptr(codes), _stream())
    _sync()
    return status, cp.asnumpy(codes)


def _run_hadamard(lib, x, dtype, signs, num_hashes, tau):
    batch, n, dim = x.shape
    num_blocks, _, padded_dim = signs.shape
    codes = cp.full((batch, num_hashes, n), -12345, dtype=cp.int32)
    status = lib.yoso_hadamard_hash_codes(batch, n, dim, num_hashes, tau, padded_dim, num_blocks,
                                          DTYPE_CODES[dtype], _ptr(x), _ptr(signs), _ptr(codes),
                                          _stream())
    _sync()
    return status, cp.asnumpy(codes)


def _hadamard_signs(rng, dim, num_hashes, tau):
    padded_dim = 1 << max(0, int(np.ceil(np.log2(max(dim, 1)))))
    num_blocks = -(-num_hashes * tau // padded_dim)
    return rng.choice(np.array([-1.0, 1.0], np.float32), size=(num_blocks, 3, padded_dim))


def _record_codes(op, case, dtype, got, want, max_mismatch_fraction=0.0):
    mismatch = float(np.mean(got != want)) if want.size else 0.0
    RESULTS.append((op, case, dtype, mismatch, max(max_mismatch_fraction, 1e-12)))
    print(f"[gpu] {op} {case}: mismatched codes fraction={mismatch:.3e}")
    assert got.shape == want.shape
    assert mismatch <= max_mismatch_fraction, f"{op} {case}: {mismatch} of codes differ"


@pytest.mark.parametrize("case", HASH_CASES, ids=_hash_id)
def test_gaussian_hash_codes_match_reference(lib, case):
    n, dim, num_hashes, tau, dtype = case
    rng = np.random.default_rng(_seed("gaussian", _hash_id(case)))
    x, x_ref = _to_device(rng.integers(-3, 4, size=(BATCH, n, dim)).astype(np.float32), dtype)
    projection = rng.integers(-2, 3, size=(dim, num_hashes * tau)).astype(np.float32)
    status, codes = _run_gaussian(lib, x, dtype, cp.asarray(projection), num_hashes, tau)
    assert status == 0
    _record_codes("gaussian_hash_codes", _hash_id(case), dtype, codes,
                  gaussian_hash_codes(x_ref, projection, num_hashes, tau))


@pytest.mark.parametrize("case", HASH_CASES, ids=_hash_id)
def test_hadamard_hash_codes_match_reference(lib, case):
    n, dim, num_hashes, tau, dtype = case
    rng = np.random.default_rng(_seed("hadamard", _hash_id(case)))
    x, x_ref = _to_device(rng.integers(-3, 4, size=(BATCH, n, dim)).astype(np.float32), dtype)
    signs = _hadamard_signs(rng, dim, num_hashes, tau)
    status, codes = _run_hadamard(lib, x, dtype, cp.asarray(signs), num_hashes, tau)
    assert status == 0
    _record_codes("hadamard_hash_codes", _hash_id(case), dtype, codes,
                  hadamard_hash_codes(x_ref, signs, num_hashes, tau))


@pytest.mark.parametrize("dim", [3, 64, 100, 3000])
def test_hash_codes_of_real_inputs_match_reference_up_to_rounding_ties(lib, dim):
    """Gaussian inputs: float32 vs float64 sums may flip a bit whose projection is ~0."""
    rng = np.random.default_rng(dim)
    num_hashes, tau, dtype = 33, 12, "float32"
    x, x_ref = _to_device(rng.standard_normal((BATCH, 50, dim)), dtype)
    projection = rng.standard_normal((dim, num_hashes * tau)).astype(np.float32)
    status, codes = _run_gaussian(lib, x, dtype, cp.asarray(projection), num_hashes, tau)
    assert status == 0
    _record_codes("gaussian_hash_codes", f"real-d{dim}", dtype, codes,
                  gaussian_hash_codes(x_ref, projection, num_hashes, tau), 0.01)
    signs = _hadamard_signs(rng, dim, num_hashes, tau)
    status, codes = _run_hadamard(lib, x, dtype, cp.asarray(signs), num_hashes, tau)
    assert status == 0
    _record_codes("hadamard_hash_codes", f"real-d{dim}", dtype, codes,
                  hadamard_hash_codes(x_ref, signs, num_hashes, tau), 0.01)


def test_hadamard_hash_codes_with_opt_in_shared_memory(lib):
    """padded_dim 16384 (128 KiB of shared memory in double, above the 48 KiB default; fits the H100/H200 opt-in limit).

    With all signs +1 and x = e_k, y = H H H e_k = padded_dim * H e_k, so bit t
    is set exactly when popcount(t & k) is even; no dense Hadamard matrix needed.
    """
    padded_dim, num_hashes, tau, k = 16384, 2, 12, 5
    x = np.zeros((1, 1, padded_dim), np.float32)
    x[0, 0, k] = 1.0
    signs = np.ones((1, 3, padded_dim), np.float32)
    status, codes = _run_hadamard(lib, cp.asarray(x), "float32", cp.asarray(signs), num_hashes,
                                  tau)
    assert status == 0
    t = np.arange(num_hashes * tau)
    bits = np.array([bin(v & k).count("1") % 2 == 0 for v in t]).reshape(num_hashes, tau)
    want = (bits * (1 << np.arange(tau))).sum(-1).astype(np.int32).reshape(1, num_hashes, 1)
    _record_codes("hadamard_hash_codes", "padded16384", "float32", codes, want)


def test_hadamard_padded_dim_beyond_shared_memory_is_an_error(lib):
    padded_dim = 1 << 16  # 256 KiB of shared memory: more than any supported GPU offers
    x = cp.zeros((1, 1, 4), cp.float32)
    signs = cp.ones((1, 3, padded_dim), cp.float32)
    status, _ = _run_hadamard(lib, x, "float32", signs, 1, 4)
    assert status != 0
