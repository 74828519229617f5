"""YOSO multi-head attention as a drop-in `keras.layers.MultiHeadAttention`.

Paper: Zeng et al., "You Only Sample (Almost) Once: Linear Cost Self-Attention Via Bernoulli
Sampling", ICML 2021.
"""

import math
import numbers

import keras
import numpy as np
from keras import ops

from keras_yoso import _validation
from keras_yoso import ops as yoso_ops
from keras_yoso.layers.attention_registry import register_attention
from keras_yoso.layers.multi_head_attention_base import MultiHeadAttentionBase
from keras_yoso.layers.multi_head_attention_base import flatten_heads
from keras_yoso.layers.multi_head_attention_base import l2_normalize
from keras_yoso.layers.multi_head_attention_base import repeat_heads
from keras_yoso.layers.multi_head_attention_base import unflatten_heads

# yoso_expectation's name for the true derivative that "collision" estimates.
_EXPECTATION_BACKWARD = {"lower_bound": "lower_bound", "collision": "exact"}


@keras.saving.register_keras_serializable(package="keras_yoso")
@register_attention("yoso")
class YosoAttention(MultiHeadAttentionBase):
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
    `training=False`/`None` the hash functions are fixed: drawn from `seed` when
    the layer is built (`keras_yoso.ops.hash_parameters(key_dim, ..., seed)`)
    and kept as the non-trainable weight `hash_functions`, so the same input
    gives the same output on every call, after `get_config`/`from_config`,
    after `.keras` save/load and after `save_weights`/`load_weights` into a
    layer built from code (whose own seed the loaded weights replace). If
    `seed` is None, a random integer is drawn at construction and stored in
    `get_config`. Weights saved before the hash functions were a weight (and a
    MultiHeadAttention's weights) carry none: the layer then keeps those of
    its `seed`. Queries and keys of one call always share the hash functions.

    Causal attention. `use_causal_mask=True` makes query i attend to keys
    j <= i only (self-attention: T == S): with the hash functions fixed, each
    bucket is a prefix sum in position order (`keras_yoso.ops.yoso_cumulation(
    ..., causal=True)`), same O(length * num_hashes * head size) cost, and
    the eq. 4 backward sums the same pairs. YOSO-C's convolution is then
    causal (left-padded: position i sees values i - w + 1 .. i).

    Incremental decoding. `cache = layer.init_cache(batch_size)` and
    `output, cache = layer(x, x, cache=cache, cache_update_index=index)` run
    causal self-attention of the T new positions of `x` (starting at
    position `index`) over every position seen so far, with the inference
    hash functions (a fixed function of `seed`, as `training=False`). The
    state does not grow with the context: per head, the m bucket tables
    T_h[b] = sum of the values of the keys hashed to b (eq. 2 read as linear
    attention with one-hot features), cache["tables"] `[B * num_heads, num_hashes,
    2**hash_code_len, value_dim]` float32 (row b * num_heads + h), i.e.
    4 * B * num_heads * num_hashes * 2**hash_code_len * value_dim bytes
    (512 KiB per head and sequence at the default m=32, tau=6, value_dim=64), plus, with
    `conv_window=w > 1`, cache["values"], the last w - 1 values `[B, w - 1, num_heads,
    value_dim]`, and with `local_window=w > 1` the last w - 1 keys, values and whether each was a
    position (cache["window_keys"] `[B, w - 1, num_heads, key_dim]`, cache["window_values"],
    cache["window_mask"] `[B, w - 1]`). Each call is one `keras_yoso.ops.lsh_cumulation_step` (native on
    every backend).
    Outputs equal the matching rows of the full causal forward (float32 rounding). Each
    decoding call costs O(T * num_hashes * head size) plus the tables' copy where a compiled loop
    does not update them in place.

    Masks. Padding masks only: Keras implicit masks of `query`/`value`/`key`,
    or `query_mask`/`value_mask`/`key_mask`. Masked keys never contribute
    (their content cannot change any output) and masked queries output zero
    before the output projection (so the layer output there is the projection
    bias). An `attention_mask` is accepted only when it is a padding mask
    (`query_mask[:, :, None] & key_mask[:, None, :]`); any other pattern
    raises (ValueError eagerly, InvalidArgumentError inside a `tf.function`;
    under XLA, where that check cannot run, any `attention_mask` raises ValueError),
    since LSH attention cannot express an arbitrary [B, T, S] mask.

    Precision. The attention core (normalization, hashing, cumulation,
    convolution) runs in float32 whatever the compute dtype, like the softmax
    of `MultiHeadAttention` under mixed precision; projections run in the
    compute dtype and the output has the compute dtype.

    Export. `model.export` of a model whose YOSO layers use the TensorFlow
    custom ops keeps those ops in the SavedModel, which then needs
    `import keras_yoso` before `tf.saved_model.load`;
    `keras_yoso.export_portable(model, path)` exports the composite instead
    (the SavedModel loads with TensorFlow alone).

    Settings. Each YOSO argument below (`num_hashes`, `hash_code_len`,
    `use_expectation`, `conv_window`, `backward`, `hash_method`,
    `implementation`, `causal`, `output_scale`, `local_window`) is a read-only
    property of the same name.

    Args:
        num_heads: Number of attention heads.
        key_dim: Size of each attention head for query and key.
        value_dim: Size of each attention head for value. Defaults to `key_dim`.
        num_hashes: m >= 1, the number of LSH hashes averaged (YOSO-m).
        hash_code_len: tau in [1, 20], bits per hash; larger tau makes the
            attention sharper (weight `(1 - theta/pi)^tau` at angle theta).
            Default 6 (8 before 2026-11; a saved layer keeps its own). Which
            tau (docs/quality.md, rates chosen on validation, 3 seeds): for
            associative recall 5-6, since a sharper kernel gives queries and
            unrelated keys at random angles (the start of training) a
            collision probability 2^-tau, so recall is learned late or not at
            all (MQAR, length 64, 8 pairs, m = 32: 0.987 at tau 5, 0.980 at
            tau 6, 0.723 at tau 8, softmax 0.997). Sweep the learning rate
            (the long-range tags task: tau 6 learned at 1e-2 on 2 seeds of 3,
            not at 1e-3 or 3e-3 where softmax did; tau 4 and 5 at no rate).
            For classification the paper's rule tau = log2(length) with
            m = 32 and faster embeddings learns that task on every run of
            examples/long_text_classifier.py.
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
        hash_method: How the hyperplanes are drawn (`keras_yoso.ops.hash_codes`).
            "hadamard_interleaved" (default): fast structured projections whose
            collision rate is the paper's (1 - theta/pi)^hash_code_len at every
            head size. "hadamard": the default before 2026-11, kept so that
            layers saved with it (their config stores it) hash as they were
            trained; its kernel falls short at small head sizes. "gaussian":
            dense Gaussian projections.
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
        use_gate, attention_axes, flash_attention, sliding_window:
            MultiHeadAttention's, as `MultiHeadAttentionBase` documents them.
        implementation: "auto", "custom_op" or "composite", passed to
            `keras_yoso.ops`. "composite" is written in `keras.ops` and runs
            on every backend: it compiles with XLA (`jit_compile=True`,
            `jax.jit`) and exports SavedModels that load without keras_yoso.
            "custom_op" is the compiled native kernels: TensorFlow's op
            library (CPU and GPU), the native library's CPU kernels on JAX
            (XLA FFI) and PyTorch (torch.library); "auto" takes them when
            they are loaded and can take the inputs, else the composite.
            `supports_jit` is `keras_yoso.ops.supports_jit(implementation)`:
            False only for TensorFlow's op library (no XLA kernels).
        causal: The default of `use_causal_mask`: True makes every call causal
            unless it passes use_causal_mask=False (as LinearRelativeAttention's
            `causal`). Calls with a `cache` are causal either way.
        output_scale: None (default: no scale, the layer as before) or
            `num_heads` finite floats s_h: head h's N-YOSO output (unit norm
            per query) is multiplied by s_h, before YOSO-C's convolution and
            the output projection. `keras_yoso.calibrate` fits it (least
            squares against the softmax layer a model was converted from);
            kept in `get_config` as a list.
        local_window: None (default) or a positive int w: beside YOSO, each
            query attends exactly, with softmax(<q_i, k_j> / sqrt(key_dim)) of
            the projected (not normalized) heads, to the keys j with
            |i - j| < w (`MultiHeadAttention(sliding_window=w)`'s band; with
            causal attention i - w < j <= i), and head h adds g_h times that
            to its (scaled) N-YOSO output: the exact sliding window LoLCATs
            (Zhang et al. 2025) keeps beside its linear attention. g is the
            trainable weight `local_window_scale` `(num_heads,)`, zero when
            built, so a layer with a window starts as the layer without one
            (`keras_yoso.transfer_attention` trains it). O(T * w) more time
            and memory (`keras_yoso.ops.local_attention`, `keras.ops` on
            every backend); requires self-attention lengths (T == S).
            Decoding keeps the last w - 1 keys and values (see above).

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
        attention_mask: Optional `(B, T, S)` boolean mask (also `(T, S)`,
            broadcast over the batch, and `(B, num_heads, T, S)` with the same
            mask in every head); must be a padding mask (see above).
        training: Whether to draw fresh hash functions and apply dropout.
        use_causal_mask: If True, causal self-attention (query i attends to
            keys j <= i; `query` and `value` of the same length). Not with
            `use_expectation=True`. None (default): the constructor's `causal`;
            implied by `cache`.
        return_attention_scores: If True, also return the expected attention
            weights (YOSO-E's, whatever `use_expectation`: sampled YOSO never
            forms them, so this costs O(T * S) time and memory, as softmax
            attention does; it is for inspection, not for long sequences).
        cache: Optional decoding state from `init_cache` (or a previous
            call); then `cache_update_index` is required and the call
            returns `(attention_output, cache)`.
        cache_update_index: The position of the first row of `query` in the
            sequence (int or scalar int tensor).

    Returns:
        attention_output: `(B, T, E)`, E the query's last dimension or
            `output_shape`.
        attention_scores: (only with `return_attention_scores=True`) the YOSO-E
            weights `(1 - arccos(<q_i, k_j>)/pi)^tau` (eq. 2's expectation),
            zero for masked pairs and, when causal, for keys j > i, of shape
            `(B, num_heads, T, S)`; `local_window`'s softmax weights are not
            included.
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        num_hashes=_validation.DEFAULT_NUM_HASHES,
        hash_code_len=_validation.DEFAULT_HASH_CODE_LEN,
        use_expectation=False,
        conv_window=None,
        backward="lower_bound",
        hash_method=_validation.DEFAULT_HASH_METHOD,
        implementation="auto",
        causal=False,
        output_scale=None,
        local_window=None,
        **kwargs,
    ):
        self._causal = _validation.boolean(causal, "causal", layer=True)
        self._num_hashes = _validation.integer(num_hashes, "num_hashes", 1, layer=True)
        self._hash_code_len = _validation.hash_code_len(hash_code_len, cumulation=True, layer=True)
        self._use_expectation = _validation.boolean(use_expectation, "use_expectation", layer=True)
        self._conv_window = _validation.integer(conv_window, "conv_window", 1, allow_none=True, layer=True)
        self._local_window = _validation.integer(local_window, "local_window", 1, allow_none=True, layer=True)
        self._backward = _validation.choice(backward, "backward", _validation.SAMPLED_BACKWARDS, layer=True)
        self._hash_method = _validation.choice(hash_method, "hash_method", _validation.HASH_METHODS, layer=True)
        self._implementation = _validation.choice(implementation, "implementation", _validation.IMPLEMENTATIONS,
                                                  layer=True)
        if self._causal and self._use_expectation:
            raise ValueError("causal=True is not implemented with use_expectation=True (YOSO-E): use sampled YOSO "
                             "(use_expectation=False), whose causal form is linear in the length.")
        # The inference hash functions are a function of the seed: drawn now when None, kept in the config.
        kwargs["seed"] = _validation.resolve_seed(kwargs.get("seed"))
        super().__init__(num_heads, key_dim, value_dim=value_dim, **kwargs)
        self.supports_jit = self._use_expectation or yoso_ops.supports_jit(self._implementation)
        self._training_seeds = keras.random.SeedGenerator(self.seed)
        self._hash_functions = None  # the inference hash functions, a weight once built
        self._output_scale = _output_scale(output_scale)  # its length is checked when the layer is built
        # keras_yoso.calibrate's view of the heads: a function called by _attend with the N-YOSO output
        # `[B, T, heads, value_dim]` before the output scale and the query mask `[B, T]`; None otherwise.
        self._head_recorder = None

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
    def local_window(self):
        """None, or w: each query also attends exactly (softmax) to the keys less than w positions away."""
        return self._local_window

    def local_window_scale_weight(self):
        """The trainable per-head scale g `(num_heads,)` of the local window's term (a built layer with a
        `local_window`; None otherwise)."""
        return getattr(self, "_local_window_scale", None)

    @property
    def implementation(self):
        return self._implementation

    @property
    def causal(self):
        """The constructor's `causal`: whether a call without `use_causal_mask` is causal."""
        return self._causal

    @property
    def backward(self):
        """The gradient estimator of sampled YOSO: "lower_bound" (eq. 4) or "collision" (*YOSO)."""
        return self._backward

    @property
    def hash_method(self):
        """The hash family of the layer: one of `keras_yoso._validation.HASH_METHODS`."""
        return self._hash_method

    @property
    def output_scale(self):
        """None, or the per-head factors `(num_heads,)` of the N-YOSO output (`keras_yoso.calibrate`)."""
        return self._output_scale

    def get_config(self):
        config = {
            "num_hashes": self._num_hashes,
            "hash_code_len": self._hash_code_len,
            "use_expectation": self._use_expectation,
            "conv_window": self._conv_window,
            "backward": self._backward,
            "hash_method": self._hash_method,
            "implementation": self._implementation,
            "causal": self._causal,
            "output_scale": None if self._output_scale is None else list(self._output_scale),
            "local_window": self._local_window,
        }
        return {**super().get_config(), **config}

    _padding_only_reason = "LSH attention (YOSO) never forms the [target_length, source_length] attention matrix"

    def _check_shapes(self, query_shape, value_shape, key_shape, sequences=False):
        super()._check_shapes(query_shape, value_shape, key_shape, sequences)
        if self._conv_window is not None and tuple(query_shape[1:-1]) != tuple(value_shape[1:-1]) and not (
                None in query_shape[1:-1] or None in value_shape[1:-1]):
            raise ValueError(f"conv_window={self._conv_window} (YOSO-C) convolves the values along the sequence "
                             "and adds them to the outputs at the same positions, so `query` and `value` must "
                             f"have the same length. Received: query_shape={tuple(query_shape)}, "
                             f"value_shape={tuple(value_shape)}")
        if self._local_window is not None and tuple(query_shape[1:-1]) != tuple(value_shape[1:-1]) and not (
                None in query_shape[1:-1] or None in value_shape[1:-1]):
            raise ValueError(f"local_window={self._local_window} attends the keys near each query's own position, "
                             "so `query` and `value` must have the same length (self-attention). Received "
                             f"query_shape={tuple(query_shape)}, value_shape={tuple(value_shape)}")

    def _build_attention(self, query_shape, value_shape):
        """Creates the YOSO-C filters and the inference hash functions (a non-trainable weight drawn from
        `seed`, so that the weights carry them). Checks that `output_scale` has one factor per head: the
        length is checked here, not in the constructor, so that `attention_kwargs` (checked on a layer of
        one head) may carry a scale for the layers they build."""
        if self._output_scale is not None and len(self._output_scale) != self._num_heads:
            raise ValueError(f"Received an invalid value for argument `output_scale`: expected None or "
                             f"num_heads = {self._num_heads} factors, one per head. Received "
                             f"{len(self._output_scale)}: output_scale={list(self._output_scale)!r}")
        self._hash_functions = None
        if not self._use_expectation:
            def draw(shape=None, dtype=None):  # called where Keras creates variables (eagerly, out of any trace)
                return yoso_ops.hash_parameters(self._key_dim, self._num_hashes, self._hash_code_len, self.seed,
                                                method=self._hash_method)

            shape = yoso_ops.hash_parameters_shape(self._key_dim, self._num_hashes, self._hash_code_len,
                                                   self._hash_method)
            self._hash_functions = self.add_weight(name="hash_functions", shape=shape, dtype="float32",
                                                   trainable=False, initializer=draw, autocast=False)
        if self._conv_window is not None:
            self._conv_kernel = self.add_weight(
                name="conv_kernel", shape=(self._conv_window, self._num_heads),
                initializer=self._fresh_kernel_initializer(), regularizer=self._kernel_regularizer,
                constraint=self._kernel_constraint, trainable=True)
        if self._local_window is not None:
            # Zero: a layer with a window starts as the layer without one (a converted model stays converted).
            self._local_window_scale = self.add_weight(name="local_window_scale", shape=(self._num_heads,),
                                                       dtype="float32", initializer="zeros", trainable=True,
                                                       autocast=False)

    def _causal_by_default(self, cache):
        """use_causal_mask=None: the constructor's `causal`, and causal whenever the call decodes."""
        return self._causal or cache is not None

    def _check_call_options(self, return_attention_scores, use_causal_mask):
        _validation.boolean(use_causal_mask, "use_causal_mask", layer=True, allow_none=True)
        if use_causal_mask and self._use_expectation:
            raise ValueError("use_causal_mask=True is not implemented with use_expectation=True (YOSO-E): use "
                             "sampled YOSO (use_expectation=False), whose causal form is linear in the length.")

    def _hash(self, x):
        """Inference codes `[B * heads, m, N]` of the normalized rows `x`, with the layer's hash functions
        (the `hash_functions` weight)."""
        return yoso_ops.hash_codes(x, self._num_hashes, self._hash_code_len, method=self._hash_method,
                                   implementation=self._implementation, parameters=self._hash_functions)

    def load_own_variables(self, store):
        """Loads the layer's own weights. A file written before the hash functions were a weight (or by a
        MultiHeadAttention) lacks `hash_functions`: the layer keeps those drawn from its `seed`."""
        own = self._trainable_variables + self._non_trainable_variables
        if self._hash_functions is not None and len(store.keys()) == len(own) - 1:
            own = [v for v in own if v is not self._hash_functions]
            for i, variable in enumerate(own):
                variable.assign(store[f"{i}"])
            return
        super().load_own_variables(store)

    def _depthwise_conv(self, value, key_mask, causal=False, history=None):
        """YOSO-C term: per-head depthwise convolution of the masked values `[B, S, heads, Dv]`, "same"
        padded, or causal (position i sees i - w + 1 .. i; `history`: the w - 1 values before the first
        row, zeros by default)."""
        value = ops.where(key_mask[:, :, None, None], value, 0.0)
        batch, length = ops.shape(value)[0], ops.shape(value)[1]
        channels = self._num_heads * self._value_dim
        kernel = ops.cast(ops.convert_to_tensor(self._conv_kernel), "float32")
        kernel = ops.repeat(kernel, self._value_dim, axis=1)  # channel n * Dv + d uses head n's filter
        padding = "same"
        if causal:
            padding = "valid"
            if history is None:
                history = ops.zeros((batch, self._conv_window - 1, self._num_heads, self._value_dim), "float32")
            value = ops.concatenate([history, value], axis=1)
        out = ops.depthwise_conv(ops.reshape(value, (batch, ops.shape(value)[1], channels)), kernel[:, :, None],
                                 strides=1, padding=padding)
        return ops.reshape(out, (batch, length, self._num_heads, self._value_dim))

    def _normalized_heads(self, query_heads, key_heads, query_mask, key_mask):
        """L2-normalized `[B * heads, N, key_dim]` queries and keys and their `[B * heads, N]` masks."""
        q = l2_normalize(flatten_heads(query_heads))
        k = l2_normalize(flatten_heads(key_heads))
        return q, k, repeat_heads(query_mask, self._num_heads), repeat_heads(key_mask, self._num_heads)

    def _attend(self, heads, masks, training, causal, cache=None, index=None):
        query_heads, key_heads, value_heads = heads
        query_mask, key_mask = masks
        if cache is not None:
            return self._decode(heads, masks, cache)
        if causal:
            lengths = (_validation.static_shape(query_heads)[1], _validation.static_shape(key_heads)[1])
            if None not in lengths and lengths[0] != lengths[1]:
                raise ValueError("YosoAttention with use_causal_mask=True is causal self-attention: `query` and "
                                 "`value` must have the same length (query i attends to keys j <= i). Received "
                                 f"lengths {lengths[0]} and {lengths[1]}.")
        q, k, q_mask, k_mask = self._normalized_heads(query_heads, key_heads, query_mask, key_mask)
        v = flatten_heads(value_heads)  # [B * heads, S, value_dim]
        if self._use_expectation:
            out = yoso_ops.yoso_expectation(q, k, v, self._hash_code_len, q_mask, k_mask,
                                            backward=_EXPECTATION_BACKWARD[self._backward],
                                            implementation=self._implementation)
        else:
            if training:  # one fresh set of hash functions for the queries and keys of this step
                seed = self._training_seeds.next()
                query_codes, key_codes = (
                    yoso_ops.hash_codes(t, self._num_hashes, self._hash_code_len, seed, method=self._hash_method,
                                        implementation=self._implementation) for t in (q, k))
            else:
                query_codes, key_codes = self._hash(q), self._hash(k)
            out = yoso_ops.yoso_cumulation(q, k, v, query_codes, key_codes, self._hash_code_len, q_mask, k_mask,
                                           backward=self._backward, implementation=self._implementation,
                                           causal=causal)
        out = l2_normalize(out)  # N-YOSO; all-zero rows stay zero
        out = unflatten_heads(out, ops.shape(query_heads)[0], self._num_heads)  # [B, T, heads, value_dim]
        if self._head_recorder is not None:
            self._head_recorder(out, query_mask)
        out = self._scaled(out)
        if self._conv_window is not None:
            out = out + self._depthwise_conv(value_heads, key_mask, causal=causal)
        if self._local_window is not None:
            out = out + self._local_term(query_heads, key_heads, value_heads, query_mask, key_mask, causal)
        return out, None

    def _local_term(self, query_heads, key_heads, value_heads, query_mask, key_mask, causal, key_offset=0):
        """g_h times head h's exact softmax attention over the keys within `local_window` positions
        (`keras_yoso.ops.local_attention`): `[B, T, heads, Dv]` float32. Keys and values `[B, S, heads, .]`,
        the first `key_offset` of them before the first query (decoding)."""
        local = yoso_ops.local_attention(flatten_heads(query_heads), flatten_heads(key_heads),
                                         flatten_heads(value_heads), self._local_window,
                                         repeat_heads(query_mask, self._num_heads),
                                         repeat_heads(key_mask, self._num_heads), causal=causal, key_offset=key_offset)
        local = unflatten_heads(local, ops.shape(query_heads)[0], self._num_heads)
        return local * ops.convert_to_tensor(self._local_window_scale)[None, None, :, None]

    def _scaled(self, heads):
        """`heads` `[B, T, num_heads, value_dim]` times the output scale of each head (unchanged without one)."""
        if self._output_scale is None:
            return heads
        scale = np.asarray(self._output_scale, np.float32)[None, None, :, None]
        return heads * ops.convert_to_tensor(scale, dtype=heads.dtype)  # mixed precision keeps its dtype

    # ------------------------------------------------------------------ incremental decoding

    def init_cache(self, batch_size, max_length=None):
        """The decoding state before any token, a dict of zeros: "tables", the bucket tables
        `[batch_size * num_heads, num_hashes, 2**hash_code_len, value_dim]` float32, row
        b * num_heads + h (`keras_yoso.ops.yoso_decoding_state`; 4 * batch_size * num_heads * num_hashes *
        2**hash_code_len * value_dim bytes, whatever the context length), and with conv_window=w > 1
        "values", the last w - 1 values `[batch_size, w - 1, num_heads, value_dim]`. `max_length`
        is accepted for the keras-hub contract and not used (the state does not grow). Tables over
        `keras_yoso._validation.MAX_DECODING_STATE_BYTES` (4 GiB) raise ValueError naming their size."""
        batch_size = _validation.integer(batch_size, "batch_size", 1)
        _validation.integer(max_length, "max_length", 1, allow_none=True)
        if self._use_expectation:
            raise ValueError("YosoAttention(use_expectation=True) (YOSO-E, O(T S)) has no constant-size decoding "
                             "state: decode with sampled YOSO (use_expectation=False).")
        _validation.check_decoding_state(
            4 * batch_size * self._num_heads * self._num_hashes * 2 ** self._hash_code_len * self._value_dim,
            f"YosoAttention.init_cache: its bucket tables, 4 bytes * batch_size {batch_size} * num_heads "
            f"{self._num_heads} * num_hashes {self._num_hashes} * 2**hash_code_len {2 ** self._hash_code_len} * "
            f"value_dim {self._value_dim},",
            "lower hash_code_len (each bit doubles the tables), num_hashes or batch_size")
        cache = {"tables": yoso_ops.yoso_decoding_state(batch_size * self._num_heads, self._num_hashes,
                                                        self._hash_code_len, self._value_dim)}
        cache.update({name: ops.zeros(shape, "float32") for name, shape in self._history_shapes(batch_size).items()})
        return cache

    def _history_shapes(self, batch_size):
        """{name: shape} of the cache's entries besides "tables", float32 zeros in init_cache: with
        conv_window=w > 1 "values" (the last w - 1 values); with local_window=w > 1 "window_keys",
        "window_values" (the last w - 1 keys and values) and "window_mask" `[batch_size, w - 1]` (1: a
        position seen, 0: none yet)."""
        shapes = {}
        if self._conv_window is not None and self._conv_window > 1:
            shapes["values"] = (batch_size, self._conv_window - 1, self._num_heads, self._value_dim)
        if self._local_window is not None and self._local_window > 1:
            kept = self._local_window - 1
            shapes["window_keys"] = (batch_size, kept, self._num_heads, self._key_dim)
            shapes["window_values"] = (batch_size, kept, self._num_heads, self._value_dim)
            shapes["window_mask"] = (batch_size, kept)
        return shapes

    def _decode(self, heads, masks, cache):
        """Causal YOSO of T new positions over the bucket tables of the earlier ones
        (`keras_yoso.ops.lsh_cumulation_step`), N-YOSO normalized, plus the causal convolution over
        the kept values. Returns (`[B, T, heads, Dv]`, the new cache)."""
        (query_heads, key_heads, value_heads), (query_mask, key_mask) = heads, masks
        self._check_cache(cache, ops.shape(query_heads)[0])
        batch, heads = ops.shape(query_heads)[0], self._num_heads
        q, k, q_mask, k_mask = self._normalized_heads(query_heads, key_heads, query_mask, key_mask)
        query_codes, key_codes = self._hash(q), self._hash(k)
        # The tables in the op's layout (row b * heads + h): no reshape, so a compiled decoding loop
        # updates them in place (a reshaped state is copied in and out of the native call on JAX).
        out, tables = yoso_ops.lsh_cumulation_step(query_codes, key_codes, flatten_heads(value_heads),
                                                   cache["tables"], q_mask, k_mask,
                                                        implementation=self._implementation)
        out = self._scaled(unflatten_heads(l2_normalize(out), batch, heads))
        new_cache = {"tables": tables}
        if "values" in cache:
            history = cache["values"]
            out = out + self._depthwise_conv(value_heads, key_mask, causal=True, history=history)
            values = ops.concatenate([history, ops.where(key_mask[:, :, None, None], value_heads, 0.0)], axis=1)
            new_cache["values"] = _last_rows(values, self._conv_window - 1)
        elif self._conv_window is not None:
            out = out + self._depthwise_conv(value_heads, key_mask, causal=True)
        if "window_keys" in cache:  # the new positions attend the kept w - 1 before them and each other
            kept = self._local_window - 1
            f32 = lambda x: ops.cast(x, "float32")  # noqa: E731
            keys = ops.concatenate([cache["window_keys"], f32(key_heads)], axis=1)
            values = ops.concatenate([cache["window_values"], f32(value_heads)], axis=1)
            seen = ops.concatenate([cache["window_mask"] > 0, key_mask], axis=1)
            out = out + self._local_term(query_heads, keys, values, query_mask, seen, True, key_offset=kept)
            new_cache["window_keys"], new_cache["window_values"] = _last_rows(keys, kept), _last_rows(values, kept)
            new_cache["window_mask"] = _last_rows(ops.cast(seen, "float32"), kept)
        elif self._local_window is not None:
            out = out + self._local_term(query_heads, key_heads, value_heads, query_mask, key_mask, True)
        return out, new_cache

    def _check_cache(self, cache, batch):
        """ValueError when `cache` is not this layer's (the names and shapes of init_cache)."""
        names = {"tables", *self._history_shapes(1)}
        if not isinstance(cache, dict) or set(cache) != names:
            raise ValueError(f"YosoAttention expects the `cache` of its own init_cache: a dict with the entries "
                             f"{sorted(names)}. Received {type(cache).__name__}"
                             + (f" with {sorted(cache)}" if isinstance(cache, dict) else "") + ".")
        rows = batch * self._num_heads if isinstance(batch, int) else None
        want = (rows, self._num_hashes, 2 ** self._hash_code_len, self._value_dim)
        got = _validation.static_shape(cache["tables"])
        if got is None or len(got) != 4 or any(
                g is not None and isinstance(w, int) and g != w for g, w in zip(got, want)):
            raise ValueError(f"YosoAttention expects `cache[\"tables\"]` of shape (batch * num_heads, num_hashes, "
                             f"2**hash_code_len, value_dim) = {want} (from init_cache). Received shape "
                             f"{None if got is None else tuple(got)}.")

    def _attention_scores(self, query_heads, key_heads, query_mask, key_mask, causal):
        """The expected weights E of eq. 2 `[B, heads, T, S]` (O(T S)), zero for keys j > i when causal."""
        q, k, q_mask, k_mask = self._normalized_heads(query_heads, key_heads, query_mask, key_mask)
        scores = yoso_ops.yoso_expectation_weights(q, k, self._hash_code_len, q_mask, k_mask)
        shape = (ops.shape(query_heads)[0], self._num_heads, ops.shape(query_heads)[1], ops.shape(key_heads)[1])
        scores = ops.reshape(scores, shape)
        if causal:
            scores = ops.where(ops.tril(ops.ones(shape[2:], "bool")), scores, 0.0)
        return scores


def _last_rows(x, count):
    """The last `count` rows of `x` `[B, N, ...]` along axis 1."""
    shape = ops.shape(x)
    return ops.slice(x, (0, shape[1] - count) + (0,) * (len(shape) - 2), (shape[0], count) + tuple(shape[2:]))


def _output_scale(value):
    """`output_scale` as a non-empty tuple of finite floats, or None; ValueError naming the argument otherwise."""
    if value is None:
        return None
    values = value.tolist() if isinstance(value, np.ndarray) else value
    if (isinstance(values, (list, tuple)) and values
            and all(isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) and math.isfinite(v)
                    for v in values)):
        return tuple(float(v) for v in values)
    raise ValueError("Received an invalid value for argument `output_scale`: expected None or a list of num_heads "
                     f"finite floats (one factor per head). Received: output_scale={value!r}")
