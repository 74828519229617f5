"""LinearRelativeAttention's own behaviour, on every backend: the Scaleformer math per head against the
dense NumPy oracle (forward and gradients), causality, relative positions (extrapolation, shift
equivariance, learning), its arguments. (The MultiHeadAttention contract shared with YosoAttention is
in test_attention_layer_contract.py; graphs, XLA and SavedModels in test_tf_layer_graphs_and_export.py.)"""

import keras
import numpy as np
import pytest

import numpy_reference as ref
from conftest import lengths_mask, requires_tensorflow, to_numpy, trainable_gradients, vjp
from keras_yoso.layers import LinearRelativeAttention


def _inputs(rng, batch, length, dim, scale=1.0):
    return (scale * rng.normal(size=(batch, length, dim))).astype(np.float32)


def _project(layer, dense, x):
    """`[B, T, dim]` through one of the layer's EinsumDense projections, in NumPy: `[B, T, heads, size]`."""
    out = np.einsum("btd,dnh->btnh", x, to_numpy(dense.kernel))
    return out + to_numpy(dense.bias) if layer.use_bias else out


def _dense_layer_reference(layer, query, value, key, query_mask, key_mask, causal):
    """The layer's output from its weights and the dense NumPy oracle of eq. 9-11, head by head."""
    q, k, v = (_project(layer, dense, x) for dense, x in
               ((layer.query_dense, query), (layer.key_dense, key), (layer.value_dense, value)))
    rel = None if layer.relative_embeddings is None else to_numpy(layer.relative_embeddings)
    heads = []
    for h in range(layer.num_heads):
        rel_h = None if rel is None else (rel if layer.share_relative_embeddings else rel[h])
        heads.append(ref.linear_relative_attention(
            q[:, :, h], k[:, :, h], v[:, :, h], rel_h, layer.horizon, causal=causal, query_mask=query_mask,
            key_mask=key_mask, epsilon=layer.epsilon))
    out = np.stack(heads, axis=2)
    dense = layer.output_dense
    return np.einsum("btnh,nho->bto", out, to_numpy(dense.kernel)) + (to_numpy(dense.bias) if layer.use_bias else 0)


# ----------------------------------------------------------------------------
# Math and the call options.

@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("options", [{}, {"share_relative_embeddings": True}, {"horizon": None},
                                     {"horizon": 1, "value_dim": 3}],
                         ids=["per_head", "shared", "no_relative", "horizon_one"])
def test_layer_matches_dense_oracle_per_head(options, causal):
    rng = np.random.default_rng(2)
    query, value, key = _inputs(rng, 2, 9, 6), _inputs(rng, 2, 13, 5), _inputs(rng, 2, 13, 4)
    query_mask, key_mask = lengths_mask([9, 4], 9), lengths_mask([13, 6], 13)
    layer = LinearRelativeAttention(3, 4, bias_initializer="random_normal", chunk_size=4, **options)
    out = layer(query, value, key=key, query_mask=query_mask, value_mask=key_mask, use_causal_mask=causal)
    expected = _dense_layer_reference(layer, query, value, key, query_mask, key_mask, causal)
    np.testing.assert_allclose(to_numpy(out), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("lengths, padding", [((9, 5), "left"), ((5, 9), "right"), ((4, 12), "left")],
                         ids=["longer_queries_left_padded", "shorter_queries_right_padded", "keys_beyond_horizon"])
def test_layer_gradients_match_dense_oracle_per_head(lengths, padding, causal):
    """d loss / d (query, value, relative embeddings) through the projections, vs the NumPy eq. 9-11 gradients."""
    rng = np.random.default_rng(21)
    (q_len, k_len), batch, heads = lengths, 2, 3
    query, value = _inputs(rng, batch, q_len, 6), _inputs(rng, batch, k_len, 5)
    q_keep, k_keep = np.array([q_len, q_len - 2]), np.array([k_len - 1, 3])
    if padding == "left":
        query_mask = np.arange(q_len)[None, :] >= (q_len - q_keep)[:, None]
        key_mask = np.arange(k_len)[None, :] >= (k_len - k_keep)[:, None]
    else:
        query_mask, key_mask = lengths_mask(q_keep, q_len), lengths_mask(k_keep, k_len)
    layer = LinearRelativeAttention(heads, 4, horizon=2, causal=causal, chunk_size=3, bias_initializer="random_normal")
    out_grad = rng.normal(size=(batch, q_len, 6)).astype(np.float32)
    layer(query, value)
    _, (d_query, d_value) = vjp(lambda q, v: layer(q, v, query_mask=query_mask, value_mask=key_mask),
                                [query, value], out_grad)
    _, weight_grads = trainable_gradients(layer, lambda: keras.ops.sum(
        layer(query, value, query_mask=query_mask, value_mask=key_mask) * keras.ops.convert_to_tensor(out_grad)))
    d_rel = weight_grads[layer.relative_embeddings.path]

    w = {name: to_numpy(dense.kernel) for name, dense in (("q", layer.query_dense), ("k", layer.key_dense),
                                                        ("v", layer.value_dense), ("o", layer.output_dense))}
    q, k, v = (_project(layer, dense, x) for dense, x in
               ((layer.query_dense, query), (layer.key_dense, value), (layer.value_dense, value)))
    head_grad = np.einsum("bto,nho->btnh", out_grad, w["o"])
    rel = to_numpy(layer.relative_embeddings)
    want_query, want_value, want_rel = np.zeros(query.shape), np.zeros(value.shape), np.zeros(rel.shape)
    for h in range(heads):
        dq, dk, dv, dr = ref.linear_relative_attention_gradients(
            q[:, :, h], k[:, :, h], v[:, :, h], head_grad[:, :, h], rel[h], 2, causal=causal,
            query_mask=query_mask, key_mask=key_mask, epsilon=layer.epsilon)
        want_query += np.einsum("bth,dh->btd", dq, w["q"][:, h])
        want_value += np.einsum("bth,dh->btd", dk, w["k"][:, h]) + np.einsum("bth,dh->btd", dv, w["v"][:, h])
        want_rel[h] = dr
    for name, got, want in (("query", d_query, want_query), ("value", d_value, want_value),
                            ("relative_embeddings", d_rel, want_rel)):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 * max(1.0, np.abs(want).max()),
                                   err_msg=f"gradient of {name}")


def test_use_causal_mask_overrides_the_constructor_default():
    rng = np.random.default_rng(3)
    x = _inputs(rng, 2, 10, 8)
    layer = LinearRelativeAttention(2, 4, horizon=2, causal=True)
    causal = to_numpy(layer(x, x))
    np.testing.assert_array_equal(to_numpy(layer(x, x, use_causal_mask=True)), causal)
    bidirectional = to_numpy(layer(x, x, use_causal_mask=False))
    assert not np.allclose(bidirectional, causal)
    x_future = x.copy()
    x_future[:, 5:] = rng.normal(size=x_future[:, 5:].shape)
    np.testing.assert_allclose(to_numpy(layer(x_future, x_future))[:, :5], causal[:, :5], rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------
# Positions: relative only, so lengths extrapolate.

def test_model_built_at_512_runs_at_4096_without_new_weights():
    layer = LinearRelativeAttention(2, 8, horizon=16, causal=True)
    layer.build((None, 512, 16), (None, 512, 16))
    weights_before = [w.path for w in layer.weights]
    rng = np.random.default_rng(9)
    short, long = _inputs(rng, 1, 512, 16), _inputs(rng, 1, 4096, 16)
    long[:, :512] = short
    out_short, out_long = to_numpy(layer(short, short)), to_numpy(layer(long, long))
    assert [w.path for w in layer.weights] == weights_before
    # Causal and relative: the first 512 outputs of the long input are those of the short one.
    np.testing.assert_allclose(out_long[:, :512], out_short, rtol=1e-4, atol=1e-5)
    assert np.all(np.isfinite(out_long))


def test_relative_positions_make_the_layer_shift_equivariant():
    # Without absolute positions, shifting a sequence inside a longer all-padding frame shifts the output.
    rng = np.random.default_rng(10)
    x = _inputs(rng, 1, 12, 8)
    layer = LinearRelativeAttention(2, 4, horizon=3)
    base = to_numpy(layer(x, x))
    framed = np.concatenate([np.zeros((1, 5, 8), np.float32), x, np.zeros((1, 4, 8), np.float32)], axis=1)
    mask = np.zeros((1, 21), bool)
    mask[:, 5:17] = True
    np.testing.assert_allclose(to_numpy(layer(framed, framed, query_mask=mask, value_mask=mask))[:, 5:17], base,
                               rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------
# Gradients and config.

def test_relative_embeddings_get_gradients():
    x = _inputs(np.random.default_rng(11), 2, 9, 8)
    layer = LinearRelativeAttention(2, 4, horizon=2)
    layer(x, x)
    _, grads = trainable_gradients(layer, lambda: keras.ops.sum(layer(x, x) ** 2))
    assert np.any(grads[layer.relative_embeddings.path] != 0)


def test_config_round_trip_keeps_the_scaleformer_arguments():
    layer = LinearRelativeAttention(2, 4, horizon=5, causal=True, share_relative_embeddings=True, epsilon=1e-4,
                                    chunk_size=3)
    config = layer.get_config()
    for argument in ("horizon", "causal", "share_relative_embeddings", "epsilon", "chunk_size"):
        assert argument in config
    assert LinearRelativeAttention.from_config(config).get_config() == config


# ----------------------------------------------------------------------------
# Argument errors.

@pytest.mark.parametrize("arguments, match", [
    (dict(num_heads=2, key_dim=4, horizon=0), "horizon.*positive integer or None.*horizon=0"),
    (dict(num_heads=2, key_dim=4, horizon=2.5), "horizon"),
    (dict(num_heads=2, key_dim=4, causal="yes"), "causal.*bool"),
    (dict(num_heads=2, key_dim=4, share_relative_embeddings=2), r"share_relative_embeddings.*bool \(or 0 / 1\)"),
    (dict(num_heads=2, key_dim=4, epsilon=0.0), "epsilon.*> 0.*epsilon=0.0"),
    (dict(num_heads=2, key_dim=4, epsilon=float("nan")), "epsilon"),
    (dict(num_heads=2, key_dim=4, chunk_size=0), "chunk_size"),
])
def test_invalid_constructor_arguments_raise(arguments, match):
    with pytest.raises(ValueError, match=match):
        LinearRelativeAttention(**arguments)


def test_invalid_call_options_raise():
    x = np.zeros((1, 4, 8), np.float32)
    layer = LinearRelativeAttention(2, 4)
    with pytest.raises(ValueError, match="does not return attention scores"):
        layer(x, x, return_attention_scores=True)
    with pytest.raises(ValueError, match="use_causal_mask.*None or a Python bool"):
        layer(x, x, use_causal_mask="yes")
    with pytest.raises(ValueError, match="`value` and `key`"):
        LinearRelativeAttention(2, 4).build((1, 5, 8), (1, 6, 8), (1, 7, 8))


# ----------------------------------------------------------------------------
# Learning: relative positions carry information that plain linear attention lacks.

def _fit_copy_from_two_back(horizon):
    """Causal per-token task: predict the token two positions back. Needs relative positions."""
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    vocab, length, offset = 8, 64, 2

    def data(count):
        tokens = rng.integers(1, vocab + 1, size=(count, length)).astype(np.int32)
        targets = np.zeros_like(tokens)
        targets[:, offset:] = tokens[:, :-offset]
        weights = np.zeros(tokens.shape, np.float32)
        weights[:, offset:] = 1.0
        return tokens, targets, weights

    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(vocab + 1, 32)(tokens)
    x = LinearRelativeAttention(2, 16, horizon=horizon, causal=True)(x, x)
    model = keras.Model(tokens, keras.layers.Dense(vocab + 1)(x))
    model.compile(keras.optimizers.Adam(3e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  weighted_metrics=["accuracy"])
    train = data(4096)
    model.fit(train[0], train[1], sample_weight=train[2], batch_size=32, epochs=2, verbose=0)
    test = data(256)
    return model.evaluate(test[0], test[1], sample_weight=test[2], verbose=0)[1]


@requires_tensorflow  # the learning itself; the op's gradients are checked on every backend
def test_relative_positions_learn_a_task_plain_linear_attention_cannot():
    assert _fit_copy_from_two_back(horizon=4) >= 0.9
    assert _fit_copy_from_two_back(horizon=None) < 0.5
