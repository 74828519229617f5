"""What keras_yoso's attention layers share with `keras.layers.MultiHeadAttention`.

The projections, constructor arguments, `get_config`, masks and output
projection of MultiHeadAttention, with the attention core left to subclasses
(`_attend`). Subclasses compute their core in float32 on `[B * heads, N, dim]`
tensors.
"""

import numbers

import keras
import numpy as np
import tensorflow as tf
from keras import constraints
from keras import initializers
from keras import regularizers

from keras_yoso.ops.yoso import _in_xla_context

_OUTPUT_LETTERS = "opqrsuvwxyz"


def check_int(value, name, low, high=None, allow_none=False):
    """`value` as an int in [low, high], or None when allowed; else ValueError naming `name`."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low or (
            high is not None and value > high):
        expected = f"an integer in [{low}, {high}]" if high is not None else (
            "a positive integer" if low == 1 else f"an integer >= {low}")
        if allow_none:
            expected += " or None"
        raise ValueError(f"Received an invalid value for argument `{name}`: expected {expected}. "
                         f"Received: {name}={value!r}")
    return int(value)


def check_choice(value, name, choices):
    if value not in choices:
        raise ValueError(f"Received an invalid value for argument `{name}`: expected one of {choices}. "
                         f"Received: {name}={value!r}")
    return value


def check_bool(value, name):
    """`value` as a Python bool (NumPy bools included, as the ops accept them); else ValueError."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"Received an invalid value for argument `{name}`: expected a bool. "
                         f"Received: {name}={value!r}")
    return bool(value)


def _bool_mask(mask):
    if mask is None:
        return None
    mask = tf.convert_to_tensor(mask)
    if mask.dtype != tf.bool:
        mask = tf.not_equal(mask, tf.zeros([], mask.dtype))
    return mask


def _zero_padded_rows(x, mask):
    """`x` [B, N, features] with the rows where `mask` [B, N] is False set to 0 (NaN and Inf too)."""
    return tf.where(mask[:, :, None], x, tf.zeros([], x.dtype))


def _keras_mask(x):
    """The implicit Keras mask attached to `x` (e.g. by `Embedding(mask_zero=True)`), or None."""
    return getattr(x, "_keras_mask", None)


def _merge_masks(*masks):
    merged = None
    for mask in masks:
        if mask is not None:
            merged = mask if merged is None else tf.logical_and(merged, mask)
    return merged


def flatten_heads(x):
    """[B, N, heads, D] -> [B * heads, N, D] (row b * heads + h)."""
    shape = tf.shape(x)
    x = tf.transpose(x, [0, 2, 1, 3])
    return tf.reshape(x, [shape[0] * shape[2], shape[1], x.shape[-1]])


def unflatten_heads(x, batch, num_heads):
    """[B * heads, N, D] -> [B, N, heads, D]."""
    shape = tf.shape(x)
    x = tf.reshape(x, [batch, num_heads, shape[1], x.shape[-1]])
    return tf.transpose(x, [0, 2, 1, 3])


class MultiHeadAttentionBase(keras.layers.Layer):
    """Base of keras_yoso's attention layers: MultiHeadAttention's projections, masks and config.

    Subclasses implement `_attend(query_heads, key_heads, value_heads, query_mask,
    key_mask, training, use_causal_mask)` on float32 `[B, N, heads, dim]` heads
    (padded keys and values already zeroed) and return `[B, T, heads, value_dim]`.
    `_padding_only_reason` is the sentence that explains why an arbitrary
    `attention_mask` cannot be honoured.
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
        **kwargs,
    ):
        self._num_heads = check_int(num_heads, "num_heads", 1)
        self._key_dim = check_int(key_dim, "key_dim", 1)
        value_dim = check_int(value_dim, "value_dim", 1, allow_none=True)
        self._value_dim = self._key_dim if value_dim is None else value_dim
        if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) or not 0.0 <= dropout < 1.0:
            raise ValueError("Received an invalid value for argument `dropout`: expected a float in [0, 1). "
                             f"Received: dropout={dropout!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
            raise ValueError(f"Received an invalid value for argument `seed`: expected an integer or None. "
                             f"Received: seed={seed!r}")
        if output_shape is not None and not isinstance(output_shape, (list, tuple)):
            output_shape = (output_shape,)
        if output_shape is not None:
            output_shape = tuple(output_shape)
            if not output_shape or not all(
                    isinstance(d, numbers.Integral) and not isinstance(d, bool) and d > 0 for d in output_shape):
                raise ValueError("Received an invalid value for argument `output_shape`: expected a positive "
                                 f"int or a non-empty tuple of positive ints. Received: output_shape={output_shape!r}")
            output_shape = tuple(int(d) for d in output_shape)
        super().__init__(**kwargs)
        self.supports_masking = True
        self._dropout = float(dropout)
        self._use_bias = use_bias
        self._output_shape = output_shape
        self._kernel_initializer = initializers.get(kernel_initializer)
        self._bias_initializer = initializers.get(bias_initializer)
        self._kernel_regularizer = regularizers.get(kernel_regularizer)
        self._bias_regularizer = regularizers.get(bias_regularizer)
        self._activity_regularizer = regularizers.get(activity_regularizer)
        self._kernel_constraint = constraints.get(kernel_constraint)
        self._bias_constraint = constraints.get(bias_constraint)
        self.seed = None if seed is None else int(seed)
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

    def _projection(self, head_dim, name):
        return keras.layers.EinsumDense(
            "btd,dnh->btnh", output_shape=(None, self._num_heads, head_dim),
            bias_axes="nh" if self._use_bias else None, name=name, **self._sublayer_kwargs())

    def _check_shapes(self, query_shape, value_shape, key_shape):
        name = type(self).__name__
        for arg, shape in (("query", query_shape), ("value", value_shape), ("key", key_shape)):
            if len(shape) != 3:
                raise ValueError(f"{name} expects `{arg}` of shape (batch, length, features), "
                                 f"got shape {tuple(shape)}")
            if shape[-1] is None:
                raise ValueError(f"The last dimension of `{arg}` must be known, got shape {tuple(shape)}")
        if tuple(value_shape[:-1]) != tuple(key_shape[:-1]) and not any(
                a is None or b is None for a, b in zip(value_shape[:-1], key_shape[:-1])):
            raise ValueError("All dimensions of `value` and `key`, except the last one, must be equal. "
                             f"Received: value_shape={tuple(value_shape)} and key_shape={tuple(key_shape)}")

    def build(self, query_shape, value_shape, key_shape=None):
        """Creates the query/key/value/output projections (and the subclass weights)."""
        key_shape = value_shape if key_shape is None else key_shape
        self._check_shapes(query_shape, value_shape, key_shape)
        self._query_dense = self._projection(self._key_dim, "query")
        self._query_dense.build(query_shape)
        self._key_dense = self._projection(self._key_dim, "key")
        self._key_dense.build(key_shape)
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

    def _padding_masks_from_attention_mask(self, attention_mask, batch, query_length, key_length):
        """Splits a padding `[B, T, S]` attention mask into query and key masks, or raises.

        A padding mask is `query_pad[:, :, None] & key_pad[:, None, :]` (a key mask
        broadcast over every row is the case query_pad = all true).
        """
        name = type(self).__name__
        attention_mask = _bool_mask(attention_mask)
        if attention_mask.shape.rank != 3:
            raise ValueError(f"{name} accepts `attention_mask` only of shape [batch, target_length, "
                             f"source_length] (a padding mask). Received shape {attention_mask.shape}")
        attention_mask = tf.broadcast_to(attention_mask, tf.stack([batch, query_length, key_length]))
        query_pad = tf.reduce_any(attention_mask, axis=2)
        key_pad = tf.reduce_any(attention_mask, axis=1)
        is_padding = tf.reduce_all(tf.equal(
            attention_mask, tf.logical_and(query_pad[:, :, None], key_pad[:, None, :])))
        message = (f"{name} received an `attention_mask` that is not a padding mask. "
                   f"{self._padding_only_reason}, so it can only express masks of the form "
                   "query_mask[:, :, None] & key_mask[:, None, :]. Pass `query_mask`, `value_mask` and/or "
                   "`key_mask` ([batch, length] padding masks) instead.")
        if tf.executing_eagerly():
            if not bool(is_padding):
                raise ValueError(message)
            return query_pad, key_pad
        if _in_xla_context():
            # XLA compiles tf.debugging.Assert to nothing: a causal or banded mask would then be
            # silently read as padding. Refuse at trace time instead.
            raise ValueError(f"{name} cannot check under XLA (jit_compile=True) that `attention_mask` is a "
                             "padding mask. Pass `query_mask`, `value_mask` and/or `key_mask` ([batch, length] "
                             "padding masks) instead, or compile without XLA.")
        with tf.control_dependencies([tf.debugging.Assert(is_padding, [message])]):
            return tf.identity(query_pad), tf.identity(key_pad)

    def _check_call_options(self, return_attention_scores, use_causal_mask):
        """Raises for call options the subclass cannot honour."""

    def _attend(self, query_heads, key_heads, value_heads, query_mask, key_mask, training, use_causal_mask):
        raise NotImplementedError

    def _attention_scores(self, query_heads, key_heads, query_mask, key_mask):
        """`[B, heads, T, S]` float32 attention weights, for subclasses that allow return_attention_scores."""
        raise NotImplementedError

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
    ):
        self._check_call_options(return_attention_scores, use_causal_mask)
        key_is_value = key is None
        if key_is_value:
            key = value
        query_mask = _bool_mask(query_mask if query_mask is not None else _keras_mask(query))
        value_mask = _bool_mask(value_mask if value_mask is not None else _keras_mask(value))
        key_mask = _bool_mask(key_mask if key_mask is not None else _keras_mask(key))
        # Masks are handled here: the projections get mask-free copies (no warning, the
        # caller's tensors keep their masks).
        query, value, key = tf.identity(query), tf.identity(value), tf.identity(key)

        batch = tf.shape(query)[0]
        query_length, key_length = tf.shape(query)[1], tf.shape(value)[1]
        if attention_mask is not None:
            # Keras then does not pick XLA for `jit_compile="auto"` (see _padding_masks_from_attention_mask).
            self.supports_jit = False
            query_pad, key_pad = self._padding_masks_from_attention_mask(
                attention_mask, batch, query_length, key_length)
            query_mask = _merge_masks(query_mask, query_pad)
            key_mask = _merge_masks(key_mask, key_pad)
        key_mask = _merge_masks(value_mask, key_mask)
        if query_mask is None:
            query_mask = tf.ones(tf.stack([batch, query_length]), tf.bool)
        if key_mask is None:
            key_mask = tf.ones(tf.stack([batch, key_length]), tf.bool)

        # Padded rows are zeroed before the projections (tf.where, not a product), so their content,
        # even NaN or Inf, reaches no output and no gradient (of the weights either).
        query = _zero_padded_rows(query, query_mask)
        value = _zero_padded_rows(value, key_mask)
        key = value if key_is_value else _zero_padded_rows(key, key_mask)
        # [B, N, heads, dim], then the attention core in float32.
        query_heads = tf.cast(self._query_dense(query), tf.float32)
        key_heads = tf.cast(self._key_dense(key), tf.float32)
        value_heads = tf.cast(self._value_dense(value), tf.float32)
        # Padded keys/values have bias-only projections: zero them too.
        key_heads = tf.where(key_mask[:, :, None, None], key_heads, 0.0)
        value_heads = tf.where(key_mask[:, :, None, None], value_heads, 0.0)

        out = self._attend(query_heads, key_heads, value_heads, query_mask, key_mask, training, use_causal_mask)
        out = tf.where(query_mask[:, :, None, None], out, tf.zeros([], out.dtype))
        out = tf.cast(out, self.compute_dtype)
        if self._dropout_layer is not None:
            out = self._dropout_layer(out, training=training)
        output = self._output_dense(out)
        output._keras_mask = query_mask
        if return_attention_scores:
            scores = self._attention_scores(query_heads, key_heads, query_mask, key_mask)
            return output, tf.cast(scores, self.compute_dtype)
        return output

    def compute_output_shape(self, query_shape, value_shape, key_shape=None):
        key_shape = value_shape if key_shape is None else key_shape
        self._check_shapes(query_shape, value_shape, key_shape)
        return tuple(query_shape[:-1]) + (self._output_shape or (query_shape[-1],))

    def compute_output_spec(
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
    ):
        self._check_call_options(return_attention_scores, use_causal_mask)
        output_shape = self.compute_output_shape(query.shape, value.shape, None if key is None else key.shape)
        output = keras.KerasTensor(output_shape, dtype=self.compute_dtype)
        if return_attention_scores:
            scores_shape = (query.shape[0], self._num_heads, query.shape[1], value.shape[1])
            return output, keras.KerasTensor(scores_shape, dtype=self.compute_dtype)
        return output
