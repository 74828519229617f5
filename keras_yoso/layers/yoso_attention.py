"""YOSO multi-head attention as a drop-in `keras.layers.MultiHeadAttention`.

Paper: Zeng et al., "You Only Sample (Almost) Once: Linear Cost Self-Attention
Via Bernoulli Sampling", ICML 2021.
"""

import numbers
import random

import keras
import tensorflow as tf
from keras import constraints
from keras import initializers
from keras import regularizers

from keras_yoso import ops
from keras_yoso.ops.yoso import BACKWARDS as _BACKWARDS
from keras_yoso.ops.yoso import HASH_METHODS as _HASH_METHODS
from keras_yoso.ops.yoso import IMPLEMENTATIONS as _IMPLEMENTATIONS

# yoso_cumulation's limit: 2**hash_code_len buckets of at most 2**20.
_MAX_HASH_CODE_LEN = 20
# yoso_expectation's name for the true derivative that "collision" estimates.
_EXPECTATION_BACKWARD = {"lower_bound": "lower_bound", "collision": "exact"}
_OUTPUT_LETTERS = "opqrsuvwxyz"


def _check_int(value, name, low, high=None, allow_none=False):
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


def _check_choice(value, name, choices):
    if value not in choices:
        raise ValueError(f"Received an invalid value for argument `{name}`: expected one of {choices}. "
                         f"Received: {name}={value!r}")
    return value


def _bool_mask(mask):
    if mask is None:
        return None
    mask = tf.convert_to_tensor(mask)
    if mask.dtype != tf.bool:
        mask = tf.not_equal(mask, tf.zeros([], mask.dtype))
    return mask


def _keras_mask(x):
    """The implicit Keras mask attached to `x` (e.g. by `Embedding(mask_zero=True)`), or None."""
    return getattr(x, "_keras_mask", None)


def _merge_masks(*masks):
    merged = None
    for mask in masks:
        if mask is not None:
            merged = mask if merged is None else tf.logical_and(merged, mask)
    return merged


def _flatten_heads(x):
    """[B, N, heads, D] -> [B * heads, N, D] (row b * heads + h)."""
    shape = tf.shape(x)
    x = tf.transpose(x, [0, 2, 1, 3])
    return tf.reshape(x, [shape[0] * shape[2], shape[1], x.shape[-1]])


def _unflatten_heads(x, batch, num_heads):
    """[B * heads, N, D] -> [B, N, heads, D]."""
    shape = tf.shape(x)
    x = tf.reshape(x, [batch, num_heads, shape[1], x.shape[-1]])
    return tf.transpose(x, [0, 2, 1, 3])


def _padding_masks_from_attention_mask(attention_mask, batch, query_length, key_length):
    """Splits a padding `[B, T, S]` attention mask into query and key masks, or raises.

    A padding mask is `query_pad[:, :, None] & key_pad[:, None, :]` (a key mask broadcast
    over every row is the case query_pad = all true). Any other pattern cannot be expressed
    by LSH attention, which never forms the [T, S] matrix.
    """
    attention_mask = _bool_mask(attention_mask)
    if attention_mask.shape.rank != 3:
        raise ValueError("YosoAttention accepts `attention_mask` only of shape [batch, target_length, "
                         f"source_length] (a padding mask). Received shape {attention_mask.shape}")
    attention_mask = tf.broadcast_to(attention_mask, tf.stack([batch, query_length, key_length]))
    query_pad = tf.reduce_any(attention_mask, axis=2)
    key_pad = tf.reduce_any(attention_mask, axis=1)
    is_padding = tf.reduce_all(tf.equal(
        attention_mask, tf.logical_and(query_pad[:, :, None], key_pad[:, None, :])))
    message = ("YosoAttention received an `attention_mask` that is not a padding mask. LSH attention "
               "(YOSO) never forms the [target_length, source_length] attention matrix, so it can only "
               "express masks of the form query_mask[:, :, None] & key_mask[:, None, :]. Pass "
               "`query_mask`, `value_mask` and/or `key_mask` ([batch, length] padding masks) instead; "
               "causal or arbitrary masks are not supported.")
    if tf.executing_eagerly():
        if not bool(is_padding):
            raise ValueError(message)
        return query_pad, key_pad
    with tf.control_dependencies([tf.debugging.Assert(is_padding, [message])]):
        return tf.identity(query_pad), tf.identity(key_pad)


@keras.saving.register_keras_serializable(package="keras_yoso")
class YosoAttention(keras.layers.Layer):
    """Multi-head YOSO attention: LSH Bernoulli-sampled attention in linear time.

    A drop-in replacement for `keras.layers.MultiHeadAttention` (same
    projections, call signature and masking conventions) whose attention is
    N-YOSO (paper §3.1, §4): per head, queries and keys are L2-normalized and
    hashed with `num_hashes` hyperplane LSH functions of `hash_code_len` bits;
    each query sums the values of the keys it collides with, averaged over the
    hashes (`keras_yoso.ops.yoso_cumulation`, eq. 2), so query i attends to
    key j with expected weight `(1 - arccos(<q_i, k_j>)/pi)^hash_code_len`.
    The per-head output is then L2-normalized (N-YOSO; an all-zero row stays
    zero) and, with `conv_window`, a depthwise convolution of the values is
    added (YOSO-C, §4.2). Cost is O(length * num_hashes * head size): no
    [T, S] matrix is formed, except with `use_expectation=True` (YOSO-E).

    Hash functions. With `training=True` every call draws fresh hash functions
    from a `keras.random.SeedGenerator(seed)` whose state advances each step,
    so the output is an unbiased estimate of YOSO-E across steps. With
    `training=False`/`None` the hash functions are a fixed function of `seed`
    (those of `keras_yoso.ops.hash_codes(..., seed=seed)`): the same input
    gives the same output on every call, after `get_config`/`from_config` and
    after `.keras` save/load. If `seed` is None, a random integer is drawn at
    construction and stored in `get_config`, so a reloaded layer hashes as the
    original. Queries and keys of one call always share the hash functions.

    Masks. Padding masks only: Keras implicit masks of `query`/`value`/`key`,
    or `query_mask`/`value_mask`/`key_mask`. Masked keys never contribute
    (their content cannot change any output) and masked queries output zero
    before the output projection (so the layer output there is the projection
    bias). An `attention_mask` is accepted only when it is a padding mask
    (`query_mask[:, :, None] & key_mask[:, None, :]`); any other pattern
    raises (ValueError eagerly, InvalidArgumentError inside a `tf.function`),
    since LSH attention cannot express an arbitrary [B, T, S] mask.

    Precision. The attention core (normalization, hashing, cumulation,
    convolution) runs in float32 whatever the compute dtype, like the softmax
    of `MultiHeadAttention` under mixed precision; projections run in the
    compute dtype and the output has the compute dtype.

    Args:
        num_heads: Number of attention heads.
        key_dim: Size of each attention head for query and key.
        value_dim: Size of each attention head for value. Defaults to `key_dim`.
        num_hashes: m >= 1, the number of LSH hashes averaged (YOSO-m).
        hash_code_len: tau in [1, 20], bits per hash; larger tau makes the
            attention sharper (weight `(1 - theta/pi)^tau` at angle theta).
        use_expectation: If True, compute YOSO-E, the exact expectation over
            hash functions, with O(T S) cost (`keras_yoso.ops.yoso_expectation`).
        conv_window: None or a positive int w: add a depthwise convolution of
            length w ("same" padding, one filter of shape [w] per head) of the
            masked values along the sequence to the normalized attention output
            (YOSO-C). Requires self-attention lengths (T == S).
        backward: "lower_bound" (paper eq. 4) or "collision" (*YOSO, the true
            derivative on colliding pairs) gradient estimator for queries and
            keys. With `use_expectation=True`, "collision" means the exact
            derivative of the expectation.
        hash_method: "hadamard" (fast structured projection, default) or
            "gaussian" (dense Gaussian projection) hyperplanes.
        dropout: Dropout rate applied to each head's attention output (the
            attention matrix is never formed, so it cannot be dropped).
        use_bias: Whether the projections use bias vectors.
        output_shape: The expected shape of the output, besides the batch and
            sequence dims. Defaults to the query's last dimension.
        kernel_initializer: Initializer for projection and convolution kernels.
        bias_initializer: Initializer for projection biases.
        kernel_regularizer: Regularizer for projection and convolution kernels.
        bias_regularizer: Regularizer for projection biases.
        activity_regularizer: Regularizer for the projection outputs.
        kernel_constraint: Constraint for projection and convolution kernels.
        bias_constraint: Constraint for projection biases.
        seed: Optional int seeding the hash functions and dropout (see above).
        implementation: "auto", "custom_op" or "composite", passed to
            `keras_yoso.ops`. "composite" is pure TensorFlow: it supports
            `jit_compile=True` and exports SavedModels that load without
            keras_yoso. `supports_jit` is False when the custom op is used.

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
        training: Whether to draw fresh hash functions and apply dropout.
        use_causal_mask: Must be False: LSH attention cannot be causal here
            (raises NotImplementedError).
        return_attention_scores: If True (only with `use_expectation=True`),
            also return the expected attention weights.

    Returns:
        attention_output: `(B, T, E)`, E the query's last dimension or
            `output_shape`.
        attention_scores: (only with `return_attention_scores=True`) the YOSO-E
            weights `(1 - arccos(<q_i, k_j>)/pi)^tau`, zero for masked pairs,
            of shape `(B, num_heads, T, S)`.
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        num_hashes=32,
        hash_code_len=8,
        use_expectation=False,
        conv_window=None,
        backward="lower_bound",
        hash_method="hadamard",
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
        implementation="auto",
        **kwargs,
    ):
        self._num_heads = _check_int(num_heads, "num_heads", 1)
        self._key_dim = _check_int(key_dim, "key_dim", 1)
        value_dim = _check_int(value_dim, "value_dim", 1, allow_none=True)
        self._value_dim = self._key_dim if value_dim is None else value_dim
        self._num_hashes = _check_int(num_hashes, "num_hashes", 1)
        self._hash_code_len = _check_int(hash_code_len, "hash_code_len", 1, _MAX_HASH_CODE_LEN)
        if not isinstance(use_expectation, bool):
            raise ValueError("Received an invalid value for argument `use_expectation`: expected a bool. "
                             f"Received: use_expectation={use_expectation!r}")
        self._use_expectation = use_expectation
        self._conv_window = _check_int(conv_window, "conv_window", 1, allow_none=True)
        self._backward = _check_choice(backward, "backward", _BACKWARDS)
        self._hash_method = _check_choice(hash_method, "hash_method", _HASH_METHODS)
        self._implementation = _check_choice(implementation, "implementation", _IMPLEMENTATIONS)
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
        self.supports_jit = self._use_expectation or not (
            self._implementation == "custom_op"
            or (self._implementation == "auto" and ops.custom_ops_available()))
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
        # A seed of None is resolved now and stored in get_config, so reloads hash identically.
        self.seed = int(seed) if seed is not None else random.randint(1, 2 ** 31 - 1)
        self._training_seeds = keras.random.SeedGenerator(self.seed)
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
    def num_hashes(self):
        return self._num_hashes

    @property
    def hash_code_len(self):
        return self._hash_code_len

    @property
    def use_expectation(self):
        return self._use_expectation

    @property
    def conv_window(self):
        return self._conv_window

    @property
    def dropout(self):
        return self._dropout

    @property
    def use_bias(self):
        return self._use_bias

    @property
    def implementation(self):
        return self._implementation

    def get_config(self):
        config = {
            "num_heads": self._num_heads,
            "key_dim": self._key_dim,
            "value_dim": self._value_dim,
            "num_hashes": self._num_hashes,
            "hash_code_len": self._hash_code_len,
            "use_expectation": self._use_expectation,
            "conv_window": self._conv_window,
            "backward": self._backward,
            "hash_method": self._hash_method,
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
            "implementation": self._implementation,
        }
        return {**super().get_config(), **config}

    def _sublayer_kwargs(self):
        # Fresh initializer instances per sublayer: a shared stateless initializer would repeat values.
        return dict(
            kernel_initializer=self._kernel_initializer.__class__.from_config(self._kernel_initializer.get_config()),
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
        for name, shape in (("query", query_shape), ("value", value_shape), ("key", key_shape)):
            if len(shape) != 3:
                raise ValueError(f"YosoAttention expects `{name}` of shape (batch, length, features), "
                                 f"got shape {tuple(shape)}")
            if shape[-1] is None:
                raise ValueError(f"The last dimension of `{name}` must be known, got shape {tuple(shape)}")
        if tuple(value_shape[:-1]) != tuple(key_shape[:-1]) and not any(
                a is None or b is None for a, b in zip(value_shape[:-1], key_shape[:-1])):
            raise ValueError("All dimensions of `value` and `key`, except the last one, must be equal. "
                             f"Received: value_shape={tuple(value_shape)} and key_shape={tuple(key_shape)}")
        if self._conv_window is not None and None not in (query_shape[1], value_shape[1]) and (
                query_shape[1] != value_shape[1]):
            raise ValueError(f"conv_window={self._conv_window} (YOSO-C) convolves the values along the sequence "
                             "and adds them to the outputs at the same positions, so `query` and `value` must "
                             f"have the same length. Received: query_shape={tuple(query_shape)}, "
                             f"value_shape={tuple(value_shape)}")

    def build(self, query_shape, value_shape, key_shape=None):
        """Creates the projections (and the YOSO-C filters) from the input shapes."""
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
        if self._conv_window is not None:
            self._conv_kernel = self.add_weight(
                name="conv_kernel", shape=(self._conv_window, self._num_heads),
                initializer=self._kernel_initializer.__class__.from_config(self._kernel_initializer.get_config()),
                regularizer=self._kernel_regularizer, constraint=self._kernel_constraint, trainable=True)

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

    def _check_call_options(self, return_attention_scores, use_causal_mask):
        if use_causal_mask:
            raise NotImplementedError(
                "YosoAttention does not support use_causal_mask=True: LSH (YOSO) attention sums the values "
                "of all colliding keys through shared hash buckets and cannot restrict query i to keys j <= i. "
                "Use it for bidirectional (encoder) attention.")
        if return_attention_scores and not self._use_expectation:
            raise ValueError(
                "return_attention_scores=True needs use_expectation=True: sampled YOSO attention never forms "
                "the attention matrix. Construct YosoAttention(..., use_expectation=True) to get the expected "
                "attention weights (YOSO-E).")

    def _hash_seed(self, training):
        if training:
            # [seed, step + 1]: fresh hash functions every training step, never the inference ones.
            return self._training_seeds.next() + tf.constant([0, 1], self._training_seeds.state.dtype)
        return self.seed

    def _depthwise_conv(self, value, key_mask):
        """YOSO-C term: per-head depthwise convolution of the masked values, `[B, S, heads, Dv]`."""
        value = value * tf.cast(key_mask, value.dtype)[:, :, None, None]
        batch, length = tf.shape(value)[0], tf.shape(value)[1]
        channels = self._num_heads * self._value_dim
        kernel = tf.cast(tf.convert_to_tensor(self._conv_kernel), tf.float32)
        kernel = tf.repeat(kernel, self._value_dim, axis=1)  # channel n * Dv + d uses head n's filter
        out = tf.nn.depthwise_conv2d(
            tf.reshape(value, [batch, length, 1, channels]), kernel[:, None, :, None],
            strides=[1, 1, 1, 1], padding="SAME")
        return tf.reshape(out, [batch, length, self._num_heads, self._value_dim])

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
        use_causal_mask=False,
        return_attention_scores=False,
    ):
        self._check_call_options(return_attention_scores, use_causal_mask)
        if key is None:
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
            query_pad, key_pad = _padding_masks_from_attention_mask(attention_mask, batch, query_length, key_length)
            query_mask = _merge_masks(query_mask, query_pad)
            key_mask = _merge_masks(key_mask, key_pad)
        key_mask = _merge_masks(value_mask, key_mask)
        if query_mask is None:
            query_mask = tf.ones(tf.stack([batch, query_length]), tf.bool)
        if key_mask is None:
            key_mask = tf.ones(tf.stack([batch, key_length]), tf.bool)

        # [B, N, heads, dim], then the attention core in float32.
        query_heads = tf.cast(self._query_dense(query), tf.float32)
        key_heads = tf.cast(self._key_dense(key), tf.float32)
        value_heads = tf.cast(self._value_dense(value), tf.float32)
        # Zeroing padded keys/values keeps their content (even NaN) out of every output and gradient.
        key_heads = tf.where(key_mask[:, :, None, None], key_heads, 0.0)
        value_heads = tf.where(key_mask[:, :, None, None], value_heads, 0.0)

        q = tf.math.l2_normalize(_flatten_heads(query_heads), axis=-1)  # [B * heads, T, key_dim]
        k = tf.math.l2_normalize(_flatten_heads(key_heads), axis=-1)    # [B * heads, S, key_dim]
        v = _flatten_heads(value_heads)                                  # [B * heads, S, value_dim]
        q_mask = tf.repeat(query_mask, self._num_heads, axis=0)          # row b * heads + h
        k_mask = tf.repeat(key_mask, self._num_heads, axis=0)
        if self._use_expectation:
            out = ops.yoso_expectation(q, k, v, self._hash_code_len, q_mask, k_mask,
                                       backward=_EXPECTATION_BACKWARD[self._backward],
                                       implementation=self._implementation)
        else:
            seed = self._hash_seed(training)
            query_codes = ops.hash_codes(q, self._num_hashes, self._hash_code_len, seed,
                                         method=self._hash_method, implementation=self._implementation)
            key_codes = ops.hash_codes(k, self._num_hashes, self._hash_code_len, seed,
                                       method=self._hash_method, implementation=self._implementation)
            out = ops.yoso_cumulation(q, k, v, query_codes, key_codes, self._hash_code_len, q_mask, k_mask,
                                      backward=self._backward, implementation=self._implementation)
        out = tf.math.l2_normalize(out, axis=-1)  # N-YOSO; all-zero rows stay zero
        out = _unflatten_heads(out, batch, self._num_heads)  # [B, T, heads, value_dim]
        if self._conv_window is not None:
            out = out + self._depthwise_conv(value_heads, key_mask)
        out = out * tf.cast(query_mask, out.dtype)[:, :, None, None]
        out = tf.cast(out, self.compute_dtype)
        if self._dropout_layer is not None:
            out = self._dropout_layer(out, training=training)
        output = self._output_dense(out)
        output._keras_mask = query_mask
        if return_attention_scores:
            scores = ops.yoso_expectation_weights(q, k, self._hash_code_len, q_mask, k_mask)
            scores = tf.reshape(scores, tf.stack([batch, self._num_heads, query_length, key_length]))
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
        use_causal_mask=False,
        return_attention_scores=False,
    ):
        self._check_call_options(return_attention_scores, use_causal_mask)
        output_shape = self.compute_output_shape(query.shape, value.shape, None if key is None else key.shape)
        output = keras.KerasTensor(output_shape, dtype=self.compute_dtype)
        if return_attention_scores:
            scores_shape = (query.shape[0], self._num_heads, query.shape[1], value.shape[1])
            return output, keras.KerasTensor(scores_shape, dtype=self.compute_dtype)
        return output
