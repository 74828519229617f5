"""Softmax attention with a growing key/value cache, the baseline of incremental decoding."""

import keras
from keras import ops

from keras_yoso import _validation
from keras_yoso.layers.attention_registry import register_attention


@keras.saving.register_keras_serializable(package="keras_yoso")
@register_attention("softmax")
class CachedMultiHeadAttention(keras.layers.MultiHeadAttention):
    """`keras.layers.MultiHeadAttention` that also decodes incrementally with a key/value cache.

    Without `cache` it is MultiHeadAttention. With `cache = layer.init_cache(batch_size,
    max_length)` and `output, cache = layer(x, x, cache=cache, cache_update_index=index)`, the
    T new positions of `x` (starting at position `index`) are projected, written into the cache
    at [index, index + T), and attend with softmax to every cached position <= their own (and
    valid: padded new positions, by `query_mask`/`value_mask`, never become keys). The cache is
    {"key": `[B, max_length, heads, key_dim]`, "value": `[B, max_length, heads, value_dim]`,
    "valid": `[B, max_length]`} in the compute dtype (valid: float32), fixed shapes like keras-hub's
    CachedMultiHeadAttention: itemsize * B * max_length * heads * (key_dim + value_dim) + 4 * B *
    max_length bytes. Each decoded token costs O(max_length) and the memory grows with the
    context that `max_length` must cover (the contrast with the constant states of YosoAttention
    and LinearRelativeAttention).
    """

    def init_cache(self, batch_size, max_length=None):
        """Zeros of the cache shapes above (`max_length`: the longest context to decode; required, the
        key/value cache grows with the context)."""
        batch_size = _validation.integer(batch_size, "batch_size", 1)
        if max_length is None:
            raise ValueError("init_cache of softmax attention (CachedMultiHeadAttention) needs `max_length`: its "
                             "key/value cache grows with the context. Received None.")
        max_length = _validation.integer(max_length, "max_length", 1)
        value_dim = self._value_dim or self._key_dim
        dtype = self.compute_dtype
        return {
            "key": ops.zeros((batch_size, max_length, self._num_heads, self._key_dim), dtype),
            "value": ops.zeros((batch_size, max_length, self._num_heads, value_dim), dtype),
            "valid": ops.zeros((batch_size, max_length), "float32"),
        }

    def call(self, query, value, key=None, query_mask=None, value_mask=None, key_mask=None, attention_mask=None,
             return_attention_scores=False, training=None, use_causal_mask=False, cache=None,
             cache_update_index=None, **kwargs):
        if cache is None:
            if cache_update_index is not None:
                raise ValueError("CachedMultiHeadAttention received `cache_update_index` without `cache`.")
            return super().call(query, value, key=key, query_mask=query_mask, value_mask=value_mask,
                                key_mask=key_mask, attention_mask=attention_mask,
                                return_attention_scores=return_attention_scores, training=training,
                                use_causal_mask=use_causal_mask, **kwargs)
        if cache_update_index is None:
            raise ValueError("CachedMultiHeadAttention called with `cache` needs `cache_update_index` (the "
                             "position of the first `query` row). Received None.")
        if attention_mask is not None or return_attention_scores:
            raise ValueError("CachedMultiHeadAttention called with `cache` takes no attention_mask and returns "
                             "no attention scores.")
        index = ops.cast(ops.reshape(ops.convert_to_tensor(cache_update_index), ()), "int32")
        length = ops.shape(query)[1]
        max_length = ops.shape(cache["key"])[1]
        new_valid = ops.ones(ops.shape(query)[:2], "float32")
        for mask in (value_mask, key_mask):
            if mask is not None:
                new_valid = new_valid * ops.cast(ops.convert_to_tensor(mask), "float32")
        keys = ops.slice_update(cache["key"], (0, index, 0, 0), ops.cast(self._key_dense(value if key is None
                                                                                         else key), cache["key"].dtype))
        values = ops.slice_update(cache["value"], (0, index, 0, 0),
                                  ops.cast(self._value_dense(value), cache["value"].dtype))
        valid = ops.slice_update(cache["valid"], (0, index), new_valid)
        positions = index + ops.arange(length, dtype="int32")
        allowed = ops.less_equal(ops.arange(max_length, dtype="int32")[None, :], positions[:, None])  # [T, L]
        allowed = ops.logical_and(allowed[None], ops.greater(valid, 0.0)[:, None, :])
        out, _ = self._compute_attention(self._query_dense(query), keys, values, attention_mask=allowed,
                                         training=training)
        out = self._output_dense(out)
        if query_mask is not None:
            out = ops.where(ops.convert_to_tensor(query_mask)[:, :, None], out, ops.zeros((), out.dtype))
        return out, {"key": keys, "value": values, "valid": valid}
