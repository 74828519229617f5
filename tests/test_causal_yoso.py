"""Causal YOSO: the causal cumulations and their eq. 4 backward equal the NumPy references, causal
outputs never depend on later positions, and YosoAttention decodes token by token with a
constant-size state that reproduces the full causal forward. Every backend and implementation."""

import keras
import numpy as np
import pytest

import numpy_reference as ref
from conftest import DATA_ERROR, random_mask, to_numpy, unit_rows, vjp
from keras_yoso import ops
from keras_yoso.layers import YosoAttention

# (N, D, m, tau, mask kind, skewed codes)
CAUSAL_GRID = [
    (1, 3, 2, 4, "none", False),
    (37, 5, 3, 3, "random", False),
    (150, 8, 4, 2, "random", True),
    (300, 16, 5, 8, "none", False),
    (65, 4, 2, 1, "zeros", False),
]


def _codes(rng, n, m, tau, skewed):
    codes = rng.integers(0, 2 ** tau, size=(2, m, n)).astype(np.int32)
    if skewed:  # most positions in one bucket: long runs of one code across sorted chunks
        codes = np.where(rng.random(codes.shape) < 0.9, 1, codes).astype(np.int32)
    return codes


def _close(actual, expected, tol=1e-5):
    scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
    np.testing.assert_allclose(to_numpy(actual), expected, atol=tol * scale, rtol=tol)


@pytest.mark.parametrize("n,d,m,tau,mask_kind,skewed", CAUSAL_GRID)
def test_causal_lsh_cumulation_sums_keys_up_to_each_query(implementation, n, d, m, tau, mask_kind, skewed):
    rng = np.random.default_rng(n + d)
    qc, kc = _codes(rng, n, m, tau, skewed), _codes(rng, n, m, tau, skewed)
    value = rng.normal(size=(2, n, d)).astype(np.float32)
    qm, km = random_mask(rng, mask_kind, 2, n), random_mask(rng, mask_kind, 2, n)
    out = ops.lsh_cumulation(qc, kc, value, 2 ** tau, qm, km, implementation=implementation, causal=True)
    _close(out, ref.lsh_cumulation(qc, kc, value, qm, km, causal=1))


@pytest.mark.parametrize("n,d,m,tau,mask_kind,skewed", CAUSAL_GRID)
def test_causal_yoso_cumulation_gradients_are_the_lower_bound_over_pairs_j_le_i(implementation, n, d, m, tau,
                                                                               mask_kind, skewed):
    rng = np.random.default_rng(3 * n + d)
    q, k = unit_rows(rng, (2, n, 6)), unit_rows(rng, (2, n, 6))
    v = rng.normal(size=(2, n, d)).astype(np.float32)
    qc, kc = _codes(rng, n, m, tau, skewed), _codes(rng, n, m, tau, skewed)
    qm, km = random_mask(rng, mask_kind, 2, n), random_mask(rng, mask_kind, 2, n)
    dy = rng.normal(size=(2, n, d)).astype(np.float32)

    def fn(q, k, v):
        return ops.yoso_cumulation(q, k, v, qc, kc, tau, qm, km, implementation=implementation, causal=True)

    out, (dq, dk, dv) = vjp(fn, [q, k, v], dy)
    _close(out, ref.lsh_cumulation(qc, kc, v, qm, km, causal=1))
    want_dq, want_dk, want_dv = ref.yoso_lower_bound_gradients(q, k, v, qc, kc, tau, dy, qm, km, causal=True)
    _close(dq, want_dq, 2e-5)
    _close(dk, want_dk, 2e-5)
    _close(dv, want_dv, 2e-5)


def test_causal_cumulation_equals_bidirectional_on_the_last_query(implementation):
    rng = np.random.default_rng(5)
    qc, kc = _codes(rng, 40, 4, 3, False), _codes(rng, 40, 4, 3, False)
    value = rng.normal(size=(2, 40, 3)).astype(np.float32)
    causal = to_numpy(ops.lsh_cumulation(qc, kc, value, 8, implementation=implementation, causal=True))
    full = to_numpy(ops.lsh_cumulation(qc[:, :, -1:], kc, value, 8, implementation=implementation))
    np.testing.assert_allclose(causal[:, -1:], full, atol=1e-5)


def test_causal_cumulation_rejects_queries_and_keys_of_different_lengths(implementation):
    rng = np.random.default_rng(0)
    with pytest.raises((ValueError, DATA_ERROR), match="causal=True aligns"):
        ops.lsh_cumulation(_codes(rng, 5, 2, 3, False), _codes(rng, 6, 2, 3, False),
                           np.ones((2, 6, 3), np.float32), 8, implementation=implementation, causal=True)


def test_causal_collision_backward_raises_a_clear_error():
    q = np.ones((1, 4, 2), np.float32)
    codes = np.zeros((1, 2, 4), np.int32)
    with pytest.raises(ValueError, match="backward='collision' is not implemented for causal=True"):
        ops.yoso_cumulation(q, q, q, codes, codes, 3, backward="collision", causal=True)


def test_causal_flag_must_be_a_bool():
    codes = np.zeros((1, 2, 4), np.int32)
    with pytest.raises(ValueError, match="causal must be a bool"):
        ops.lsh_cumulation(codes, codes, np.ones((1, 4, 2), np.float32), 8, causal="yes")


# ---------------------------------------------------------------------- the layer


def _layer(conv_window=None, implementation="auto", **kwargs):
    return YosoAttention(2, 8, num_hashes=4, hash_code_len=3, conv_window=conv_window, seed=3,
                         implementation=implementation, **kwargs)


def _inputs(length=13, batch=2, seed=0):
    return np.random.default_rng(seed).normal(size=(batch, length, 16)).astype(np.float32)


@pytest.mark.parametrize("conv_window", [None, 3])
def test_causal_layer_outputs_do_not_change_when_later_inputs_change(implementation, conv_window):
    layer = _layer(conv_window, implementation)
    x = _inputs()
    changed = x.copy()
    changed[:, 7:] += np.random.default_rng(1).normal(size=changed[:, 7:].shape).astype(np.float32)
    before = to_numpy(layer(x, x, use_causal_mask=True))
    after = to_numpy(layer(changed, changed, use_causal_mask=True))
    np.testing.assert_allclose(after[:, :7], before[:, :7], atol=1e-6)
    assert np.abs(after[:, 7:] - before[:, 7:]).max() > 1e-3


def test_causal_layer_gradient_of_an_output_ignores_later_inputs(implementation):
    layer = _layer(3, implementation)
    x = _inputs()
    layer(x, x, use_causal_mask=True)
    cotangent = np.zeros((2, 13, 16), np.float32)
    cotangent[:, 5] = 1.0  # d(output at position 5) / d(inputs)
    _, (dx,) = vjp(lambda t: layer(t, t, use_causal_mask=True), [x], cotangent)
    assert np.abs(dx[:, 6:]).max() == 0.0
    assert np.abs(dx[:, :6]).max() > 0.0


def test_causal_layer_rejects_query_and_value_of_different_lengths():
    layer = _layer()
    with pytest.raises(ValueError, match="same length"):
        layer(_inputs(5), _inputs(7), use_causal_mask=True)


@pytest.mark.parametrize("conv_window", [None, 1, 3])
def test_decoding_token_by_token_equals_the_full_causal_forward(implementation, conv_window):
    layer = _layer(conv_window, implementation)
    x = _inputs()
    full = to_numpy(layer(x, x, use_causal_mask=True))
    cache = layer.init_cache(2)
    shapes = keras.tree.map_structure(lambda c: tuple(c.shape), cache)
    outputs = []
    for t in range(x.shape[1]):
        out, cache = layer(x[:, t:t + 1], x[:, t:t + 1], cache=cache, cache_update_index=t)
        assert keras.tree.map_structure(lambda c: tuple(c.shape), cache) == shapes
        outputs.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), full, atol=1e-4)


def test_decoding_a_prefill_chunk_then_chunks_equals_the_full_causal_forward(implementation):
    layer = _layer(4, implementation)
    x = _inputs(17)
    full = to_numpy(layer(x, x, use_causal_mask=True))
    cache = layer.init_cache(2)
    outputs, start = [], 0
    for size in (6, 1, 4, 1, 5):
        out, cache = layer(x[:, start:start + size], x[:, start:start + size], cache=cache,
                           cache_update_index=start)
        outputs.append(to_numpy(out))
        start += size
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), full, atol=1e-4)


def test_decoding_state_is_the_bucket_tables_whatever_the_context_length():
    layer = _layer()
    cache = layer.init_cache(3)
    # [batch * heads, m, 2**tau, value_dim], row b * heads + h: the layout of ops.lsh_cumulation_step.
    assert set(cache) == {"tables"} and tuple(cache["tables"].shape) == (3 * 2, 4, 2 ** 3, 8)
    assert to_numpy(cache["tables"]).sum() == 0.0
    x = _inputs(40, batch=3)
    _, cache = layer(x, x, cache=cache, cache_update_index=0)
    assert tuple(cache["tables"].shape) == (3 * 2, 4, 2 ** 3, 8)
    # Each hash's tables hold the sum of all values seen: the same total for every hash.
    totals = to_numpy(cache["tables"]).sum(axis=2)
    np.testing.assert_allclose(totals, np.broadcast_to(totals[:, :1], totals.shape), atol=1e-4)


def test_decoding_skips_padded_keys_like_the_full_forward(implementation):
    layer = _layer(None, implementation)
    x = _inputs(9)
    mask = np.ones((2, 9), bool)
    mask[0, 2] = mask[1, 5] = False
    full = to_numpy(layer(x, x, use_causal_mask=True, query_mask=mask, value_mask=mask))
    cache = layer.init_cache(2)
    outputs = []
    for t in range(9):
        out, cache = layer(x[:, t:t + 1], x[:, t:t + 1], cache=cache, cache_update_index=t,
                           query_mask=mask[:, t:t + 1], value_mask=mask[:, t:t + 1])
        outputs.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), full, atol=1e-4)


def test_decoding_argument_errors_name_the_argument():
    layer = _layer()
    x = _inputs(2)
    cache = layer.init_cache(2)
    with pytest.raises(ValueError, match="cache_update_index"):
        layer(x, x, cache=cache)
    with pytest.raises(ValueError, match="use_causal_mask must be True"):
        layer(x, x, cache=cache, cache_update_index=0, use_causal_mask=False)
    with pytest.raises(ValueError, match=r"cache\[\"tables\"\]` of shape"):
        layer(x, x, cache=_layer().init_cache(3), cache_update_index=0)
    with pytest.raises(ValueError, match=r"a dict with the entries \['tables'\]"):
        layer(x, x, cache=cache["tables"], cache_update_index=0)
    with pytest.raises(ValueError, match="without `cache`"):
        layer(x, x, cache_update_index=0)
    with pytest.raises(ValueError, match="batch_size"):
        layer.init_cache(0)


def test_init_cache_refuses_bucket_tables_over_the_documented_limit_naming_their_size(monkeypatch):
    from keras_yoso import _validation

    with pytest.raises(ValueError, match=r"YosoAttention\.init_cache: its bucket tables, 4 bytes \* batch_size 1 \* "
                                         r"num_heads 4 \* num_hashes 32 \* 2\*\*hash_code_len 1048576 \* value_dim 16, "
                                         r"would allocate 8,589,934,592 bytes \(8\.0 GiB\), above the limit of 2\*\*32 "
                                         r"bytes \(4 GiB, keras_yoso\._validation\.MAX_DECODING_STATE_BYTES\): lower "
                                         r"hash_code_len"):
        YosoAttention(4, 16, num_hashes=32, hash_code_len=20).init_cache(1)
    layer = _layer()  # tables of 4 bytes * 3 * 2 heads * 4 hashes * 2**3 * 8 = 6,144 bytes for a batch of 3
    monkeypatch.setattr(_validation, "MAX_DECODING_STATE_BYTES", 6144)
    assert tuple(layer.init_cache(3)["tables"].shape) == (6, 4, 8, 8)  # at the limit
    with pytest.raises(ValueError, match="would allocate 8,192 bytes"):
        layer.init_cache(4)
