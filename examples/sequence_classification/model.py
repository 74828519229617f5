"""The LRA classifier of YOSO's appendix Table 4: token + learned position embedding -> `num_layers`
pre-LN `keras_yoso.TransformerEncoderBlock`s -> final LayerNorm -> masked mean pooling ->
Dense(ffn_dim, relu) -> Dense(num_classes, softmax)."""

import keras

import keras_yoso

from .tokenizers import PAD_ID


# keras.layers.Embedding's default initializer draws uniformly in +-0.05.
_EMBEDDING_INIT_LIMIT = 0.05


def encoder_attention(args):
    """(attention, attention_kwargs) of `TransformerEncoderBlock` for `--attention`."""
    if args.attention == "yoso":
        return "yoso", {"num_hashes": args.num_hashes, "hash_code_len": args.hash_code_len,
                        "conv_window": args.conv_window, "backward": args.backward}
    if args.attention == "yoso_e":
        return "yoso", {"hash_code_len": args.hash_code_len, "use_expectation": True}
    return args.attention, {}


@keras.saving.register_keras_serializable(package="keras_yoso_examples")
class TokenAndPositionEmbedding(keras.layers.Layer):
    """Token embedding plus a learned embedding of the position, masking padding (id 0).

    `scale` s: the output is s * (token + position embedding) with both tables initialized
    uniform in +-0.05 / s, so the initial outputs are those of Keras' default Embedding for any s,
    while Adam (whose steps do not depend on the gradient's scale) moves the outputs s times
    faster: the embeddings' learning rate is s times the model's.
    """

    def __init__(self, vocab_size, max_length, output_dim, scale=1.0, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.max_length = max_length
        self.output_dim = output_dim
        self.scale = float(scale)
        limit = _EMBEDDING_INIT_LIMIT / self.scale
        self.token_embedding = keras.layers.Embedding(
            vocab_size, output_dim, embeddings_initializer=keras.initializers.RandomUniform(-limit, limit),
            name="token_embedding")
        self.position_embedding = keras.layers.Embedding(
            max_length, output_dim, embeddings_initializer=keras.initializers.RandomUniform(-limit, limit),
            name="position_embedding")

    def build(self, input_shape):
        self.token_embedding.build(input_shape)
        self.position_embedding.build((input_shape[-1],))

    def call(self, token_ids):
        # Eagerly, an id outside [0, vocab_size) raises ValueError (JAX's Embedding would give NaN);
        # inside compiled fit/predict nothing is checked (the tokenizers give ids in range).
        keras_yoso.check_token_ids(token_ids, self.vocab_size)
        positions = keras.ops.arange(keras.ops.shape(token_ids)[-1])
        return self.scale * (self.token_embedding(token_ids) + self.position_embedding(positions)[None])

    def compute_mask(self, token_ids, mask=None):
        return keras.ops.not_equal(token_ids, PAD_ID)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.output_dim,)

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "max_length": self.max_length,
                "output_dim": self.output_dim, "scale": self.scale}


@keras.saving.register_keras_serializable(package="keras_yoso_examples")
class MaskedMeanPooling(keras.layers.Layer):
    """`[batch, length, dim]` -> `[batch, dim]`: the mean over unmasked positions; zeros when there are none."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def call(self, inputs, mask=None):
        if mask is None:
            return keras.ops.mean(inputs, axis=1)
        weights = keras.ops.cast(mask, inputs.dtype)[:, :, None]
        count = keras.ops.maximum(keras.ops.sum(weights, axis=1), 1.0)  # an empty text pools to zeros, not NaN
        return keras.ops.sum(inputs * weights, axis=1) / count

    def compute_mask(self, inputs, mask=None):
        return None

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[2])


def build_classifier(vocab_size, num_classes, args):
    """token ids `[batch, length]` (int32, 0 = padding) -> class probabilities `[batch, num_classes]`."""
    attention, attention_kwargs = encoder_attention(args)
    token_ids = keras.Input((None,), dtype="int32", name="token_ids")
    x = TokenAndPositionEmbedding(vocab_size, args.max_length, args.hidden_dim, scale=args.embedding_scale,
                                  name="embedding")(token_ids)
    x = keras.layers.Dropout(args.dropout, seed=args.seed)(x)  # seeded: on PyTorch, unseeded masks are not resumable
    if attention == "none":  # the pooling-only baseline: per-token features, no token sees another
        x = keras.layers.Dense(args.ffn_dim, activation="gelu", name="token_features")(x)
    for i in range(args.num_layers if attention != "none" else 0):
        x = keras_yoso.TransformerEncoderBlock(
            args.num_heads, args.ffn_dim, attention=attention,
            attention_kwargs={**attention_kwargs, "seed": args.seed * 1000 + i + 1},
            dropout=args.dropout, normalize_first=True, name=f"encoder_{i}")(x)
    x = keras.layers.LayerNormalization(epsilon=1e-5, name="final_norm")(x)
    x = MaskedMeanPooling(name="masked_mean")(x)
    x = keras.layers.Dense(args.ffn_dim, activation="relu", name="classifier_hidden")(x)
    probabilities = keras.layers.Dense(num_classes, activation="softmax", name="probabilities")(x)
    return keras.Model(token_ids, probabilities, name="lra_classifier")
