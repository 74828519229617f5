"""docs/errors.md, "Layers": the rows shared by both attention layers and the encoder block.

Each test is one row of the contract (the per-layer argument rows are asserted next to the
layer's other tests). Also the padding guarantees that the contract promises for NaN/Inf.
"""

import numpy as np
import pytest
import tensorflow as tf

from keras_yoso import LinearRelativeAttention
from keras_yoso import TransformerEncoderBlock
from keras_yoso import YosoAttention

LAYERS = {
    "YosoAttention": lambda: YosoAttention(2, 4, num_hashes=4, hash_code_len=3, seed=1),
    "LinearRelativeAttention": lambda: LinearRelativeAttention(2, 4, horizon=2),
}


@pytest.fixture(params=sorted(LAYERS))
def layer_name(request):
    return request.param


def _x(batch=2, length=6, dim=8, seed=0):
    return np.random.default_rng(seed).normal(size=(batch, length, dim)).astype(np.float32)


def test_query_of_wrong_rank_raises(layer_name):
    with pytest.raises(ValueError, match=f"{layer_name} expects `query` of shape \\(batch, length, features\\), "
                                         r"got shape \(2, 6\)"):
        LAYERS[layer_name]()(np.zeros((2, 6), np.float32), _x())


def test_unknown_last_dimension_raises_at_build(layer_name):
    with pytest.raises(ValueError, match=r"The last dimension of `value` must be known, got shape \(2, 6, None\)"):
        LAYERS[layer_name]().build((2, 6, 8), (2, 6, None))


def test_attention_mask_of_wrong_rank_raises(layer_name):
    with pytest.raises(ValueError, match=f"{layer_name} accepts `attention_mask` only of shape \\[batch, "
                                         r"target_length, source_length\] \(a padding mask\)"):
        LAYERS[layer_name]()(_x(), _x(), attention_mask=np.ones((2, 6), bool))


def test_attention_mask_under_xla_raises_at_trace_time(layer_name):
    # XLA compiles tf.debugging.Assert to nothing, so the padding check cannot run there: a causal
    # mask would silently act as "no mask". The layer refuses instead, and tells what to pass.
    layer = LAYERS[layer_name]()
    fn = tf.function(lambda x, m: layer(x, x, attention_mask=m), jit_compile=True)
    with pytest.raises(ValueError, match="cannot check under XLA.*Pass `query_mask`, `value_mask`"):
        fn(_x(), np.ones((2, 6, 6), bool))


def test_attention_mask_turns_off_keras_auto_jit(layer_name):
    layer = LAYERS[layer_name]()
    layer(_x(), _x())
    assert layer.supports_jit or layer_name == "YosoAttention"  # YOSO custom op: never XLA-compiled
    layer(_x(), _x(), attention_mask=np.ones((2, 6, 6), bool))
    assert not layer.supports_jit


def test_nan_in_padded_queries_keys_and_values_reaches_no_output_or_gradient(layer_name):
    layer = LAYERS[layer_name]()
    mask = np.arange(6)[None, :] < np.array([[6], [4]])
    x = _x()
    layer(x, x)
    poisoned = x.copy()
    poisoned[1, 4:] = np.nan
    poisoned[1, 5, 0] = np.inf
    outputs, grads = [], []
    for inputs in (x, poisoned):
        inputs = tf.constant(inputs)
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            out = layer(inputs, inputs, query_mask=mask, value_mask=mask, training=False)
            loss = tf.reduce_sum(tf.where(mask[:, :, None], out, 0.0) ** 2)
        outputs.append(out.numpy()[mask])
        grads.append(tape.gradient(loss, [inputs] + layer.trainable_weights))
    np.testing.assert_allclose(outputs[1], outputs[0], rtol=1e-5, atol=1e-6)
    for clean, dirty in zip(*grads):
        dirty = dirty.numpy()
        assert np.all(np.isfinite(dirty))
        if dirty.shape == x.shape:  # the input gradient: padded rows get exactly 0
            assert np.all(dirty[~mask] == 0)
            dirty, clean = dirty[mask], clean.numpy()[mask]
        np.testing.assert_allclose(dirty, np.asarray(clean), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("arguments, inputs, match", [
    (dict(num_heads=2, intermediate_dim=8), (2, 6, None), r"last dimension of the inputs must be known"),
    (dict(num_heads=4, intermediate_dim=8), (2, 6, 2),
     r"hidden size 2 is smaller than num_heads=4; pass attention_kwargs=\{'key_dim': \.\.\.\}"),
    (dict(num_heads=2, intermediate_dim=8, attention_kwargs=dict(num_hashes=0)), (2, 6, 8),
     "num_hashes.*num_hashes=0"),
    (dict(num_heads=2, intermediate_dim=8, attention="linear_relative", attention_kwargs=dict(horizon=0)),
     (2, 6, 8), "horizon.*horizon=0"),
])
def test_transformer_encoder_block_build_errors(arguments, inputs, match):
    with pytest.raises(ValueError, match=match):
        TransformerEncoderBlock(**arguments).build(inputs)
