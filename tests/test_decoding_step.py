"""keras_yoso.ops.lsh_cumulation_step: causal YOSO of new positions over the bucket tables of the
earlier ones, on the native kernels (every backend) and the composite, against the NumPy
reference of the full causal cumulation."""

import keras
import numpy as np
import pytest

import numpy_reference as ref
from conftest import BACKEND, DATA_ERROR, cast, rounded, to_numpy
from keras_yoso import ops

B, M, TAU, D = 3, 4, 3, 5


def _sequence(seed, n, masked=True):
    rng = np.random.default_rng(seed)
    nb = 2 ** TAU
    qc, kc = (rng.integers(0, nb, (B, M, n)).astype(np.int32) for _ in range(2))
    v = rng.standard_normal((B, n, D)).astype(np.float32)
    qm = rng.random((B, n)) > (0.2 if masked else -1)
    km = rng.random((B, n)) > (0.2 if masked else -1)
    return qc, kc, v, qm, km


def _decode(qc, kc, v, qm, km, chunks, implementation, dtype="float32"):
    """Outputs of the positions in `chunks` (lengths, in order) decoded chunk by chunk, and the tables."""
    tables, outputs, start = ops.yoso_decoding_state(B, M, TAU, D), [], 0
    for size in chunks:
        end = start + size
        out, tables = ops.lsh_cumulation_step(qc[:, :, start:end], kc[:, :, start:end], cast(v[:, start:end], dtype),
                                              tables, qm[:, start:end], km[:, start:end],
                                              implementation=implementation)
        assert keras.backend.standardize_dtype(out.dtype) == dtype
        outputs.append(to_numpy(out).astype(np.float32))
        start = end
    return np.concatenate(outputs, axis=1), to_numpy(tables)


@pytest.mark.parametrize("chunks", [(1,) * 9, (5, 1, 1, 2), (9,), (3, 0, 6)])
def test_decoding_chunk_by_chunk_equals_the_full_causal_cumulation(implementation, chunks):
    qc, kc, v, qm, km = _sequence(1, sum(chunks))
    out, tables = _decode(qc, kc, v, qm, km, chunks, implementation)
    np.testing.assert_allclose(out, ref.lsh_cumulation(qc, kc, v, qm, km, causal=1), atol=1e-5)
    # The tables hold, per hash, the sum of the kept values in each bucket.
    expected = np.zeros((B, M, 2 ** TAU, D))
    for b, h, j in np.ndindex(B, M, v.shape[1]):
        expected[b, h, kc[b, h, j]] += km[b, j] * v[b, j]
    np.testing.assert_allclose(tables, expected, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_values_give_outputs_of_their_dtype_with_float32_tables(implementation, dtype):
    qc, kc, v, qm, km = _sequence(2, 6)
    out, tables = _decode(qc, kc, v, qm, km, (4, 1, 1), implementation, dtype)
    tol = 2e-2 if dtype == "float16" else 1e-1
    np.testing.assert_allclose(out, ref.lsh_cumulation(qc, kc, rounded(v, dtype), qm, km, causal=1), atol=tol)
    assert tables.dtype == np.float32


def test_native_and_composite_steps_agree_bit_for_bit_on_single_tokens():
    qc, kc, v, qm, km = _sequence(3, 7, masked=False)
    native, native_tables = _decode(qc, kc, v, qm, km, (1,) * 7, "custom_op")
    composite, composite_tables = _decode(qc, kc, v, qm, km, (1,) * 7, "composite")
    np.testing.assert_allclose(native, composite, atol=1e-6)
    np.testing.assert_array_equal(native_tables, composite_tables)


def test_step_arguments_are_checked_naming_the_argument(implementation):
    qc, kc, v, qm, km = _sequence(4, 2)
    tables = ops.yoso_decoding_state(B, M, TAU, D)
    with pytest.raises(ValueError, match="tables must have rank 4"):
        ops.lsh_cumulation_step(qc, kc, v, np.zeros((B, M, 8), np.float32), implementation=implementation)
    with pytest.raises(ValueError, match="tables must have shape .*num_buckets a power of two"):
        ops.lsh_cumulation_step(qc, kc, v, np.zeros((B, M, 6, D), np.float32), implementation=implementation)
    with pytest.raises(ValueError, match="num_hashes .*codes and tables"):
        ops.lsh_cumulation_step(qc, kc, v, ops.yoso_decoding_state(B, M + 1, TAU, D), implementation=implementation)
    with pytest.raises(ValueError, match="value widths"):
        ops.lsh_cumulation_step(qc, kc, v, ops.yoso_decoding_state(B, M, TAU, D + 1), implementation=implementation)
    with pytest.raises(ValueError, match="query and key lengths"):
        ops.lsh_cumulation_step(qc, kc[:, :, :1], v[:, :1], tables, implementation=implementation)
    bad = qc.copy()
    bad[0, 0, 0] = 2 ** TAU
    with pytest.raises(DATA_ERROR, match="query_codes"):
        to_numpy(ops.lsh_cumulation_step(bad, kc, v, tables, implementation=implementation)[0])
    with pytest.raises(ValueError, match="batch_size"):
        ops.yoso_decoding_state(0, M, TAU, D)


def test_decoding_state_over_the_documented_limit_is_refused_naming_its_size(monkeypatch):
    from keras_yoso import _validation

    with pytest.raises(ValueError, match=r"yoso_decoding_state: its bucket tables, 4 bytes \* batch_size 4 \* "
                                         r"num_hashes 32 \* 2\*\*hash_code_len 1048576 \* value_dim 16, would "
                                         r"allocate 8,589,934,592 bytes \(8\.0 GiB\), above the limit of 2\*\*32 "
                                         r"bytes \(4 GiB, keras_yoso\._validation\.MAX_DECODING_STATE_BYTES\): "
                                         r"lower hash_code_len"):
        ops.yoso_decoding_state(4, 32, 20, 16)
    # At the limit it is allocated (lowered here to 4 bytes * 2 * 3 * 2**2 * 5 = 480).
    monkeypatch.setattr(_validation, "MAX_DECODING_STATE_BYTES", 480)
    assert tuple(ops.yoso_decoding_state(2, 3, 2, 5).shape) == (2, 3, 4, 5)
    with pytest.raises(ValueError, match="would allocate 640 bytes"):
        ops.yoso_decoding_state(2, 4, 2, 5)


@pytest.mark.skipif(BACKEND != "jax", reason="JAX: jit with a donated state, vmap of the FFI call")
def test_jax_step_runs_in_jit_with_the_tables_donated_and_under_vmap():
    import jax

    qc, kc, v, qm, km = _sequence(5, 4, masked=False)
    step = jax.jit(lambda t, q, k, x: ops.lsh_cumulation_step(q, k, x, t, implementation="custom_op"),
                   donate_argnums=0)
    tables, outputs = ops.yoso_decoding_state(B, M, TAU, D), []
    for t in range(4):
        out, tables = step(tables, qc[:, :, t:t + 1], kc[:, :, t:t + 1], v[:, t:t + 1])
        outputs.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), ref.lsh_cumulation(qc, kc, v, causal=1), atol=1e-5)
    batched = jax.vmap(lambda q, k, x, t: ops.lsh_cumulation_step(q, k, x, t, implementation="custom_op"))
    out, _ = batched(np.stack([qc, qc]), np.stack([kc, kc]), np.stack([v, v]),
                     np.stack([ops.yoso_decoding_state(B, M, TAU, D)] * 2))
    np.testing.assert_allclose(to_numpy(out)[1], ref.lsh_cumulation(qc, kc, v, causal=1), atol=1e-5)


@pytest.mark.skipif(BACKEND != "torch", reason="torch.library opcheck")
def test_torch_step_op_passes_opcheck():
    import torch

    qc, kc, v, qm, km = _sequence(6, 3)
    args = (torch.tensor(qm, dtype=torch.float32), torch.tensor(qc), torch.tensor(km, dtype=torch.float32),
            torch.tensor(kc), torch.tensor(v), torch.zeros((B, M, 2 ** TAU, D)))
    torch.library.opcheck(torch.ops.keras_yoso.lsh_cumulation_step.default, args)
