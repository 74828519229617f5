"""The contract both attention layers keep with keras.layers.MultiHeadAttention, on every backend.

Shapes, masks, input errors, config round trip, `.keras` save/load, gradient flow and `fit` on a
tiny model, for YosoAttention and LinearRelativeAttention alike (their specific math is tested in
test_yoso_attention.py and test_linear_relative_attention.py).
"""

import keras
import numpy as np
import pytest

from conftest import lengths_mask, to_numpy, trainable_gradients
from keras_yoso.layers import LinearRelativeAttention
from keras_yoso.layers import YosoAttention

LAYERS = {
    "yoso": lambda **kw: YosoAttention(**{"num_hashes": 8, "hash_code_len": 4, "seed": 3, **kw}),
    "yoso_c": lambda **kw: YosoAttention(**{"num_hashes": 8, "hash_code_len": 4, "seed": 3, "conv_window": 3,
                                            **kw}),
    "yoso_window": lambda **kw: YosoAttention(**{"num_hashes": 8, "hash_code_len": 4, "seed": 3, "local_window": 3,
                                                 **kw}),
    "linear_relative": lambda **kw: LinearRelativeAttention(**{"horizon": 3, **kw}),
}


@pytest.fixture(params=sorted(LAYERS))
def make(request):
    return LAYERS[request.param]


def _inputs(rng, batch, length, dim, scale=1.0):
    return (scale * rng.normal(size=(batch, length, dim))).astype(np.float32)


# ----------------------------------------------------------------------------
# Shapes and the MultiHeadAttention call convention.

def test_self_and_cross_attention_output_shapes(make):
    rng = np.random.default_rng(0)
    query, value, key = _inputs(rng, 2, 7, 16), _inputs(rng, 2, 7, 12), _inputs(rng, 2, 7, 6)
    assert make(num_heads=2, key_dim=8)(query, query).shape == (2, 7, 16)
    assert make(num_heads=2, key_dim=8, value_dim=5)(query, value).shape == (2, 7, 16)
    assert make(num_heads=2, key_dim=8)(query, value, key=key).shape == (2, 7, 16)
    assert make(num_heads=3, key_dim=4, output_shape=9)(query, value).shape == (2, 7, 9)
    assert make(num_heads=3, key_dim=4, output_shape=(2, 5))(query, value).shape == (2, 7, 2, 5)


def test_functional_model_output_shape_matches_layer(make):
    query, value = keras.Input((7, 16)), keras.Input((7, 12))
    output = make(num_heads=2, key_dim=8, output_shape=10)(query, value)
    assert output.shape == (None, 7, 10)
    model = keras.Model([query, value], output)
    rng = np.random.default_rng(1)
    assert model([_inputs(rng, 3, 7, 16), _inputs(rng, 3, 7, 12)]).shape == (3, 7, 10)


def test_the_call_signature_is_written_once_and_compute_output_spec_reads_its_arguments_by_it(make):
    # MultiHeadAttention's 12 call arguments live in the signature of `call` (Keras reads `training` and
    # the `*_mask` arguments there); compute_output_spec binds what Keras passes it to that signature.
    import inspect

    from keras_yoso.layers import multi_head_attention_base

    assert inspect.getsource(multi_head_attention_base).count("cache_update_index=None") == 1
    names = list(inspect.signature(multi_head_attention_base.MultiHeadAttentionBase.call).parameters)[1:]
    assert names == ["query", "value", "key", "query_mask", "value_mask", "key_mask", "attention_mask", "training",
                     "use_causal_mask", "return_attention_scores", "cache", "cache_update_index"]
    layer = make(num_heads=2, key_dim=4)
    query = keras.KerasTensor((2, 6, 8))
    assert layer.compute_output_spec(query, query).shape == (2, 6, 8)
    if isinstance(layer, YosoAttention):  # LinearRelativeAttention returns no scores
        # return_attention_scores, the 10th argument, given by position
        output, scores = layer.compute_output_spec(query, query, None, None, None, None, None, None, None, True)
        assert (output.shape, scores.shape) == ((2, 6, 8), (2, 2, 6, 6))
    with pytest.raises(TypeError, match="cache_index"):
        layer.compute_output_spec(query, query, cache_index=0)


def test_key_none_is_key_equal_to_value(make):
    rng = np.random.default_rng(2)
    query, value = _inputs(rng, 2, 9, 8), _inputs(rng, 2, 9, 8)
    layer = make(num_heads=2, key_dim=4)
    np.testing.assert_array_equal(to_numpy(layer(query, value)), to_numpy(layer(query, value, key=value)))


# ----------------------------------------------------------------------------
# Masks.

def test_padded_key_content_does_not_change_unpadded_outputs(make):
    rng = np.random.default_rng(3)
    x = _inputs(rng, 3, 12, 8)
    mask = lengths_mask([12, 7, 3], 12)
    noisy = np.where(mask[:, :, None], x, 1e3 * rng.normal(size=x.shape)).astype(np.float32)
    layer = make(num_heads=2, key_dim=4)
    clean = to_numpy(layer(x, x, query_mask=mask, value_mask=mask))
    dirty = to_numpy(layer(noisy, noisy, query_mask=mask, value_mask=mask))
    np.testing.assert_allclose(dirty[mask], clean[mask], rtol=1e-5, atol=1e-5)
    # key_mask alone (queries unmasked) also hides the padded keys from every query.
    x_keys = np.where(mask[:, :, None], x, 0.0).astype(np.float32)
    np.testing.assert_allclose(to_numpy(layer(x, noisy, key=noisy, key_mask=mask))[mask],
                               to_numpy(layer(x, x_keys, key=x_keys, key_mask=mask))[mask], rtol=1e-5, atol=1e-5)


def test_implicit_embedding_masks_ignore_extra_padding(make):
    tokens = keras.Input((None,), dtype="int32")
    embedded = keras.layers.Embedding(20, 8, mask_zero=True)(tokens)
    model = keras.Model(tokens, make(num_heads=2, key_dim=4)(embedded, embedded))
    short = np.array([[5, 7, 9, 2, 0, 0], [3, 4, 0, 0, 0, 0]], np.int32)
    long = np.concatenate([short, np.zeros((2, 10), np.int32)], axis=1)
    kept = short != 0
    np.testing.assert_allclose(to_numpy(model(long))[:, :6][kept], to_numpy(model(short))[kept], rtol=1e-5, atol=1e-6)


def test_padded_queries_output_only_the_projection_bias(make):
    rng = np.random.default_rng(4)
    x = _inputs(rng, 2, 10, 8)
    mask = lengths_mask([10, 4], 10)
    layer = make(num_heads=2, key_dim=4, bias_initializer="random_normal")
    out = to_numpy(layer(x, x, query_mask=mask, value_mask=mask))
    bias = to_numpy(layer.output_dense.bias)
    np.testing.assert_allclose(out[~mask], np.broadcast_to(bias, out[~mask].shape), rtol=1e-6, atol=1e-6)
    # (Plain YOSO may leave a query without any colliding key, so only most rows must differ.)
    assert np.mean(np.abs(out[mask] - bias).max(axis=-1) > 0) > 0.5


def test_padding_attention_mask_equals_query_and_value_masks(make):
    rng = np.random.default_rng(6)
    query, value = _inputs(rng, 2, 5, 8), _inputs(rng, 2, 5, 8)
    query_mask, key_mask = lengths_mask([5, 3], 5), lengths_mask([4, 5], 5)
    layer = make(num_heads=2, key_dim=4)
    expected = to_numpy(layer(query, value, query_mask=query_mask, value_mask=key_mask))
    pair_mask = query_mask[:, :, None] & key_mask[:, None, :]
    np.testing.assert_allclose(to_numpy(layer(query, value, attention_mask=pair_mask)), expected, atol=1e-6)
    # A key mask broadcast over every row is a padding mask too.
    rows = np.broadcast_to(key_mask[:, None, :], (2, 5, 5))
    np.testing.assert_allclose(to_numpy(layer(query, value, attention_mask=rows)),
                               to_numpy(layer(query, value, value_mask=key_mask)), atol=1e-6)


def test_non_padding_attention_mask_raises(make):
    x = np.zeros((1, 4, 8), np.float32)
    with pytest.raises(ValueError, match="not a padding mask.*query_mask"):
        make(num_heads=2, key_dim=4)(x, x, attention_mask=np.tril(np.ones((1, 4, 4), bool)))


def test_fully_padded_sequence_gives_finite_outputs_and_gradients(make):
    x = _inputs(np.random.default_rng(5), 2, 6, 8)
    mask = lengths_mask([6, 0], 6)
    layer = make(num_heads=2, key_dim=4)
    layer(x, x)
    loss, grads = trainable_gradients(
        layer, lambda: keras.ops.sum(layer(x, x, query_mask=mask, value_mask=mask, training=True) ** 2))
    assert np.isfinite(loss)
    assert all(g is not None and np.all(np.isfinite(g)) for g in grads.values())


def test_nan_in_padded_queries_keys_and_values_reaches_no_output_or_gradient(make):
    rng = np.random.default_rng(8)
    x = _inputs(rng, 2, 6, 8)
    mask = lengths_mask([6, 3], 6)
    dirty = x.copy()
    dirty[1, 3:] = np.nan
    layer = make(num_heads=2, key_dim=4)
    layer(x, x)
    clean_loss, clean_grads = trainable_gradients(
        layer, lambda: keras.ops.sum(layer(x, x, query_mask=mask, value_mask=mask) ** 2))
    loss, grads = trainable_gradients(
        layer, lambda: keras.ops.sum(layer(dirty, dirty, query_mask=mask, value_mask=mask) ** 2))
    assert np.isfinite(loss) and abs(loss - clean_loss) <= 1e-4 * abs(clean_loss)
    for path, grad in grads.items():
        np.testing.assert_allclose(grad, clean_grads[path], rtol=1e-4, atol=1e-5, err_msg=path)


# ----------------------------------------------------------------------------
# Input shape errors: ValueError naming the argument, the expected and the received shape.

SHAPE_ERRORS = {
    "query_mask_too_short": (dict(query_mask=np.ones((2, 9), bool)),
                             r"`query_mask` of shape \(batch, target_length\) = \(2, 10\).*"
                             r"Received: `query_mask` of shape \(2, 9\)"),
    "query_mask_rank_3": (dict(query_mask=np.ones((2, 10, 1), bool)),
                          r"`query_mask` of shape \(batch, target_length\).*Received: `query_mask` of shape \(2, 10, 1\)"),
    "value_mask_wrong_length": (dict(value_mask=np.ones((2, 11), bool)),
                                r"`value_mask` of shape \(batch, source_length\) = \(2, 10\).*\(2, 11\)"),
    "value_mask_rank_3": (dict(value_mask=np.ones((2, 10, 1), bool)), r"`value_mask` of shape .*\(2, 10, 1\)"),
    "key_mask_wrong_batch": (dict(key_mask=np.ones((3, 10), bool)),
                             r"`key_mask` of shape \(batch, source_length\) = \(2, 10\).*\(3, 10\)"),
    "value_batch": (dict(value=np.ones((3, 10, 16), np.float32)),
                    r"`value` of shape \(batch, source_length, features\) = \(2, source_length, features\).*"
                    r"Received: `value` of shape \(3, 10, 16\)"),
    "key_batch": (dict(key=np.ones((3, 10, 8), np.float32)), r"All dimensions of `value` and `key`"),
    "attention_mask_extra_column": (dict(attention_mask=np.ones((2, 10, 11), bool)),
                                    r"accepts `attention_mask` only of shape \[batch, target_length, source_length\] "
                                    r"\(a padding mask\) = \(2, 10, 10\).*\(2, 10, 11\)"),
    "attention_mask_rank_2": (dict(attention_mask=np.ones((2, 10), bool)),
                              r"accepts `attention_mask` only of shape .*Received: `attention_mask` of shape \(2, 10\)"),
}


@pytest.mark.parametrize("case", sorted(SHAPE_ERRORS))
def test_call_shape_mistakes_raise_value_error_naming_the_argument(make, case):
    rng = np.random.default_rng(9)
    args = dict(query=_inputs(rng, 2, 10, 16), value=_inputs(rng, 2, 10, 16))
    overrides, match = SHAPE_ERRORS[case]
    args.update(overrides)
    with pytest.raises(ValueError, match=match):
        make(num_heads=2, key_dim=4)(**args)


@pytest.mark.parametrize("argument, shape", [("query_mask", (2, 10)), ("value_mask", (2, 10)),
                                             ("key_mask", (2, 10)), ("attention_mask", (2, 10, 10))])
def test_string_masks_are_rejected_naming_the_argument(make, argument, shape):
    x = _inputs(np.random.default_rng(9), 2, 10, 16)
    with pytest.raises(ValueError, match=rf"argument `{argument}`: expected a bool or numeric mask\. "
                                         rf"Received: {argument} of dtype string"):
        make(num_heads=2, key_dim=4)(x, x, **{argument: np.full(shape, "yes")})


def test_query_of_wrong_rank_and_unknown_features_raise(make):
    with pytest.raises(ValueError, match=r"expects `query` of shape \(batch, length, features\)"):
        make(num_heads=2, key_dim=4)(np.zeros((2, 8), np.float32), np.zeros((2, 4, 8), np.float32))
    with pytest.raises(ValueError, match="The last dimension of `query` must be known"):
        make(num_heads=2, key_dim=4).build((None, 5, None), (None, 5, 8))


@pytest.mark.parametrize("arguments, match", [
    (dict(num_heads=0, key_dim=4), "num_heads.*positive integer.*num_heads=0"),
    (dict(num_heads=2.0, key_dim=4), "num_heads"),
    (dict(num_heads=2, key_dim=-1), "key_dim.*positive integer.*key_dim=-1"),
    (dict(num_heads=2, key_dim=4, value_dim=0), "value_dim"),
    (dict(num_heads=2, key_dim=4, dropout=1.0), r"dropout.*\[0, 1\)"),
    (dict(num_heads=2, key_dim=4, seed="x"), "seed.*integer or None"),
    (dict(num_heads=2, key_dim=4, output_shape=(0,)), "output_shape"),
])
def test_invalid_shared_constructor_arguments_raise(make, arguments, match):
    with pytest.raises(ValueError, match=match):
        make(**arguments)


def test_attention_masks_of_multi_head_attention_layouts_equal_the_batch_mask(make):
    """[T, S] broadcasts over the batch and [B, H, T, S] with one padding in every head is its head:
    both give the [B, T, S] mask's outputs; heads that differ raise ValueError."""
    rng = np.random.default_rng(1)
    x = _inputs(rng, 2, 6, 8)
    layer = make(num_heads=2, key_dim=4)
    keep = np.ones((6, 6), bool)
    keep[:, 4:] = False  # the last two keys padded for every query
    batch_mask = np.broadcast_to(keep, (2, 6, 6))
    expected = to_numpy(layer(x, x, attention_mask=batch_mask))
    np.testing.assert_allclose(to_numpy(layer(x, x, attention_mask=keep)), expected, rtol=1e-6, atol=1e-6)
    heads = np.broadcast_to(keep, (2, 2, 6, 6))
    np.testing.assert_allclose(to_numpy(layer(x, x, attention_mask=heads)), expected, rtol=1e-6, atol=1e-6)
    differing = heads.copy()
    differing[:, 1, :, 3] = False
    with pytest.raises(ValueError, match="4-D `attention_mask`.*whose heads differ"):
        layer(x, x, attention_mask=differing)
    with pytest.raises(ValueError, match=r"accepts `attention_mask` only of shape.*num_heads = 2.*\(2, 3, 6, 6\)"):
        layer(x, x, attention_mask=np.ones((2, 3, 6, 6), bool))


def test_use_gate_multiplies_the_heads_by_a_sigmoid_gate_named_as_in_multi_head_attention(make):
    rng = np.random.default_rng(4)
    x = _inputs(rng, 2, 6, 8)
    gated = make(num_heads=2, key_dim=4, use_gate=True)
    plain = make(num_heads=2, key_dim=4)
    gated(x, x)
    plain(x, x)
    reference = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, use_gate=True)
    reference(x, x)
    projections = ("query/", "key/", "gate/", "value/", "attention_output/")
    assert [w.path.split("/", 1)[1] for w in gated.weights if w.path.split("/", 1)[1].startswith(projections)] == [
        w.path.split("/", 1)[1] for w in reference.weights]
    for target, source in zip([w for w in gated.weights if "/gate/" not in w.path], plain.weights):
        target.assign(keras.ops.convert_to_numpy(source))
    for bias, reference_output in ((30.0, to_numpy(plain(x, x))), (-30.0, None)):
        kernel = keras.ops.convert_to_numpy(gated._gate_dense.kernel)
        gated._gate_dense.kernel.assign(np.zeros_like(kernel))
        gated._gate_dense.bias.assign(np.full(tuple(gated._gate_dense.bias.shape), bias, np.float32))
        out = to_numpy(gated(x, x))
        if reference_output is not None:  # gate = 1: the plain layer
            np.testing.assert_allclose(out, reference_output, rtol=1e-5, atol=1e-5)
        else:  # gate = 0: the output projection's bias only
            bias_only = np.broadcast_to(keras.ops.convert_to_numpy(gated.output_dense.bias), out.shape)
            np.testing.assert_allclose(out, bias_only, atol=1e-5)
    assert make(num_heads=2, key_dim=4, use_gate=True).get_config()["use_gate"] is True


def test_attention_axes_attend_over_the_flattened_axes_with_the_others_as_batch(make):
    """(batch, A, C, features) inputs: attention_axes=(2,) is the layer on (batch * A, C, features) rows,
    the default (1, 2) (and (-3, -2)) the layer on (batch, A * C, features); query and value masks
    follow; scores come in MultiHeadAttention's layout (batch, A, heads, C, C)."""
    rng = np.random.default_rng(6)
    x = _inputs(rng, 2, 12, 8).reshape(2, 3, 4, 8)
    mask = np.ones((2, 3, 4), bool)
    mask[1, 2, 3] = False
    sequences = make(num_heads=2, key_dim=4, seed=7)
    sequences(x[:, 0], x[:, 0])
    for axes, rows in (((2,), (6, 4, 8)), (None, (2, 12, 8)), ((-3, -2), (2, 12, 8))):
        layer = make(num_heads=2, key_dim=4, seed=7, attention_axes=axes)
        out = to_numpy(layer(x, x, query_mask=mask, value_mask=mask))
        assert out.shape == x.shape
        layer.set_weights(sequences.get_weights())
        out = to_numpy(layer(x, x, query_mask=mask, value_mask=mask))
        flat, flat_mask = x.reshape(rows), mask.reshape(rows[:2])
        expected = to_numpy(sequences(flat, flat, query_mask=flat_mask, value_mask=flat_mask)).reshape(x.shape)
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
        assert make(num_heads=2, key_dim=4, attention_axes=axes).get_config()["attention_axes"] == (
            None if axes is None else tuple(axes))
    with pytest.raises(ValueError, match=r"attention_axes.*in \[1, 2\].*attention_axes=\(3,\)"):
        make(num_heads=2, key_dim=4, attention_axes=3)(x, x)
    with pytest.raises(ValueError, match="attention_axes.*an int, or a list or tuple of ints"):
        make(num_heads=2, key_dim=4, attention_axes="1")


def test_multi_head_attention_flags_are_taken_as_there(make):
    """flash_attention is accepted (it changes nothing: no softmax matrix), with MultiHeadAttention's
    refusals when True; sliding_window is refused (a band is not a padding mask); flags may be 0 / 1."""
    rng = np.random.default_rng(0)
    x = _inputs(rng, 2, 6, 8)
    plain = make(num_heads=2, key_dim=4, seed=5)
    flash = make(num_heads=2, key_dim=4, seed=5, flash_attention=True)
    plain(x, x)
    flash(x, x)
    flash.set_weights(plain.get_weights())
    np.testing.assert_array_equal(to_numpy(flash(x, x)), to_numpy(plain(x, x)))
    with pytest.raises(ValueError, match="Dropout is not supported when flash attention is enabled"):
        make(num_heads=2, key_dim=4, flash_attention=True, dropout=0.1)
    with pytest.raises(ValueError, match="Returning attention scores is not supported when flash attention"):
        flash(x, x, return_attention_scores=True)
    with pytest.raises(ValueError, match=r"does not support `sliding_window`.*padding mask.*sliding_window=3"):
        make(num_heads=2, key_dim=4, sliding_window=3)
    np.testing.assert_array_equal(to_numpy(plain(x, x, use_causal_mask=0)), to_numpy(plain(x, x)))
    np.testing.assert_array_equal(to_numpy(plain(x, x, use_causal_mask=1)),
                                  to_numpy(plain(x, x, use_causal_mask=True)))
    with pytest.raises(ValueError, match=r"use_causal_mask.*None or a Python bool \(or 0 / 1\).*=2"):
        plain(x, x, use_causal_mask=2)


# ----------------------------------------------------------------------------
# Config, saving, gradients, training.

def test_config_round_trip_reproduces_the_layer(make):
    rng = np.random.default_rng(14)
    x = _inputs(rng, 2, 8, 6)
    layer = make(num_heads=2, key_dim=4, value_dim=3, dropout=0.1, output_shape=(5,), kernel_regularizer="l2",
                 bias_constraint="non_neg", name="attention")
    out = to_numpy(layer(x, x))
    config = layer.get_config()
    for argument in ("num_heads", "key_dim", "value_dim", "dropout", "use_bias", "output_shape",
                     "kernel_initializer", "bias_initializer", "kernel_regularizer", "bias_regularizer",
                     "activity_regularizer", "kernel_constraint", "bias_constraint", "seed"):
        assert argument in config
    clone = type(layer).from_config(config)
    assert clone.get_config() == config
    clone.build(x.shape, x.shape)
    clone.set_weights(layer.get_weights())
    np.testing.assert_array_equal(to_numpy(clone(x, x)), out)


def _small_model(make):
    tokens = keras.Input((16,), dtype="int32")
    x = keras.layers.Embedding(32, 8, mask_zero=True)(tokens)
    x = make(num_heads=2, key_dim=4)(x, x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(tokens, keras.layers.Dense(2)(x))


def _tokens(rng, batch=4):
    tokens = rng.integers(1, 32, size=(batch, 16)).astype(np.int32)
    tokens[1, 10:] = 0
    return tokens


def test_keras_save_and_load_give_identical_outputs(make, tmp_path):
    model = _small_model(make)
    tokens = _tokens(np.random.default_rng(15))
    expected = to_numpy(model(tokens))
    model.save(tmp_path / "model.keras")
    restored = keras.saving.load_model(tmp_path / "model.keras")
    np.testing.assert_array_equal(to_numpy(restored(tokens)), expected)


def test_gradients_reach_every_weight_and_are_finite(make):
    x = _inputs(np.random.default_rng(13), 2, 10, 8)
    layer = make(num_heads=2, key_dim=4)
    layer(x, x)
    _, grads = trainable_gradients(layer, lambda: keras.ops.sum(layer(x, x, training=True) ** 2))
    for path, grad in grads.items():
        assert grad is not None and np.all(np.isfinite(grad)), path
    assert any(np.abs(g).max() > 0 for p, g in grads.items() if "query" in p), "no gradient reaches the queries"


def test_fit_on_a_tiny_model_lowers_the_loss(make):
    keras.utils.set_random_seed(0)
    model = _small_model(make)
    model.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(18)
    tokens = _tokens(rng, 32)
    labels = (tokens[:, 0] > 16).astype(np.int32)  # learnable from the first token
    history = model.fit(tokens, labels, batch_size=8, epochs=8, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_outputs_are_finite_in_compute_dtype(make, policy):
    try:
        keras.mixed_precision.set_global_policy(policy)
        x = _inputs(np.random.default_rng(19), 2, 12, 8, scale=10.0)
        mask = lengths_mask([12, 5], 12)
        layer = make(num_heads=2, key_dim=4)
        output = layer(x, x, query_mask=mask, value_mask=mask, training=True)
        assert keras.backend.standardize_dtype(output.dtype) == layer.compute_dtype == policy.split("_")[1]
        assert np.all(np.isfinite(to_numpy(output)))
        _, grads = trainable_gradients(layer, lambda: keras.ops.sum(
            keras.ops.cast(layer(x, x, query_mask=mask, value_mask=mask, training=True), "float32") ** 2))
        assert all(np.all(np.isfinite(g)) for g in grads.values())
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_a_new_variant_is_one_method_and_a_registered_name_that_the_block_builds():
    """A variant takes MultiHeadAttention's arguments through **kwargs and implements `_attend` only;
    registered by name, TransformerEncoderBlock builds it, masks, dropout and config included."""
    from keras import ops

    from keras_yoso.layers import TransformerEncoderBlock
    from keras_yoso.layers.attention_registry import register_attention
    from keras_yoso.layers.multi_head_attention_base import MultiHeadAttentionBase

    @register_attention("mean_of_kept_values")
    class MeanOfKeptValues(MultiHeadAttentionBase):
        def _attend(self, heads, masks, training, causal, cache=None, index=None):
            _, _, value = heads
            kept = ops.cast(masks[1], "float32")[:, :, None, None]
            mean = ops.sum(value * kept, axis=1, keepdims=True) / ops.maximum(ops.sum(kept, axis=1, keepdims=True), 1)
            query = heads[0]
            return ops.broadcast_to(mean, tuple(ops.shape(query)[:2]) + tuple(mean.shape[2:])), None

    rng = np.random.default_rng(0)
    x = _inputs(rng, 2, 5, 8)
    mask = lengths_mask([5, 3], 5)
    layer = MeanOfKeptValues(num_heads=2, key_dim=4, dropout=0.0, use_bias=False, kernel_initializer="ones")
    out = to_numpy(layer(x, x, query_mask=mask, value_mask=mask))
    assert out.shape == (2, 5, 8) and np.all(out[1, 3:] == 0.0)  # masked queries output zero
    # The padded values of row 1 never reach an output.
    changed = x.copy()
    changed[1, 3:] = 1e6
    np.testing.assert_allclose(to_numpy(layer(changed, changed, query_mask=mask, value_mask=mask)), out, rtol=1e-6)
    assert MeanOfKeptValues.from_config(layer.get_config()).get_config()["use_bias"] is False
    block = TransformerEncoderBlock(2, 16, attention="mean_of_kept_values", dropout=0.0)
    assert to_numpy(block(x)).shape == (2, 5, 8)
    assert isinstance(block.attention_layer, MeanOfKeptValues)
