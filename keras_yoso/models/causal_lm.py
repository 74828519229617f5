"""A decoder-only language model over causal TransformerEncoderBlocks, with compiled generation."""

import functools

import keras
from keras import ops

from keras_yoso import _backend
from keras_yoso import _validation
from keras_yoso.layers.transformer_encoder_block import TransformerEncoderBlock
from keras_yoso.models.token_ids import check_token_ids

SAMPLERS = ("greedy", "random")


@keras.saving.register_keras_serializable(package="keras_yoso")
class CausalLM(keras.Model):
    """Token + learned position embeddings, `num_layers` causal pre-LN blocks, a final LayerNorm and
    vocabulary logits; `generate` decodes with the blocks' caches.

    The attention of every block is `attention` ("yoso", "linear_relative" or "softmax", see
    `TransformerEncoderBlock`). Training: `model.fit` on (tokens[:, :-1], tokens[:, 1:]) with a
    sparse cross-entropy from logits. Generation (`generate`) prefills the prompt in one call and
    then decodes one token per step inside one `keras.ops.while_loop`, compiled (`jax.jit` on
    JAX, `tf.function` on TensorFlow; eager on PyTorch). The decoding state is constant-size for
    "yoso" and "linear_relative" and a `max_length` key/value cache for "softmax".

    Args:
        vocabulary_size: Number of token ids (256 for bytes).
        max_length: Longest sequence (prompt + generated tokens): the position table size.
        hidden_dim, num_layers, num_heads, intermediate_dim: Model sizes.
        attention, attention_kwargs, dropout: As in `TransformerEncoderBlock`.

    Call: `token_ids` int `[B, T]` -> float32 logits `[B, T, vocabulary_size]`.

    Token ids must be in [0, vocabulary_size). Called eagerly (`model(token_ids)`, `generate`, and
    every step of `fit`/`predict` on PyTorch, which run eagerly), an id out of range raises
    ValueError naming the argument, the range and the smallest and largest id received (one
    min/max reduction). Inside a compiled function (`fit`, `predict`, `evaluate` on JAX and
    TensorFlow, `jit_compile=True`) nothing is checked: JAX gives NaN logits, TensorFlow on a CPU
    raises InvalidArgumentError for ids >= vocabulary_size, and negative ids wrap around to
    vocabulary_size + id on TensorFlow and PyTorch (docs/errors.md). `call_with_cache` (the
    decoding step inside `generate`) does not check.
    """

    def __init__(self, vocabulary_size, max_length, hidden_dim=128, num_layers=2, num_heads=4,
                 intermediate_dim=256, attention="yoso", attention_kwargs=None, dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        self.vocabulary_size = _validation.integer(vocabulary_size, "vocabulary_size", 1, layer=True)
        self.max_length = _validation.integer(max_length, "max_length", 1, layer=True)
        self.hidden_dim = _validation.integer(hidden_dim, "hidden_dim", 1, layer=True)
        self.num_layers = _validation.integer(num_layers, "num_layers", 1, layer=True)
        self.num_heads = _validation.integer(num_heads, "num_heads", 1, layer=True)
        self.intermediate_dim = _validation.integer(intermediate_dim, "intermediate_dim", 1, layer=True)
        self.attention = attention
        self.attention_kwargs = dict(attention_kwargs or {})
        # (max_new_tokens, sampler) -> the compiled decoding loop of `generate`, built on first use.
        self._generate_functions = {}
        self.dropout = float(dropout)
        self.token_embedding = keras.layers.Embedding(vocabulary_size, hidden_dim, name="token_embedding")
        self.position_embedding = keras.layers.Embedding(max_length, hidden_dim, name="position_embedding")
        # Every block's seed (hash functions, dropout) is derived from one stored seed.
        self.attention_kwargs["seed"] = _validation.resolve_seed(self.attention_kwargs.get("seed"),
                                                                 "attention_kwargs['seed']")
        seed = self.attention_kwargs["seed"]
        self.blocks = [
            TransformerEncoderBlock(num_heads, intermediate_dim, attention=attention, dropout=dropout,
                                    attention_kwargs={**self.attention_kwargs,
                                                      "seed": _validation.derived_seed(seed, 7 * i)},
                                    normalize_first=True, causal=True, name=f"block_{i}")
            for i in range(num_layers)]
        self.final_norm = keras.layers.LayerNormalization(epsilon=1e-5, name="final_norm")
        self.logits_dense = keras.layers.Dense(vocabulary_size, name="logits", dtype="float32")

    def _embed(self, token_ids, start):
        positions = start + ops.arange(ops.shape(token_ids)[1], dtype="int32")
        return self.token_embedding(token_ids) + self.position_embedding(positions)[None]

    def call(self, token_ids, training=None):
        check_token_ids(token_ids, self.vocabulary_size)
        x = self._embed(token_ids, 0)
        for block in self.blocks:
            x = block(x, training=training)
        return self.logits_dense(self.final_norm(x))

    def _ensure_built(self):
        if not self.built:
            self(ops.zeros((1, 1), "int32"))

    def init_cache(self, batch_size, max_length=None):
        """The decoding state: one cache per block (`TransformerEncoderBlock.init_cache`), for sequences of
        up to `max_length` tokens (None: the model's `max_length`, its position table, which also bounds
        it). `max_length` sizes softmax's key/value caches; the states of "yoso" and "linear_relative"
        do not grow with it."""
        max_length = _validation.integer(max_length, "max_length", 1, self.max_length, allow_none=True)
        self._ensure_built()
        return [block.init_cache(batch_size, self.max_length if max_length is None else max_length)
                for block in self.blocks]

    def call_with_cache(self, token_ids, cache, cache_update_index):
        """Logits `[B, T, vocabulary_size]` of T new tokens starting at `cache_update_index`, and the
        updated cache. Equals the matching rows of `call` on the whole sequence."""
        x = self._embed(token_ids, cache_update_index)
        updated = []
        for block, block_cache in zip(self.blocks, cache):
            x, block_cache = block(x, cache=block_cache, cache_update_index=cache_update_index)
            updated.append(block_cache)
        return self.logits_dense(self.final_norm(x)), updated

    def generate(self, prompt, max_new_tokens, sampler="greedy", temperature=1.0, seed=None):
        """`[B, max_new_tokens]` int32 tokens following `prompt` (int `[B, P]`, P >= 1, all rows of
        one length, ids in [0, vocabulary_size); P + max_new_tokens <= max_length; else ValueError,
        also for a prompt of a float or bool dtype, which is not read as token ids).

        sampler: "greedy" (argmax), "random" (softmax(logits / temperature) sampling, with Gumbel
        noise drawn from `seed` before the loop) or a callable `logits [B, V] -> ids [B]` written in
        keras.ops (it runs inside the compiled loop).
        """
        dtype = _validation.dtype_name(prompt)
        if not dtype.startswith(("int", "uint")):
            raise ValueError("Received an invalid value for argument `prompt`: expected token ids of an integer "
                             f"dtype (e.g. int32). Received: prompt of dtype {dtype}")
        check_token_ids(prompt, self.vocabulary_size, "prompt")
        prompt = ops.cast(ops.convert_to_tensor(prompt), "int32")
        shape = _backend.static_shape(prompt)
        if len(shape) != 2 or not shape[1]:
            raise ValueError(f"`prompt` must be int token ids of shape (batch, length >= 1), received shape {shape}")
        max_new_tokens = _validation.integer(max_new_tokens, "max_new_tokens", 1)
        if shape[1] + max_new_tokens > self.max_length:
            raise ValueError(f"prompt length + max_new_tokens = {shape[1]} + {max_new_tokens} exceeds max_length "
                             f"{self.max_length} (the position table of the model).")
        if not callable(sampler):
            sampler = _validation.choice(sampler, "sampler", SAMPLERS)
        self._ensure_built()
        noise = ops.zeros((max_new_tokens, 0, 0), "float32")
        if sampler == "random":
            uniform = keras.random.uniform((max_new_tokens, shape[0], self.vocabulary_size), minval=1e-7,
                                           maxval=1.0, seed=seed)
            noise = -ops.log(-ops.log(uniform))
        key = (max_new_tokens, sampler)
        if key not in self._generate_functions:  # compiled once per setting, reused (keras-hub's pattern)
            self._generate_functions[key] = _backend.compile_reading_variables(
                functools.partial(self._generate_tokens, max_new_tokens=max_new_tokens, sampler=sampler),
                self.variables)
        return self._generate_functions[key](prompt, noise, ops.convert_to_tensor(temperature, "float32"))

    def _generate_tokens(self, prompt, noise, temperature, max_new_tokens, sampler):
        """The decoding loop of `generate`: prefill `prompt`, then one token per step."""
        batch, length = ops.shape(prompt)[0], ops.shape(prompt)[1]

        def pick(logits, step):
            if callable(sampler):
                return ops.cast(sampler(logits), "int32")
            if sampler == "random":
                logits = logits / temperature + ops.take(noise, step, axis=0)
            return ops.cast(ops.argmax(logits, axis=-1), "int32")

        logits, cache = self.call_with_cache(prompt, self.init_cache(_backend.static_shape(prompt)[0]), 0)
        tokens = ops.zeros((batch, max_new_tokens), "int32")
        tokens = ops.slice_update(tokens, (0, 0), pick(logits[:, -1], 0)[:, None])

        def cond(step, tokens, cache):
            return ops.less(step, max_new_tokens)

        def body(step, tokens, cache):
            previous = ops.slice(tokens, (0, step - 1), (batch, 1))
            logits, cache = self.call_with_cache(previous, cache, length + step - 1)
            token = pick(logits[:, -1], step)
            return step + 1, ops.slice_update(tokens, (0, step), token[:, None]), cache

        _, tokens, _ = ops.while_loop(cond, body, (ops.convert_to_tensor(1, "int32"), tokens, cache))
        return tokens

    def get_config(self):
        return {**super().get_config(), "vocabulary_size": self.vocabulary_size, "max_length": self.max_length,
                "hidden_dim": self.hidden_dim, "num_layers": self.num_layers, "num_heads": self.num_heads,
                "intermediate_dim": self.intermediate_dim, "attention": self.attention,
                "attention_kwargs": self.attention_kwargs, "dropout": self.dropout}
