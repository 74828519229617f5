"""Exact local attention: softmax over a band of positions, the part of a layer that `YosoAttention`'s
`local_window` adds beside YOSO (the sliding window LoLCATs, Zhang et al. 2025, keeps beside its linear
attention). Composite only (`keras.ops`, every backend, jit-compilable): O(N * window) time and memory, with
a written-out gradient that keeps less of the band for the backward pass than autodiff would."""

from keras import ops

from keras_yoso import _backend
from keras_yoso import _validation
from keras_yoso.ops.composite import local as composite


def local_attention(query, key, value, window, query_mask=None, key_mask=None, causal=False, key_offset=0):
    """Softmax attention of each query over the keys within `window` positions of it.

    Query i sits at position `key_offset + i`, key j at position j; query i attends key j when
    |key_offset + i - j| < window (2 window - 1 keys, `keras.layers.MultiHeadAttention(sliding_window=window)`'s
    band) and, with `causal=True`, j <= key_offset + i (window keys), with weights softmax_j(<q_i, k_j> /
    sqrt(d)) over the unmasked keys it attends. A query with no such key, and every masked query, outputs 0.

    Args:
        query: `[B, T, d]` float. key: `[B, S, d]` float. value: `[B, S, e]` float.
        window: int >= 1, the band's half-width plus one (1: each query attends its own position only).
        query_mask, key_mask: optional `[B, T]`, `[B, S]` padding masks (True or nonzero keeps a position).
        causal: whether query i attends no key after its own position.
        key_offset: int >= 0, the position of the first query (decoding: the number of kept keys before it).

    Returns:
        `[B, T, e]` float32. Differentiable in query, key and value, by a written-out gradient
        (`composite.local.local_attention_gradients`) that needs only the band's `[B, T, 2 window - 1]` scores
        from the forward pass, where autodiff keeps about five such tensors per layer: for the converted
        all-MiniLM-L6-v2 (6 layers, 12 heads, window 64) at 8 x 2,048 tokens, a JAX training step's buffers fell
        from 11.2 to 8.7 GB (docs/benchmarks.md, "Training memory").
    """
    window = _validation.integer(window, "window", 1)
    causal = _validation.boolean(causal, "causal")
    key_offset = _validation.integer(key_offset, "key_offset", 0)
    query, key, value, query_mask, key_mask = _validation.dense_attention_inputs(query, key, value, query_mask,
                                                                                 key_mask)
    f32 = lambda x: ops.cast(x, "float32")  # noqa: E731

    @ops.custom_gradient
    def attention(q, k, v):
        def grad(*args, upstream=None):
            d_out = ops.cast(_backend.upstream_gradient(args, upstream), "float32")
            return composite.local_attention_gradients(q, k, v, window, query_mask, key_mask, causal, key_offset,
                                                       d_out)

        return composite.local_attention(q, k, v, window, query_mask, key_mask, causal, key_offset), grad

    return attention(f32(query), f32(key), f32(value))
