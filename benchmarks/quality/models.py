"""The models of the quality benchmark: identical for every attention, only the attention layer changes.

Causal tasks (mqar, lm), after the Zoology setup (Arora et al. 2023):

    token embedding E (width d, Keras' default init; no position embedding: the causal short
    convolution gives local order)
    -> `layers` x [ x = x + ShortConv(LN(x)); x = x + Attn(LN(x))  (+ lm: x = x + MLP(LN(x))) ]
       (--short-conv attention_input: x = x + Attn(ShortConv(LN(x))) instead; see CausalBlock)
    -> final LN -> logits = h E^T + b (output projection tied to the embedding E, as in Zoology)

  mqar: no MLP, logits only at the query positions (the hidden states are gathered first: a
  vocabulary-wide projection at every position would dominate the CPU time).
  lm: MLP Dense(2d, gelu) -> Dense(d) in every block, logits at every position.

Bidirectional classification (listops, imdb, tags), the LRA classifier of YOSO's appendix Table 4
that examples/sequence_classification/ builds (its TokenAndPositionEmbedding and
MaskedMeanPooling are reused), with `EncoderBlock` in place of keras_yoso.TransformerEncoderBlock
so that any registered attention fits:

    token + learned position embedding -> dropout -> `layers` pre-LN blocks
    [ x = x + Dropout(Attn(LN(x))); x = x + Dropout(FFN(LN(x))) ], FFN = Dense(ffn, gelu) -> Dense(d)
    -> final LN -> masked mean pooling -> Dense(ffn, relu) -> Dense(classes) logits
"""

import keras
from keras import ops

from attentions import build_attention


class ShortConv(keras.layers.Layer):
    """Causal depthwise 1-D convolution along the sequence: y_t = b + sum_{i < kernel} w_i * x_{t-i}
    (zeros before position 0), one filter of length `kernel` per channel. [B, T, d] -> [B, T, d]."""

    def __init__(self, kernel=4, **kwargs):
        super().__init__(**kwargs)
        self.kernel = kernel

    def build(self, input_shape):
        self.w = self.add_weight(name="kernel", shape=(self.kernel, input_shape[-1]),
                                 initializer=keras.initializers.RandomUniform(-0.5, 0.5))
        self.b = self.add_weight(name="bias", shape=(input_shape[-1],), initializer="zeros")

    def call(self, x):
        length = ops.shape(x)[1]
        padded = ops.pad(x, ((0, 0), (self.kernel - 1, 0), (0, 0)))
        # tap i reads x_{t-i}: the slice starting at kernel - 1 - i
        return self.b + sum(self.w[i] * padded[:, self.kernel - 1 - i:self.kernel - 1 - i + length]
                            for i in range(self.kernel))


class CausalBlock(keras.layers.Layer):
    """One causal block, `short_conv` = "residual" (default: the short convolution is a sequence mixer
    with its own residual branch):
        x = x + ShortConv(LN(x));  x = x + Attn(LN(x))  [; x = x + MLP(LN(x))]
    or "attention_input" (the convolution only feeds the attention, like Zoology's Hybrid mixer of a
    short convolution followed by attention inside one residual branch):
        x = x + Attn(ShortConv(LN(x)))  [; x = x + MLP(LN(x))]
    MLP: Dense(mlp_dim, gelu) -> Dense(d), only when mlp_dim is given (lm).

    Why "residual" is the default: on MQAR (length 64, 4 pairs, width 64, 2 layers, batch 64, jax, one
    seed each) softmax attention learned far faster with it: vocab 8192, lr 1e-2, 300 steps: training
    accuracy 0.94 against 0.18; vocab 256, lr 3e-3: 0.98 after 300 steps against 0.24 after 800 (there
    it picks one of the 4 values in context without matching the key)."""

    def __init__(self, attention, mlp_dim=None, short_conv="residual", **kwargs):
        super().__init__(**kwargs)
        if short_conv not in ("residual", "attention_input"):
            raise ValueError(f"short_conv must be 'residual' or 'attention_input', got {short_conv!r}")
        self.attention, self.mlp_dim, self.short_conv = attention, mlp_dim, short_conv

    def build(self, input_shape):
        self.conv_norm = keras.layers.LayerNormalization(epsilon=1e-5, name="conv_norm")
        self.conv = ShortConv(4, name="short_conv")
        self.attention_norm = keras.layers.LayerNormalization(epsilon=1e-5, name="attention_norm")
        for layer in (self.conv_norm, self.conv, self.attention_norm, self.attention):
            layer.build(input_shape)
        if self.mlp_dim:
            self.mlp_norm = keras.layers.LayerNormalization(epsilon=1e-5, name="mlp_norm")
            self.mlp_norm.build(input_shape)
            self.mlp_in = keras.layers.Dense(self.mlp_dim, activation="gelu", name="mlp_in")
            self.mlp_in.build(input_shape)
            self.mlp_out = keras.layers.Dense(input_shape[-1], name="mlp_out")
            self.mlp_out.build(tuple(input_shape[:-1]) + (self.mlp_dim,))

    def compute_output_shape(self, input_shape, *args, **kwargs):
        return tuple(input_shape)

    def call(self, x, training=None):
        if self.short_conv == "residual":
            x = x + self.conv(self.conv_norm(x))
            x = x + self.attention(self.attention_norm(x), training=training)
        else:
            x = x + self.attention(self.conv(self.conv_norm(x)), training=training)
        if self.mlp_dim:
            x = x + self.mlp_out(self.mlp_in(self.mlp_norm(x)))
        return x


def _attention(args, name, kwargs, causal, index, length):
    """The attention of block `index` (seeded from --seed and the block)."""
    return build_attention(name, args.heads, args.width // args.heads, causal, length,
                           seed=args.seed * 1000 + index + 1, **kwargs)


class CausalModel(keras.Model):
    """Token embedding E [vocab, d] -> `layers` CausalBlocks -> final LN -> logits h E^T + b (the output
    projection tied to the embedding, as Zoology's models do).

    With `query_positions` P (mqar): inputs [tokens [B, T] int32, positions [B, P] int32] -> logits
    [B, P, vocab] at those positions only (hidden states gathered before the projection); without (lm):
    tokens [B, T] -> logits [B, T, vocab]."""

    def __init__(self, attentions, vocab, width, mlp_dim=None, query_positions=None, short_conv="residual", **kwargs):
        super().__init__(**kwargs)
        self.query_positions = query_positions
        self.embedding = keras.layers.Embedding(vocab, width, name="embedding")
        self.blocks = [CausalBlock(attention, mlp_dim, short_conv, name=f"block_{i}")
                       for i, attention in enumerate(attentions)]
        self.final_norm = keras.layers.LayerNormalization(epsilon=1e-5, name="final_norm")
        self.logit_bias = self.add_weight(name="logit_bias", shape=(vocab,), initializer="zeros")

    def call(self, inputs, training=None):
        tokens, positions = inputs if self.query_positions else (inputs, None)
        x = self.embedding(tokens)
        for block in self.blocks:
            x = block(x, training=training)
        if positions is not None:
            x = ops.take_along_axis(x, ops.cast(positions, "int32")[:, :, None], axis=1)
        x = self.final_norm(x)
        return ops.matmul(x, ops.transpose(self.embedding.embeddings)) + self.logit_bias


def build_causal_model(args, name, kwargs, vocab, length, query_positions):
    """The CausalModel of --task mqar (`query_positions` P, no MLP) or lm (None, MLP of 2 * width); Keras
    builds it on the first training batch."""
    attentions = [_attention(args, name, kwargs, True, i, length) for i in range(args.layers)]
    return CausalModel(attentions, vocab, args.width, None if query_positions else 2 * args.width, query_positions,
                       args.short_conv, name=f"{'mqar' if query_positions else 'lm'}_{name}")


class EncoderBlock(keras.layers.Layer):
    """Pre-LN Transformer encoder block around any registered attention (keras_yoso's
    TransformerEncoderBlock with normalize_first=True, which only takes its own attentions):
    x = x + Dropout(Attn(LN(x), padding_mask)); x = x + Dropout(FFN(LN(x)))."""

    def __init__(self, attention, ffn_dim, dropout, seed, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True
        self.attention, self.ffn_dim, self.dropout, self.seed = attention, ffn_dim, dropout, seed

    def build(self, input_shape):
        self.norm1 = keras.layers.LayerNormalization(epsilon=1e-5, name="attention_norm")
        self.norm2 = keras.layers.LayerNormalization(epsilon=1e-5, name="ffn_norm")
        for layer in (self.norm1, self.norm2, self.attention):
            layer.build(input_shape)
        self.ffn_in = keras.layers.Dense(self.ffn_dim, activation="gelu", name="ffn_in")
        self.ffn_in.build(input_shape)
        self.ffn_out = keras.layers.Dense(input_shape[-1], name="ffn_out")
        self.ffn_out.build(tuple(input_shape[:-1]) + (self.ffn_dim,))
        self.drop1 = keras.layers.Dropout(self.dropout, seed=self.seed)
        self.drop2 = keras.layers.Dropout(self.dropout, seed=self.seed + 1)

    def compute_output_shape(self, input_shape, *args, **kwargs):
        return tuple(input_shape)

    def call(self, x, mask=None, training=None):
        x = x + self.drop1(self.attention(self.norm1(x), padding_mask=mask, training=training), training=training)
        return x + self.drop2(self.ffn_out(self.ffn_in(self.norm2(x))), training=training)

    def compute_mask(self, x, mask=None):
        return mask


def build_classifier(args, name, kwargs, vocab, num_classes, max_length):
    """token ids [B, T] (0 = padding, T <= max_length) -> class logits [B, num_classes]."""
    from sequence_classification.model import MaskedMeanPooling, TokenAndPositionEmbedding

    tokens = keras.Input((None,), dtype="int32", name="token_ids")
    x = TokenAndPositionEmbedding(vocab, max_length, args.width, name="embedding")(tokens)
    x = keras.layers.Dropout(args.dropout, seed=args.seed)(x)
    for i in range(args.layers):
        x = EncoderBlock(_attention(args, name, kwargs, False, i, max_length), args.ffn_dim, args.dropout,
                         seed=args.seed * 1000 + 100 + 2 * i, name=f"encoder_{i}")(x)
    x = keras.layers.LayerNormalization(epsilon=1e-5, name="final_norm")(x)
    x = MaskedMeanPooling(name="masked_mean")(x)
    x = keras.layers.Dense(args.ffn_dim, activation="relu", name="classifier_hidden")(x)
    logits = keras.layers.Dense(num_classes, name="logits")(x)
    return keras.Model(tokens, logits, name=f"classifier_{name}")
