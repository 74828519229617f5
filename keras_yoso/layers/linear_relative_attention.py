"""Scaleformer multi-head attention: kernelized attention with relative positions in O(L).

Paper: Favier & Dal'Maz Silva, "Scaleformer: linear complexity kernelized
attention with relative positional encoding", 2022.
"""

import keras
from keras import ops

from keras_yoso import _validation
from keras_yoso import ops as yoso_ops
from keras_yoso.layers.attention_registry import register_attention
from keras_yoso.layers.multi_head_attention_base import MultiHeadAttentionBase
from keras_yoso.layers.multi_head_attention_base import flatten_heads
from keras_yoso.layers.multi_head_attention_base import repeat_heads
from keras_yoso.layers.multi_head_attention_base import unflatten_heads


@keras.saving.register_keras_serializable(package="keras_yoso")
@register_attention("linear_relative")
class LinearRelativeAttention(MultiHeadAttentionBase):
    """Multi-head linear attention with Shaw relative positions (Scaleformer), O(L) in length.

    A drop-in replacement for `keras.layers.MultiHeadAttention` (same
    projections, call signature and masking conventions) whose per-head
    attention is `keras_yoso.ops.linear_relative_attention` (eq. 9-11): with
    phi(x) = elu(x) + 1 and r(i, j) = clip(j - i, -horizon, horizon) + horizon,

        S_ij  = <phi(Q_i), phi(K_j)> + <phi(Q_i), phi(RP_r(i,j))>
        out_i = sum_j S_ij V_j / (sum_j S_ij + epsilon)

    where RP are trainable relative position embeddings of shape
    `(num_heads, 2 * horizon + 1, key_dim)` (or `(2 * horizon + 1, key_dim)`
    with `share_relative_embeddings=True`). Time and memory are linear in the
    sequence lengths in every mode (causal or not, self or cross attention),
    and there are no absolute positions: a model built at one length runs at
    any other.

    Masks. Padding masks only: Keras implicit masks of `query`/`value`/`key`,
    or `query_mask`/`value_mask`/`key_mask`. Padded keys are dropped from both
    sums (their content cannot change any output); padded queries output zero
    before the output projection (so the layer output there is the projection
    bias). An `attention_mask` is accepted only when it is a padding mask
    (`query_mask[:, :, None] & key_mask[:, None, :]`); any other pattern
    raises (ValueError eagerly, InvalidArgumentError inside a `tf.function`;
    under XLA, where that check cannot run, any `attention_mask` raises ValueError).
    For causal attention use `causal=True` or `use_causal_mask=True`.

    Incremental decoding (keras-hub style, causal only). `cache = layer.init_cache(batch_size)`
    holds a constant-size state; `output, cache = layer(x, x, cache=cache, cache_update_index=n)`
    with `x` of shape `(B, T, dim)` the next T >= 1 positions n .. n+T-1 (a prefill chunk or one
    token) returns the rows n .. n+T-1 of the causal forward over the whole sequence and the
    updated state (same shapes), also inside compiled loops. Positions must be fed in order, each
    once: the state is a sum over them (no ring buffer to overwrite). See `init_cache`.

    Precision. The attention core runs in float32 whatever the compute dtype;
    projections run in the compute dtype and the output has the compute dtype.

    Args:
        num_heads: Number of attention heads.
        key_dim: Size of each attention head for query and key.
        value_dim: Size of each attention head for value. Defaults to `key_dim`.
        horizon: k >= 1, the distance beyond which relative positions are
            clipped (2k + 1 embeddings), or None for plain linear attention
            (no relative term, no embedding weight).
        causal: Default for `use_causal_mask`: if True, query i attends only to
            keys j <= i (top-left aligned when the lengths differ).
        share_relative_embeddings: If True, one `(2k + 1, key_dim)` table is
            shared by all heads.
        epsilon: > 0, added to the denominator; rows without keys output 0.
        chunk_size: Rows per chunk of the causal prefix sums and of the
            relative band (None: 64). Results do not depend on it.
        dropout: Dropout rate applied to each head's attention output (the
            attention matrix is never formed, so it cannot be dropped).
        use_bias: Whether the projections use bias vectors.
        output_shape: The expected shape of the output, besides the batch and
            sequence dims. Defaults to the query's last dimension.
        kernel_initializer: Initializer for projection kernels and the
            relative position embeddings.
        bias_initializer: Initializer for projection biases.
        kernel_regularizer: Regularizer for projection kernels and the
            relative position embeddings.
        bias_regularizer: Regularizer for projection biases.
        activity_regularizer: Regularizer for the projection outputs.
        kernel_constraint: Constraint for projection kernels and the relative
            position embeddings.
        bias_constraint: Constraint for projection biases.
        seed: Optional int seeding the dropout.
        use_gate, attention_axes, flash_attention, sliding_window:
            MultiHeadAttention's, as `MultiHeadAttentionBase` documents them.

    Call arguments:
        query: Query tensor of shape `(B, T, dim)`.
        value: Value tensor of shape `(B, S, dim)`.
        key: Optional key tensor of shape `(B, S, dim)`; defaults to `value`.
        query_mask: Optional `(B, T)` padding mask of the queries (True or
            nonzero keeps a position). Defaults to the Keras mask of `query`.
        value_mask: Optional `(B, S)` padding mask of the values/keys.
            Defaults to the Keras mask of `value`.
        key_mask: Optional `(B, S)` padding mask of the keys, combined with
            `value_mask` (logical and). Defaults to the Keras mask of `key`.
        attention_mask: Optional `(B, T, S)` boolean mask; must be a padding
            mask (see above).
        training: Whether to apply dropout.
        use_causal_mask: None (use the constructor's `causal`), True or False.
        cache: Optional decoding state from `init_cache` or a previous call;
            then `value` is `query` (self-attention over the new positions),
            `key` and `attention_mask` are not allowed and the attention is
            causal (a non-causal layer or `use_causal_mask=False` raises).
        cache_update_index: With `cache`: the position (int or scalar int
            tensor) of the first `query` row in the sequence.

    Returns:
        attention_output: `(B, T, E)`, E the query's last dimension or
            `output_shape`. With `cache`: `(attention_output, cache)`.
    """

    _padding_only_reason = ("Linear attention never forms the [target_length, source_length] attention matrix "
                            "(only causal masking is built in: use_causal_mask=True)")

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        horizon=16,
        causal=False,
        share_relative_embeddings=False,
        epsilon=_validation.LINEAR_RELATIVE_EPSILON,
        chunk_size=None,
        **kwargs,
    ):
        self._horizon = _validation.integer(horizon, "horizon", 1, allow_none=True, layer=True)
        self._causal = _validation.boolean(causal, "causal", layer=True)
        self._share_relative_embeddings = _validation.boolean(share_relative_embeddings, "share_relative_embeddings",
                                                              layer=True)
        self._epsilon = _validation.positive_float(epsilon, "epsilon", layer=True)
        self._chunk_size = _validation.integer(chunk_size, "chunk_size", 1, allow_none=True, layer=True)
        super().__init__(num_heads, key_dim, value_dim=value_dim, **kwargs)
        self.supports_jit = True

    @property
    def horizon(self):
        return self._horizon

    @property
    def causal(self):
        return self._causal

    @property
    def share_relative_embeddings(self):
        return self._share_relative_embeddings

    @property
    def epsilon(self):
        return self._epsilon

    @property
    def chunk_size(self):
        return self._chunk_size

    @property
    def relative_embeddings(self):
        """The `(num_heads, 2k + 1, key_dim)` (or shared `(2k + 1, key_dim)`) weight, or None."""
        return self._relative_embeddings

    def get_config(self):
        config = {
            "horizon": self._horizon,
            "causal": self._causal,
            "share_relative_embeddings": self._share_relative_embeddings,
            "epsilon": self._epsilon,
            "chunk_size": self._chunk_size,
        }
        return {**super().get_config(), **config}

    def _build_attention(self, query_shape, value_shape):
        """Creates the relative position embeddings."""
        self._relative_embeddings = None
        if self._horizon is None:
            return
        shape = (2 * self._horizon + 1, self._key_dim)
        if not self._share_relative_embeddings:
            shape = (self._num_heads,) + shape
        self._relative_embeddings = self.add_weight(
            name="relative_embeddings", shape=shape, initializer=self._fresh_kernel_initializer(),
            regularizer=self._kernel_regularizer, constraint=self._kernel_constraint, trainable=True)

    def _check_call_options(self, return_attention_scores, use_causal_mask):
        _validation.boolean(use_causal_mask, "use_causal_mask", layer=True, allow_none=True)
        if return_attention_scores:
            raise ValueError("LinearRelativeAttention does not return attention scores: linear attention "
                             "never forms the [target_length, source_length] matrix.")

    def _flat_relative_embeddings(self, batch):
        """The float32 relative embeddings as the op takes them: shared `[2k+1, d]`, or per head
        `[B * heads, 2k+1, d]` (row b * heads + h like flatten_heads); None without a horizon."""
        if self._relative_embeddings is None:
            return None
        relative = ops.cast(ops.convert_to_tensor(self._relative_embeddings), "float32")
        if self._share_relative_embeddings:
            return relative
        return ops.reshape(ops.tile(relative[None], (batch, 1, 1, 1)), (-1, 2 * self._horizon + 1, self._key_dim))

    def _causal_by_default(self, cache):
        """use_causal_mask=None takes the constructor's `causal` (with or without a cache)."""
        return self._causal

    def _attend(self, heads, masks, training, causal, cache=None, index=None):
        if cache is not None:
            return self._decode(heads, masks, cache)
        (query_heads, key_heads, value_heads), (query_mask, key_mask) = heads, masks
        batch = ops.shape(query_heads)[0]
        out = yoso_ops.linear_relative_attention(
            flatten_heads(query_heads), flatten_heads(key_heads), flatten_heads(value_heads),
            relative_embeddings=self._flat_relative_embeddings(batch), horizon=self._horizon, causal=causal,
            query_mask=repeat_heads(query_mask, self._num_heads), key_mask=repeat_heads(key_mask, self._num_heads),
            epsilon=self._epsilon, chunk_size=self._chunk_size)
        return unflatten_heads(out, batch, self._num_heads), None

    # ------------------------------------------------------------------ incremental decoding

    def init_cache(self, batch_size, max_length=None):
        """The decoding state of `batch_size` sequences before any position: a dict of float32 zeros.

        With phi(x) = elu(x) + 1, k = `horizon` and [V_j, 1] a value row with the denominator's
        all-ones column appended (eq. 10), after positions 0 .. n-1 of each sequence it holds:

        - "kernel_state" `(batch_size, num_heads, key_dim, value_dim + 1)`:
          sum_j phi(K_j) (x) [V_j, 1] (the prefix sum of eq. 8, last column the denominator);
        - with a horizon, "window" `(batch_size, num_heads, horizon, value_dim + 1)`: [V_j, 1] of
          the last k positions n - k .. n - 1, oldest first (zeros before position 0);
        - with a horizon, "before_window" `(batch_size, num_heads, value_dim + 1)`: sum of
          [V_j, 1] over the positions j < n - k, all at clipped relative row 0 (eq. 11).

        The shapes do not depend on n: the cache takes
        `4 * batch_size * num_heads * (value_dim + 1) * (key_dim + horizon + 1)` bytes, or
        `4 * batch_size * num_heads * (value_dim + 1) * key_dim` with `horizon=None`. It needs no
        built layer (shapes come from the constructor arguments).

        Args:
            batch_size: Python int >= 1.
            max_length: accepted for the keras-hub contract and not used (the state does not grow).

        Returns:
            The dict above, to pass as `cache` with `cache_update_index=0`.
        """
        batch_size = _validation.integer(batch_size, "batch_size", 1, layer=True)
        _validation.integer(max_length, "max_length", 1, allow_none=True, layer=True)
        return yoso_ops.linear_relative_decoding_state((batch_size, self._num_heads), self._key_dim,
                                                              self._value_dim, self._horizon)

    def _check_cache(self, cache, batch_size):
        """The per-sequence shapes of the cache entries by name (`[heads, ...]` left out); ValueError naming
        `cache` unless it has the names and shapes of `init_cache(batch_size)`."""
        shapes = {name: tuple(state.shape[1:]) for name, state in yoso_ops.linear_relative_decoding_state(
            (1,), self._key_dim, self._value_dim, self._horizon).items()}
        if not isinstance(cache, dict) or set(cache) != set(shapes):
            got = sorted(cache) if isinstance(cache, dict) else type(cache).__name__
            raise ValueError(f"`cache` must be the dict of `init_cache(batch_size)`, with the entries "
                             f"{sorted(shapes)}; received {got}")
        for name, shape in shapes.items():
            want = (batch_size, self._num_heads) + shape
            got = _validation.static_shape(cache[name])
            if got is None or len(got) != len(want) or any(
                    w is not None and g is not None and w != g for w, g in zip(want, got)):
                raise ValueError(f"`cache[{name!r}]` must have shape {want} (the shape `init_cache(batch_size)` "
                                 f"gives for num_heads={self._num_heads}, key_dim={self._key_dim}, value_dim="
                                 f"{self._value_dim}, horizon={self._horizon}); received "
                                 f"{None if got is None else tuple(got)}")
        return shapes

    def _decode(self, heads, masks, cache):
        """One decoding call: `linear_relative_attention_step` per head on the flattened cache. The
        position of the first new row is not needed: relative positions depend only on distances,
        and the cache's window always holds the latest positions."""
        (query_heads, key_heads, value_heads), (query_mask, key_mask) = heads, masks
        batch = ops.shape(query_heads)[0]
        shapes = self._check_cache(cache, _validation.static_shape(query_heads)[0])
        # [B, heads, ...] -> [B * heads, ...], row b * heads + h like flatten_heads.
        state = {name: ops.reshape(tensor, (-1,) + shapes[name]) for name, tensor in cache.items()}
        out, state = yoso_ops.linear_relative_attention_step(
            flatten_heads(query_heads), flatten_heads(key_heads), flatten_heads(value_heads), state,
            relative_embeddings=self._flat_relative_embeddings(batch), horizon=self._horizon,
            query_mask=repeat_heads(query_mask, self._num_heads), key_mask=repeat_heads(key_mask, self._num_heads),
            epsilon=self._epsilon, chunk_size=self._chunk_size)
        cache = {name: ops.reshape(tensor, (-1, self._num_heads) + shapes[name]) for name, tensor in state.items()}
        return unflatten_heads(out, batch, self._num_heads), cache
