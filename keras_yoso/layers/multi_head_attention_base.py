"""What keras_yoso's attention layers share with `keras.layers.MultiHeadAttention`.

The projections, constructor arguments, `get_config`, masks, input checks and output
projection of MultiHeadAttention, with the attention core left to subclasses (`_attend`).
Subclasses compute their core in float32 on `[B, N, heads, dim]` heads. Written in `keras.ops`:
the layers run on TensorFlow, JAX and torch.
"""

import math

import keras
from keras import constraints
from keras import initializers
from keras import ops
from keras import regularizers

from keras_yoso import _validation
from keras_yoso.layers import _contract

_OUTPUT_LETTERS = "opqrsuvwxyz"


def _zero_padded_rows(x, mask):
    """`x` [B, N, features] with the rows where `mask` [B, N] is False set to 0 (NaN and Inf too).

    Also a copy: the projections never see the caller's tensors (nor their Keras masks)."""
    return ops.where(mask[:, :, None], x, ops.zeros((), x.dtype))


def _merge_masks(*masks):
    merged = None
    for mask in masks:
        if mask is not None:
            merged = mask if merged is None else ops.logical_and(merged, mask)
    return merged


def flatten_heads(x):
    """[B, N, heads, D] -> [B * heads, N, D] (row b * heads + h)."""
    batch, length, heads, dim = ops.shape(x)
    return ops.reshape(ops.transpose(x, (0, 2, 1, 3)), (batch * heads, length, dim))


def unflatten_heads(x, batch, num_heads):
    """[B * heads, N, D] -> [B, N, heads, D]."""
    length, dim = ops.shape(x)[1], ops.shape(x)[2]
    return ops.transpose(ops.reshape(x, (batch, num_heads, length, dim)), (0, 2, 1, 3))


def repeat_heads(mask, num_heads):
    """[B, N] -> [B * heads, N], row b * heads + h like flatten_heads."""
    return ops.repeat(mask, num_heads, axis=0)


def l2_normalize(x):
    """x / max(||x||, 1e-6) over the last axis (an all-zero row stays zero), as tf.math.l2_normalize."""
    return x * ops.rsqrt(ops.maximum(ops.sum(x * x, axis=-1, keepdims=True), 1e-12))


class MultiHeadAttentionBase(keras.layers.Layer):
    """Base of keras_yoso's attention layers: MultiHeadAttention's projections, masks and config.

    A variant takes MultiHeadAttention's constructor arguments through `**kwargs` (they are
    declared once, here) and implements one method:

        _attend(heads, masks, training, causal, cache=None, index=None) -> (out, cache)

    heads = (query, key, value) float32 `[B, N, num_heads, dim]` (padded keys and values already
    zeroed), masks = (query_mask `[B, T]`, key_mask `[B, S]`) bool, causal a Python bool (query i
    attends to keys j <= i), and for incremental decoding (keras-hub style) `cache`, the layer's
    state (a dict of named tensors from `init_cache(batch_size, max_length=None)`), with `index`,
    the int32 position of the first new row; out is `[B, T, num_heads, value_dim]` and cache the
    new state (None without one). `call(query, value, cache=, cache_update_index=)` then returns
    `(output, cache)`. Optional: `_build_attention` (the variant's weights), `_check_call_options`,
    `_attention_scores`, `_causal_by_default` and `_padding_only_reason`, the sentence that explains
    why an arbitrary `attention_mask` cannot be honoured.

    MultiHeadAttention's arguments, as every variant takes them (besides num_heads, key_dim,
    value_dim, dropout, use_bias, output_shape, the initializers, regularizers and constraints,
    and seed):
        use_gate: the gated output: the heads are multiplied by sigmoid(query W_g + b_g) (the
            sublayer "gate", created where MultiHeadAttention creates it, so its weights load)
            before the output projection.
        attention_axes: for inputs `(B, *dims, F)`, the axes of dims to attend over (default:
            all; negative ones count from the inputs' rank). They are flattened into one sequence
            (row-major) and the other axes join the batch; masks `(B, *dims)` follow; scores come
            as `(B, *other dims, num_heads, *query axes, *value axes)`. Decoding (`cache`) and
            `attention_mask` take `(B, length, F)` inputs only.
        flash_attention: accepted; it changes nothing here (no softmax matrix is formed). True
            refuses `dropout > 0` and `return_attention_scores=True`, as MultiHeadAttention does.
        sliding_window: must be None: a banded mask is not a padding mask (ValueError otherwise;
            use MultiHeadAttention for it).
    """

    _padding_only_reason = "This attention never forms the [target_length, source_length] attention matrix"

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        dropout=0.0,
        use_bias=True,
        output_shape=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        activity_regularizer=None,
        kernel_constraint=None,
        bias_constraint=None,
        seed=None,
        flash_attention=None,
        sliding_window=None,
        use_gate=False,
        attention_axes=None,
        **kwargs,
    ):
        self._num_heads = _validation.integer(num_heads, "num_heads", 1, layer=True)
        self._key_dim = _validation.integer(key_dim, "key_dim", 1, layer=True)
        value_dim = _validation.integer(value_dim, "value_dim", 1, allow_none=True, layer=True)
        self._value_dim = self._key_dim if value_dim is None else value_dim
        dropout = _validation.fraction(dropout, "dropout")
        seed = _validation.optional_seed(seed)
        output_shape = _validation.output_shape(output_shape)
        # MultiHeadAttention's flash_attention picks a fused softmax kernel; this attention forms no
        # softmax matrix, so the flag changes nothing. It is accepted, with MultiHeadAttention's two
        # refusals when it is True, so code written for MultiHeadAttention behaves the same.
        self._flash_attention = bool(_validation.boolean(flash_attention, "flash_attention", layer=True,
                                                         allow_none=True))
        if self._flash_attention and dropout > 0.0:
            raise ValueError("Dropout is not supported when flash attention is enabled. Please set dropout to 0.0 "
                             "to use flash attention.")
        if sliding_window is not None:
            raise ValueError(f"{type(self).__name__} does not support `sliding_window`: a band of "
                             f"2 * sliding_window - 1 keys is not a padding mask. {self._padding_only_reason}, so it "
                             "can only leave out whole positions (padding masks; see docs/errors.md). Use "
                             "keras.layers.MultiHeadAttention(sliding_window=...) for banded attention. Received: "
                             f"sliding_window={sliding_window!r}")
        super().__init__(**kwargs)
        self.supports_masking = True
        self._dropout = dropout
        self._use_bias = use_bias
        self._use_gate = _validation.boolean(use_gate, "use_gate", layer=True)
        self._attention_axes = _contract.attention_axes_argument(attention_axes)
        self._output_shape = output_shape
        self._kernel_initializer = initializers.get(kernel_initializer)
        self._bias_initializer = initializers.get(bias_initializer)
        self._kernel_regularizer = regularizers.get(kernel_regularizer)
        self._bias_regularizer = regularizers.get(bias_regularizer)
        self._activity_regularizer = regularizers.get(activity_regularizer)
        self._kernel_constraint = constraints.get(kernel_constraint)
        self._bias_constraint = constraints.get(bias_constraint)
        self.seed = seed
        self._dropout_layer = (keras.layers.Dropout(self._dropout, seed=self.seed, dtype=self.dtype_policy)
                               if self._dropout > 0.0 else None)

    @property
    def num_heads(self):
        return self._num_heads

    @property
    def key_dim(self):
        return self._key_dim

    @property
    def value_dim(self):
        return self._value_dim

    @property
    def dropout(self):
        return self._dropout

    @property
    def use_bias(self):
        return self._use_bias

    @property
    def query_dense(self):
        return self._query_dense

    @property
    def key_dense(self):
        return self._key_dense

    @property
    def value_dense(self):
        return self._value_dense

    @property
    def output_dense(self):
        return self._output_dense

    def get_config(self):
        config = {
            "num_heads": self._num_heads,
            "key_dim": self._key_dim,
            "value_dim": self._value_dim,
            "dropout": self._dropout,
            "use_bias": self._use_bias,
            "use_gate": self._use_gate,
            "attention_axes": self._attention_axes,
            "output_shape": self._output_shape,
            "kernel_initializer": initializers.serialize(self._kernel_initializer),
            "bias_initializer": initializers.serialize(self._bias_initializer),
            "kernel_regularizer": regularizers.serialize(self._kernel_regularizer),
            "bias_regularizer": regularizers.serialize(self._bias_regularizer),
            "activity_regularizer": regularizers.serialize(self._activity_regularizer),
            "kernel_constraint": constraints.serialize(self._kernel_constraint),
            "bias_constraint": constraints.serialize(self._bias_constraint),
            "seed": self.seed,
        }
        return {**super().get_config(), **config}

    def _fresh_kernel_initializer(self):
        # A fresh instance per weight: a shared stateless initializer would repeat values.
        return self._kernel_initializer.__class__.from_config(self._kernel_initializer.get_config())

    def _sublayer_kwargs(self):
        return dict(
            kernel_initializer=self._fresh_kernel_initializer(),
            bias_initializer=self._bias_initializer.__class__.from_config(self._bias_initializer.get_config()),
            kernel_regularizer=self._kernel_regularizer,
            bias_regularizer=self._bias_regularizer,
            activity_regularizer=self._activity_regularizer,
            kernel_constraint=self._kernel_constraint,
            bias_constraint=self._bias_constraint,
            dtype=self.dtype_policy,
        )

    def _projection(self, head_dim, name, activation=None):
        return keras.layers.EinsumDense(
            "btd,dnh->btnh", output_shape=(None, self._num_heads, head_dim), activation=activation,
            bias_axes="nh" if self._use_bias else None, name=name, **self._sublayer_kwargs())

    # ------------------------------------------------------------------ input checks (layers/_contract.py)

    def _check_shapes(self, query_shape, value_shape, key_shape, sequences=False):
        """The rank and feature checks of build and of calls (`_contract.check_shapes`); a subclass adds
        its own here."""
        _contract.check_shapes(type(self).__name__, self._attention_axes, query_shape, value_shape, key_shape,
                               sequences)

    def _check_call_shapes(self, query, value, key, masks, attention_mask):
        """Every shape check of a call on `(batch, length, features)` inputs; returns the run-time assertions."""
        shape = _validation.static_shape
        self._check_shapes(shape(query), shape(value), shape(key), sequences=True)
        return _contract.check_call_shapes(type(self).__name__, self._num_heads, query, value, key, masks,
                                           attention_mask)

    def build(self, query_shape, value_shape, key_shape=None):
        """Creates the query/key/value/output projections (and the subclass weights)."""
        key_shape = value_shape if key_shape is None else key_shape
        self._check_shapes(query_shape, value_shape, key_shape)
        if len(query_shape) != 3:  # the projections act on the sequences the attention axes flatten to
            query_shape, value_shape, key_shape = ((None, None, shape[-1]) for shape in (query_shape, value_shape,
                                                                                        key_shape))
        self._query_dense = self._projection(self._key_dim, "query")
        self._query_dense.build(query_shape)
        self._key_dense = self._projection(self._key_dim, "key")
        self._key_dense.build(key_shape)
        if self._use_gate:  # created where MultiHeadAttention creates it, so its weights load in order
            self._gate_dense = self._projection(self._value_dim, "gate", activation="sigmoid")
            self._gate_dense.build(query_shape)
        self._value_dense = self._projection(self._value_dim, "value")
        self._value_dense.build(value_shape)
        output_shape = self._output_shape or (query_shape[-1],)
        letters = _OUTPUT_LETTERS[:len(output_shape)]
        self._output_dense = keras.layers.EinsumDense(
            f"btnh,nh{letters}->bt{letters}", output_shape=(None, *output_shape),
            bias_axes=letters if self._use_bias else None, name="attention_output", **self._sublayer_kwargs())
        self._output_dense.build((query_shape[0], query_shape[1], self._num_heads, self._value_dim))
        self._build_attention(query_shape, value_shape)

    def _build_attention(self, query_shape, value_shape):
        """Creates the weights of the attention core, if any."""

    def _check_call_options(self, return_attention_scores, use_causal_mask):
        """Raises for call options the subclass cannot honour."""

    def _causal_by_default(self, cache):
        """Whether a call with use_causal_mask=None is causal: when it decodes (a `cache` is given)."""
        return cache is not None

    def _attend(self, heads, masks, training, causal, cache=None, index=None):
        """(out `[B, T, num_heads, value_dim]`, new cache or None): the attention core (class docstring)."""
        raise NotImplementedError

    def _compute_attention(self, query, key, value, attention_mask=None, training=None,
                           return_attention_scores=False, use_causal_mask=False):
        """MultiHeadAttention's override point, for code that calls it on projected heads: query
        `[B, T, num_heads, key_dim]`, key `[B, S, num_heads, key_dim]`, value `[B, S, num_heads,
        value_dim]` -> (`[B, T, num_heads, value_dim]`, scores `[B, num_heads, T, S]` or None). An
        `attention_mask` must be a padding mask (as for `call`); `use_causal_mask` is the causal core,
        not a mask. The layer's own call does not go through it: it runs `_attend` with the masks
        kept apart, so the heads' padding never becomes a [T, S] tensor."""
        query, key, value = (ops.cast(ops.convert_to_tensor(t), "float32") for t in (query, key, value))
        batch, query_length, key_length = ops.shape(query)[0], ops.shape(query)[1], ops.shape(key)[1]
        query_mask = ops.ones((batch, query_length), "bool")
        key_mask = ops.ones((batch, key_length), "bool")
        if attention_mask is not None:
            query_mask, key_mask = self._padding_masks(attention_mask, batch, query_length, key_length)
        causal = bool(_validation.boolean(use_causal_mask, "use_causal_mask", layer=True, allow_none=True))
        key = ops.where(key_mask[:, :, None, None], key, 0.0)
        value = ops.where(key_mask[:, :, None, None], value, 0.0)
        out, _ = self._attend((query, key, value), (query_mask, key_mask), training, causal)
        out = ops.where(query_mask[:, :, None, None], out, 0.0)
        scores = self._attention_scores(query, key, query_mask, key_mask, causal) if return_attention_scores else None
        return out, scores

    def _attention_scores(self, query_heads, key_heads, query_mask, key_mask, causal):
        """`[B, heads, T, S]` float32 attention weights (zero for keys j > i when `causal`), for subclasses
        that allow return_attention_scores."""
        raise NotImplementedError

    # ------------------------------------------------------------------ incremental decoding

    def init_cache(self, batch_size, max_length=None):
        """The decoding state of `batch_size` sequences before any token, a dict of named tensors (see
        the subclass; `max_length`, the longest context, is needed by a cache that grows with it).
        Pass it to `call(..., cache=, cache_update_index=)`."""
        raise NotImplementedError(f"{type(self).__name__} does not decode incrementally")

    def _call_is_causal(self, use_causal_mask, cache):
        """The call's causality as a Python bool; a call with `cache` must be causal (ValueError)."""
        causal = self._causal_by_default(cache) if use_causal_mask is None else bool(use_causal_mask)
        if cache is not None and not causal:
            raise ValueError(f"{type(self).__name__} called with `cache` decodes causally: use_causal_mask must be "
                             "True or None with a cache (on a layer built with causal=True where it takes that "
                             f"argument). Received use_causal_mask={use_causal_mask!r}.")
        return causal

    def __call__(self, *args, **kwargs):
        # Input and mask dtypes are checked before Keras converts the call's arrays to tensors: on JAX and
        # PyTorch a string would fail there with a message that names no argument (a Python str, with
        # one that suggests passing it as a keyword).
        _contract.check_dtypes(_contract.call_arguments(self.call, args, kwargs))
        return super().__call__(*args, **kwargs)

    def _padding_masks(self, attention_mask, batch, query_length, key_length):
        """The query and key padding masks an `attention_mask` of any accepted layout holds, or raises
        (`_contract`: it must be a padding mask, the same in every head)."""
        name = type(self).__name__
        mask = _contract.three_dim_attention_mask(name, self._padding_only_reason, attention_mask)
        return _contract.padding_masks_from_attention_mask(name, self._padding_only_reason, mask, batch,
                                                           query_length, key_length)

    def _inputs_and_masks(self, query, value, key, query_mask, value_mask, key_mask, attention_mask):
        """The call's tensors after every shape check, and its bool `[B, T]` query and `[B, S]` key masks
        (value_mask & key_mask & the padding split of attention_mask; all true when absent). `key` is
        None when it is `value`."""
        query, value = ops.convert_to_tensor(query), ops.convert_to_tensor(value)
        key_tensor = value if key is None else ops.convert_to_tensor(key)
        masks = {name: _contract.bool_mask(mask) for name, mask in
                 (("query_mask", query_mask), ("value_mask", value_mask), ("key_mask", key_mask))}
        checks = self._check_call_shapes(query, value, key_tensor, masks, attention_mask)
        query, value, key_tensor = _validation.after_checks(checks, [query, value, key_tensor])
        query_mask, key_mask = masks["query_mask"], masks["key_mask"]
        batch = ops.shape(query)[0]
        query_length, key_length = ops.shape(query)[1], ops.shape(value)[1]
        if attention_mask is not None:
            query_pad, key_pad = self._padding_masks(attention_mask, batch, query_length, key_length)
            query_mask = _merge_masks(query_mask, query_pad)
            key_mask = _merge_masks(key_mask, key_pad)
        key_mask = _merge_masks(masks["value_mask"], key_mask)
        if query_mask is None:
            query_mask = ops.ones((batch, query_length), "bool")
        if key_mask is None:
            key_mask = ops.ones((batch, key_length), "bool")
        return query, value, None if key is None else key_tensor, query_mask, key_mask

    def _projected_heads(self, query, value, key, query_mask, key_mask):
        """float32 `[B, N, heads, dim]` query, key and value heads; padded rows zeroed before the
        projections (where, not a product: their content, even NaN or Inf, reaches no output and no
        gradient, of the weights either) and padded keys/values after them (bias-only rows)."""
        query = _zero_padded_rows(query, query_mask)
        value = _zero_padded_rows(value, key_mask)
        key = value if key is None else _zero_padded_rows(key, key_mask)
        query_heads = ops.cast(self._query_dense(query), "float32")
        key_heads = ops.where(key_mask[:, :, None, None], ops.cast(self._key_dense(key), "float32"), 0.0)
        value_heads = ops.where(key_mask[:, :, None, None], ops.cast(self._value_dense(value), "float32"), 0.0)
        return query_heads, key_heads, value_heads

    def call(
        self,
        query,
        value,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        training=None,
        use_causal_mask=None,
        return_attention_scores=False,
        cache=None,
        cache_update_index=None,
    ):
        rank = len(_validation.static_shape(query))
        if rank == 3 and _contract.normalized_attention_axes(self._attention_axes, 3) == (1,):
            return self._call_sequences(query, value, key, query_mask, value_mask, key_mask, attention_mask, training,
                                        use_causal_mask, return_attention_scores, cache, cache_update_index)
        return self._call_flattened(query, value, key, query_mask, value_mask, key_mask, attention_mask, training,
                                    use_causal_mask, return_attention_scores, cache)

    def _call_flattened(self, query, value, key, query_mask, value_mask, key_mask, attention_mask, training,
                        use_causal_mask, return_attention_scores, cache):
        """Attention over `attention_axes` of `(batch, *dims, features)` inputs: the other axes join the
        batch, the attention axes of the query and of the value flatten to one sequence each (row-major),
        then the sequence path runs and the output takes the query's layout back. Scores come in
        MultiHeadAttention's layout `(batch, *other dims, num_heads, *query attention dims, *value
        attention dims)`."""
        name = type(self).__name__
        if cache is not None:
            raise ValueError(f"{name} decodes (`cache`) inputs of shape (batch, length, features) only, with the "
                             "default attention_axes.")
        if attention_mask is not None:
            raise ValueError(f"{name} takes no `attention_mask` with inputs of rank > 3 or attention_axes: give the "
                             "padding as `query_mask` / `value_mask` of shape (batch, *dims) (Keras masks of the "
                             "inputs are used too).")
        shape = _validation.static_shape
        query, value = ops.convert_to_tensor(query), ops.convert_to_tensor(value)
        key = None if key is None else ops.convert_to_tensor(key)
        self._check_shapes(shape(query), shape(value), shape(value) if key is None else shape(key))
        rank = len(shape(query))
        others, axes = _contract.attention_axes_split(self._attention_axes, rank)
        order = [0, *others, *axes]
        query_sizes, value_sizes = ops.shape(query), ops.shape(value)
        broadcast = [query_sizes[0], *(query_sizes[a] for a in others), *(value_sizes[a] for a in axes)]

        def sequences(x, sizes, features=True):
            """x `(batch, *dims[, F])` -> `(batch * others, prod(attention dims)[, F])`."""
            if x is None:
                return None
            x = ops.transpose(x, order + ([rank - 1] if features else []))
            if sizes is not None:  # value-side tensors broadcast over the query's other axes
                x = ops.broadcast_to(x, tuple(sizes) + ((ops.shape(x)[-1],) if features else ()))
            length = math.prod(ops.shape(x)[1 + len(others):len(order)])
            return ops.reshape(x, (-1, length) + ((ops.shape(x)[-1],) if features else ()))

        masks = [None if m is None else _contract.bool_mask(m) for m in (query_mask, value_mask, key_mask)]
        result = self._call_sequences(
            sequences(query, None), sequences(value, broadcast), sequences(key, broadcast),
            sequences(masks[0], None, False), sequences(masks[1], broadcast, False),
            sequences(masks[2], broadcast, False), None, training, use_causal_mask, return_attention_scores,
            None, None)
        output, scores = result if return_attention_scores else (result, None)
        other_sizes = [query_sizes[a] for a in others]
        query_axes_sizes = [query_sizes[a] for a in axes]
        out_features = tuple(ops.shape(output)[2:])
        output = ops.reshape(output, (query_sizes[0], *other_sizes, *query_axes_sizes, *out_features))
        inverse = [order.index(axis) for axis in range(rank - 1)]
        output = ops.transpose(output, inverse + list(range(rank - 1, rank - 1 + len(out_features))))
        if scores is None:
            return output
        scores = ops.reshape(scores, (query_sizes[0], *other_sizes, self._num_heads, *query_axes_sizes,
                                      *(value_sizes[a] for a in axes)))
        return output, scores

    def _call_sequences(self, query, value, key, query_mask, value_mask, key_mask, attention_mask, training,
                        use_causal_mask, return_attention_scores, cache, cache_update_index):
        """The call on `(batch, length, features)` sequences."""
        if self._flash_attention and return_attention_scores:
            raise ValueError("Returning attention scores is not supported when flash attention is enabled. Please "
                             "disable flash attention to access attention scores.")
        self._check_call_options(return_attention_scores, use_causal_mask)
        index = None
        if cache is not None:
            index = _contract.check_cache_call(type(self).__name__, query, value, key, attention_mask,
                                               return_attention_scores, cache_update_index)
        elif cache_update_index is not None:
            raise ValueError(f"{type(self).__name__} received `cache_update_index` without `cache`: pass "
                             "cache=layer.init_cache(batch_size) to decode incrementally.")
        query, value, key, query_mask, key_mask = self._inputs_and_masks(
            query, value, key, query_mask, value_mask, key_mask, attention_mask)
        query_heads, key_heads, value_heads = self._projected_heads(query, value, key, query_mask, key_mask)
        causal = self._call_is_causal(use_causal_mask, cache)
        out, cache = self._attend((query_heads, key_heads, value_heads), (query_mask, key_mask), training, causal,
                                  cache=cache, index=index)
        out = ops.where(query_mask[:, :, None, None], out, 0.0)
        out = ops.cast(out, self.compute_dtype)
        if self._dropout_layer is not None:
            out = self._dropout_layer(out, training=training)
        if self._use_gate:
            # MultiHeadAttention's gated output: sigmoid(query W_g + b_g), padded query rows zeroed first.
            out = out * self._gate_dense(_zero_padded_rows(query, query_mask))
        output = self._output_dense(out)
        if cache is not None:
            return output, cache
        if return_attention_scores:
            scores = self._attention_scores(query_heads, key_heads, query_mask, key_mask, causal)
            return output, ops.cast(scores, self.compute_dtype)
        return output

    def compute_output_shape(self, query_shape, value_shape, key_shape=None):
        key_shape = value_shape if key_shape is None else key_shape
        self._check_shapes(query_shape, value_shape, key_shape)
        return tuple(query_shape[:-1]) + (self._output_shape or (query_shape[-1],))

    def compute_output_spec(self, *args, **kwargs):
        # Keras calls it with the arguments of `call`: read by its signature, which holds them once.
        arguments = _contract.call_arguments(self.call, args, kwargs)
        query, value, key = arguments["query"], arguments["value"], arguments["key"]
        use_causal_mask, cache = arguments["use_causal_mask"], arguments["cache"]
        return_attention_scores = arguments["return_attention_scores"]
        self._check_call_options(return_attention_scores, use_causal_mask)
        output_shape = self.compute_output_shape(query.shape, value.shape, None if key is None else key.shape)
        output = keras.KerasTensor(output_shape, dtype=self.compute_dtype)
        if cache is not None:
            return output, keras.tree.map_structure(lambda c: keras.KerasTensor(c.shape, dtype=c.dtype), cache)
        if return_attention_scores:
            others, axes = _contract.attention_axes_split(self._attention_axes, len(query.shape))
            scores_shape = (query.shape[0], *(query.shape[a] for a in others), self._num_heads,
                            *(query.shape[a] for a in axes), *(value.shape[a] for a in axes))
            return output, keras.KerasTensor(scores_shape, dtype=self.compute_dtype)
        return output
