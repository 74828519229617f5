"""A Transformer encoder block whose self-attention is YOSO, softmax or another keras_yoso attention."""

import keras

from keras_yoso import _validation
from keras_yoso.layers.attention_registry import attention_class


@keras.saving.register_keras_serializable(package="keras_yoso")
class TransformerEncoderBlock(keras.layers.Layer):
    """Transformer encoder block: self-attention and a feed-forward network, each with a residual.

    Post-LN (`normalize_first=False`, Vaswani et al. 2017):
        x = LN(x + Dropout(Attention(x, x)));  y = LN(x + Dropout(FFN(x)))
    Pre-LN (`normalize_first=True`):
        x = x + Dropout(Attention(LN(x), LN(x)));  y = x + Dropout(FFN(LN(x)))
    with FFN(x) = Dense(hidden)(activation(Dense(intermediate_dim)(x))).

    Causal (decoder) blocks: with `causal=True` the attention is causal
    (`use_causal_mask=True`: position i sees positions <= i) and the block
    decodes incrementally: `cache = block.init_cache(batch_size, max_length)`
    and `outputs, cache = block(x, cache=cache, cache_update_index=index)`
    run the T new positions of `x` (starting at `index`) through the
    attention's state (`init_cache` of YosoAttention / LinearRelativeAttention,
    constant size; a growing [max_length] key/value cache for softmax,
    `CachedMultiHeadAttention`), equal to the full causal forward at those
    positions. `max_length` is only used by softmax attention.

    Padding masks (the Keras mask of `inputs`, e.g. from
    `Embedding(mask_zero=True)`, or `padding_mask`) are passed to the attention
    as `query_mask`/`value_mask`, so the outputs at unpadded positions never
    depend on the content of padded positions; the mask is propagated to the
    output.

    Args:
        num_heads: Number of attention heads.
        intermediate_dim: Width of the feed-forward hidden layer.
        attention: "yoso" (`keras_yoso.layers.YosoAttention`), "softmax"
            (`keras.layers.MultiHeadAttention`, as its subclass
            `CachedMultiHeadAttention`) or "linear_relative"
            (`keras_yoso.layers.LinearRelativeAttention`, bidirectional unless
            attention_kwargs sets `causal=True`).
        attention_kwargs: Extra constructor arguments of the attention layer
            (e.g. `num_hashes`, `hash_code_len`, `conv_window`, `key_dim`).
            `key_dim` defaults to hidden // num_heads (then num_heads must
            divide the input width). A missing `seed` is
            drawn at construction and stored here, so a reloaded block hashes
            (YOSO) exactly as the original.
        dropout: Dropout rate after the attention and after the feed-forward
            network (the attention's own dropout is set in attention_kwargs).
        normalize_first: False for post-LN, True for pre-LN (keras-hub's
            `TransformerEncoder` argument of the same name).
        norm_first: The former name of `normalize_first`, still accepted (as
            a keyword), so configs saved with it load.
        activation: Activation of the feed-forward hidden layer.
        layer_norm_epsilon: Epsilon of the layer normalizations.
        causal: If True, causal self-attention (a decoder block without
            cross-attention) that can decode with a cache.

    Call arguments:
        inputs: `(B, T, hidden)` tensor.
        padding_mask: Optional `(B, T)` mask (True or nonzero keeps a position).
            Defaults to the Keras mask of `inputs` (`mask`, filled in by Keras).
        training: Whether dropout (and YOSO's fresh hashing) is active.
        cache: Optional decoding state (`init_cache`; causal blocks only).
        cache_update_index: Position of the first row of `inputs` (with `cache`).

    Returns:
        `(B, T, hidden)` tensor; with `cache`, `(outputs, cache)`.
    """

    def __init__(
        self,
        num_heads,
        intermediate_dim,
        attention="yoso",
        attention_kwargs=None,
        dropout=0.1,
        normalize_first=False,
        activation="gelu",
        layer_norm_epsilon=1e-5,
        causal=False,
        **kwargs,
    ):
        num_heads = _validation.integer(num_heads, "num_heads", 1, layer=True)
        intermediate_dim = _validation.integer(intermediate_dim, "intermediate_dim", 1, layer=True)
        dropout = _validation.fraction(dropout, "dropout")
        if attention_kwargs is not None and not isinstance(attention_kwargs, dict):
            raise ValueError("Received an invalid value for argument `attention_kwargs`: expected a dict or "
                             f"None. Received: attention_kwargs={attention_kwargs!r}")
        self._attention_class = attention_class(attention)
        normalize_first = _validation.boolean(normalize_first, "normalize_first", layer=True)
        if "norm_first" in kwargs:  # the former name, in the configs saved before the rename
            norm_first = _validation.boolean(kwargs.pop("norm_first"), "norm_first", layer=True)
            if normalize_first and not norm_first:
                raise ValueError("Received both `normalize_first` and its former name `norm_first`, with different "
                                 f"values: pass `normalize_first` only. Received: normalize_first={normalize_first}, "
                                 f"norm_first={norm_first}")
            normalize_first = norm_first
        super().__init__(**kwargs)
        self.supports_masking = True
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.attention = attention
        self.attention_kwargs = dict(attention_kwargs or {})
        # Every attention class takes `seed`; resolved now and kept in get_config, so a reloaded
        # block hashes (YOSO) and drops out as the original.
        self.attention_kwargs["seed"] = _validation.resolve_seed(self.attention_kwargs.get("seed"),
                                                                 "attention_kwargs['seed']")
        self.dropout = float(dropout)
        self.normalize_first = normalize_first
        self.activation = keras.activations.get(activation)
        self.layer_norm_epsilon = layer_norm_epsilon
        self.causal = _validation.boolean(causal, "causal", layer=True)

    def build(self, input_shape):
        hidden = input_shape[-1]
        if hidden is None:
            raise ValueError(f"The last dimension of the inputs must be known, got shape {tuple(input_shape)}")
        attention_kwargs = dict(self.attention_kwargs)
        if "key_dim" not in attention_kwargs:
            if hidden % self.num_heads:
                raise ValueError(f"Received an invalid value for argument `num_heads`: expected a divisor of the "
                                 f"input width {hidden} (each head gets width // num_heads features), or pass "
                                 "attention_kwargs={'key_dim': ...}. Received: "
                                 f"num_heads={self.num_heads}")
            attention_kwargs["key_dim"] = hidden // self.num_heads
        self._attention_layer = self._attention_class(
            num_heads=self.num_heads, dtype=self.dtype_policy, name="self_attention", **attention_kwargs)
        self._attention_layer.build(input_shape, input_shape)
        # Seeded from the attention seed: the masks then come from the dropouts' SeedGenerator states on
        # every backend (unseeded, PyTorch draws them from its global generator, which no checkpoint holds).
        seed = self.attention_kwargs.get("seed")
        dropout_seeds = (None, None) if seed is None else (_validation.derived_seed(seed, 1),
                                                           _validation.derived_seed(seed, 2))
        self._attention_dropout = keras.layers.Dropout(self.dropout, seed=dropout_seeds[0], dtype=self.dtype_policy)
        self._attention_norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name="attention_norm")
        self._attention_norm.build(input_shape)
        self._intermediate_dense = keras.layers.Dense(
            self.intermediate_dim, activation=self.activation, dtype=self.dtype_policy, name="intermediate")
        self._intermediate_dense.build(input_shape)
        self._output_dense = keras.layers.Dense(hidden, dtype=self.dtype_policy, name="output")
        self._output_dense.build(tuple(input_shape[:-1]) + (self.intermediate_dim,))
        self._output_dropout = keras.layers.Dropout(self.dropout, seed=dropout_seeds[1], dtype=self.dtype_policy)
        self._output_norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name="output_norm")
        self._output_norm.build(input_shape)

    @property
    def attention_layer(self):
        return self._attention_layer

    def __call__(self, *args, **kwargs):
        # Checked before Keras converts the arrays: on JAX and PyTorch a string input or mask would fail
        # there with a message that names no argument.
        inputs = kwargs.get("inputs", args[0] if args else None)
        if inputs is not None:
            _validation.layer_input_dtype(inputs, "inputs")
        padding_mask = kwargs.get("padding_mask", args[1] if len(args) > 1 else None)
        if padding_mask is not None:
            _validation.mask_dtype(padding_mask, "padding_mask", layer=True)
        return super().__call__(*args, **kwargs)

    def init_cache(self, batch_size, max_length=None):
        """The decoding state of the attention (causal blocks): constant-size for "yoso" and
        "linear_relative"; for "softmax" a `max_length` key/value cache (max_length required)."""
        if not self.causal:
            raise ValueError("TransformerEncoderBlock.init_cache needs a causal block: construct it with "
                             "causal=True.")
        return self._attention_layer.init_cache(batch_size, max_length)

    def call(self, inputs, padding_mask=None, training=None, mask=None, cache=None, cache_update_index=None):
        if padding_mask is None:
            padding_mask = mask  # Keras fills `mask` with the implicit mask of `inputs`, on every backend
        if cache is not None and not self.causal:
            raise ValueError("TransformerEncoderBlock received `cache`, but decoding needs a causal block "
                             "(causal=True).")
        x = inputs
        residual = x
        if self.normalize_first:
            x = self._attention_norm(x)
        if cache is not None:
            x, cache = self._attention_layer(x, x, query_mask=padding_mask, value_mask=padding_mask,
                                             training=training, use_causal_mask=True, cache=cache,
                                             cache_update_index=cache_update_index)
        elif self.causal:
            x = self._attention_layer(x, x, query_mask=padding_mask, value_mask=padding_mask, training=training,
                                      use_causal_mask=True)
        else:
            x = self._attention_layer(x, x, query_mask=padding_mask, value_mask=padding_mask, training=training)
        x = residual + self._attention_dropout(x, training=training)
        if not self.normalize_first:
            x = self._attention_norm(x)
        residual = x
        if self.normalize_first:
            x = self._output_norm(x)
        x = self._output_dense(self._intermediate_dense(x))
        x = residual + self._output_dropout(x, training=training)
        if not self.normalize_first:
            x = self._output_norm(x)
        if cache is not None:
            return x, cache
        return x

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = {
            "num_heads": self.num_heads,
            "intermediate_dim": self.intermediate_dim,
            "attention": self.attention,
            "attention_kwargs": self.attention_kwargs,
            "dropout": self.dropout,
            "normalize_first": self.normalize_first,
            "activation": keras.activations.serialize(self.activation),
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "causal": self.causal,
        }
        return {**super().get_config(), **config}
