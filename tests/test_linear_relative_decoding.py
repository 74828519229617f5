"""Incremental decoding of LinearRelativeAttention (`init_cache`, `cache=`, `cache_update_index=`) and of
`linear_relative_attention_step`, on every backend: every decoded row equals the matching row of the causal
full forward (token by token, in chunks, with padding, inside compiled loops), with a cache whose shapes never
change."""

import keras
import numpy as np
import pytest

from conftest import BACKEND, lengths_mask, requires_tensorflow, to_numpy
from keras_yoso import ops as yoso_ops
from keras_yoso.layers import LinearRelativeAttention
from keras_yoso.ops.linear_relative import linear_relative_attention_step
from keras_yoso.ops.linear_relative import linear_relative_decoding_state

LENGTH, BATCH, DIM = 12, 2, 6
# horizon 3 over 12 positions: the later queries see keys beyond the horizon (relative row 0).
OPTIONS = {
    "per_head": {"horizon": 3},
    "shared": {"horizon": 3, "share_relative_embeddings": True},
    "no_relative": {"horizon": None},
    "horizon_one": {"horizon": 1, "value_dim": 3},
}


def _layer(causal=True, **options):
    options = {"horizon": 3, **options}
    return LinearRelativeAttention(2, 4, causal=causal, chunk_size=2, bias_initializer="random_normal", **options)


def _sequence(seed=0, length=LENGTH):
    return np.random.default_rng(seed).normal(size=(BATCH, length, DIM)).astype(np.float32)


def _decode(layer, x, sizes, masks=None):
    """Feeds `x` [B, L, dim] to the layer in blocks of `sizes` positions; the outputs, concatenated, and the cache."""
    cache = layer.init_cache(x.shape[0])
    outputs, start = [], 0
    for size in sizes:
        block = slice(start, start + size)
        kwargs = {} if masks is None else {name: mask[:, block] for name, mask in masks.items()}
        out, cache = layer(x[:, block], x[:, block], cache=cache, cache_update_index=start, **kwargs)
        outputs.append(to_numpy(out))
        start += size
    assert start == x.shape[1]
    return np.concatenate(outputs, axis=1), cache


def _shapes(cache):
    return {name: (tuple(tensor.shape), keras.backend.standardize_dtype(tensor.dtype))
            for name, tensor in cache.items()}


# ----------------------------------------------------------------------------
# Decoded rows equal the causal full forward.

@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
def test_token_by_token_decoding_matches_causal_forward_at_every_position(options):
    x = _sequence()
    layer = _layer(**options)
    decoded, _ = _decode(layer, x, [1] * LENGTH)
    np.testing.assert_allclose(decoded, to_numpy(layer(x, x)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("sizes", [(5, 1, 1, 1, 1, 1, 1, 1), (4, 1, 3, 2, 2), (12,)],
                         ids=["prefill_then_tokens", "chunks_of_different_sizes", "one_prefill"])
@pytest.mark.parametrize("options", [OPTIONS["per_head"], OPTIONS["no_relative"]], ids=["per_head", "no_relative"])
def test_chunked_decoding_matches_causal_forward(sizes, options):
    x = _sequence(1)
    layer = _layer(**options)
    decoded, _ = _decode(layer, x, sizes)
    np.testing.assert_allclose(decoded, to_numpy(layer(x, x)), rtol=1e-4, atol=1e-4)


def test_non_causal_layer_decodes_with_use_causal_mask_true():
    x = _sequence(2)
    layer = _layer(causal=False)
    cache = layer.init_cache(BATCH)
    outputs = []
    for start in range(0, LENGTH, 3):
        out, cache = layer(x[:, start:start + 3], x[:, start:start + 3], cache=cache, cache_update_index=start,
                           use_causal_mask=True)
        outputs.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), to_numpy(layer(x, x, use_causal_mask=True)),
                               rtol=1e-4, atol=1e-4)


def test_tensor_cache_update_index_gives_the_same_values():
    x = _sequence(3)
    layer = _layer()
    decoded, _ = _decode(layer, x, [4, 4, 4])
    cache = layer.init_cache(BATCH)
    outputs = []
    for start in range(0, LENGTH, 4):
        index = keras.ops.convert_to_tensor(start, "int32")
        out, cache = layer(x[:, start:start + 4], x[:, start:start + 4], cache=cache, cache_update_index=index)
        outputs.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), decoded, rtol=1e-6, atol=1e-6)


def test_step_op_matches_causal_op_rows_with_batched_embeddings_and_padding():
    """The op itself: per-sequence relative embeddings, padded queries and keys, chunks larger than chunk_size."""
    rng = np.random.default_rng(4)
    batch, length, depth, value_depth, horizon = 3, 11, 4, 3, 2
    query, key = (rng.normal(size=(batch, length, depth)).astype(np.float32) for _ in range(2))
    value = rng.normal(size=(batch, length, value_depth)).astype(np.float32)
    rel = rng.normal(size=(batch, 2 * horizon + 1, depth)).astype(np.float32)
    query_mask, key_mask = rng.random((batch, length)) > 0.3, rng.random((batch, length)) > 0.3
    full = yoso_ops.linear_relative_attention(query, key, value, rel, horizon, causal=True, query_mask=query_mask,
                                              key_mask=key_mask)
    state = linear_relative_decoding_state((batch,), depth, value_depth, horizon)
    outputs, start = [], 0
    for size in (6, 1, 4):
        block = slice(start, start + size)
        out, state = linear_relative_attention_step(query[:, block], key[:, block], value[:, block], state, rel,
                                                    horizon, query_mask=query_mask[:, block],
                                                    key_mask=key_mask[:, block], chunk_size=4)
        outputs.append(to_numpy(out))
        start += size
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), to_numpy(full), rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------
# The cache.

@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
def test_cache_shapes_are_fixed_and_independent_of_positions_seen(options):
    layer = _layer(**options)
    initial = layer.init_cache(BATCH)  # before the layer is built
    assert not layer.built
    horizon, value_dim = options["horizon"], options.get("value_dim", 4)
    rows = 4 if horizon is None else 4 + horizon + 1
    assert sum(np.asarray(to_numpy(t)).nbytes for t in initial.values()) == 4 * BATCH * 2 * (value_dim + 1) * rows
    assert all(not np.any(to_numpy(t)) for t in initial.values())
    _, after_short = _decode(layer, _sequence(length=2), [2])
    _, after_long = _decode(layer, _sequence(length=LENGTH), [5] + [1] * 7)
    assert _shapes(after_short) == _shapes(after_long) == _shapes(initial)
    assert {dtype for _, dtype in _shapes(initial).values()} == {"float32"}


def test_padded_new_keys_do_not_change_later_outputs():
    x = _sequence(5)
    query_mask, value_mask = lengths_mask([LENGTH, LENGTH], LENGTH), np.ones((BATCH, LENGTH), bool)
    value_mask[0, [2, 7]] = value_mask[1, [0, 5, 6]] = False
    query_mask[1, 4] = False
    masks = {"query_mask": query_mask, "value_mask": value_mask}
    layer = _layer()
    decoded, _ = _decode(layer, x, [3, 1, 1, 4, 1, 1, 1], masks)
    np.testing.assert_allclose(decoded, to_numpy(layer(x, x, **masks)), rtol=1e-4, atol=1e-4)
    changed = x.copy()
    changed[~value_mask] = 1e3
    redecoded, _ = _decode(layer, changed, [3, 1, 1, 4, 1, 1, 1], masks)
    # Only the rows of the padded positions changed (their queries did): every other output is the same.
    np.testing.assert_allclose(redecoded[value_mask], decoded[value_mask], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layer_causal, use_causal_mask", [(False, None), (True, False), (False, False)],
                         ids=["non_causal_layer", "use_causal_mask_false", "both"])
def test_non_causal_decoding_raises(layer_causal, use_causal_mask):
    x = _sequence(length=1)
    layer = _layer(causal=layer_causal)
    with pytest.raises(ValueError, match="causal=True"):
        layer(x, x, cache=layer.init_cache(BATCH), cache_update_index=0, use_causal_mask=use_causal_mask)


def test_cache_of_another_layout_raises():
    x = _sequence(length=1)
    layer = _layer()
    with pytest.raises(ValueError, match="init_cache"):
        layer(x, x, cache=_layer(horizon=None).init_cache(BATCH), cache_update_index=0)
    with pytest.raises(ValueError, match="window"):
        layer(x, x, cache=_layer(horizon=2).init_cache(BATCH), cache_update_index=0)


# ----------------------------------------------------------------------------
# Compiled decoding loops.

def _compiled(fn):
    if BACKEND == "jax":
        import jax

        return jax.jit(fn)
    if BACKEND == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, jit_compile=True)
    return fn  # torch: keras.ops.while_loop runs the same body eagerly


@pytest.mark.parametrize("options", [OPTIONS["per_head"], OPTIONS["no_relative"]], ids=["per_head", "no_relative"])
def test_decoding_in_compiled_while_loop_matches_eager_decoding(options):
    """A prefill chunk, then one token per `keras.ops.while_loop` step with a tensor index, compiled by XLA
    (jax.jit, tf.function(jit_compile=True); PyTorch runs the loop eagerly)."""
    x = _sequence(6)
    prefill = 4
    layer = _layer(**options)
    eager, _ = _decode(layer, x, [prefill] + [1] * (LENGTH - prefill))

    def generate(x):
        first, cache = layer(x[:, :prefill], x[:, :prefill], cache=layer.init_cache(BATCH), cache_update_index=0)
        outputs = keras.ops.concatenate([first, keras.ops.zeros((BATCH, LENGTH - prefill, DIM), first.dtype)], axis=1)

        def body(index, cache, outputs):
            token = keras.ops.slice(x, (0, index, 0), (BATCH, 1, DIM))
            out, cache = layer(token, token, cache=cache, cache_update_index=index)
            return index + 1, cache, keras.ops.slice_update(outputs, (0, index, 0), out)

        start = keras.ops.convert_to_tensor(prefill, "int32")
        _, _, outputs = keras.ops.while_loop(lambda index, cache, outputs: index < LENGTH, body,
                                             (start, cache, outputs))
        return outputs

    decoded = _compiled(generate)(keras.ops.convert_to_tensor(x))
    np.testing.assert_allclose(to_numpy(decoded), eager, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(to_numpy(decoded), to_numpy(layer(x, x)), rtol=1e-4, atol=1e-4)


@requires_tensorflow
def test_tf_graph_with_unknown_chunk_length_decodes_every_chunk_with_one_trace():
    import tensorflow as tf

    x = _sequence(7)
    layer = _layer()
    expected = to_numpy(layer(x, x))  # builds the layer outside the traced function
    cache_spec = {name: tf.TensorSpec(tensor.shape, tf.float32) for name, tensor in layer.init_cache(BATCH).items()}

    @tf.function(input_signature=[tf.TensorSpec([BATCH, None, DIM]), cache_spec, tf.TensorSpec([], tf.int32)])
    def step(block, cache, index):
        return layer(block, block, cache=cache, cache_update_index=index)

    cache, outputs, start = layer.init_cache(BATCH), [], 0
    for size in (5, 1, 4, 2):
        out, cache = step(x[:, start:start + size], cache, start)
        outputs.append(out.numpy())
        start += size
    assert step.experimental_get_tracing_count() == 1
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), expected, rtol=1e-4, atol=1e-4)
