"""The attentions the quality benchmark compares, behind one registry.

Every entry builds a Keras layer with the same call, `layer(x, padding_mask=None, training=None)`:
self-attention of `x` `[B, T, width]` -> `[B, T, width]`, causal or bidirectional as fixed at
construction, `padding_mask` `[B, T]` (True = real token) only used by the bidirectional tasks
(the causal tasks have no padding). All use `num_heads` heads of `key_dim = width / num_heads`
features (value_dim = key_dim) with their own query/key/value/output projections.

    spec = ATTENTIONS["performer"]
    layer = build_attention("performer", num_heads=2, key_dim=32, causal=True, length=256, seed=0)

`state_bytes(name, ...)` is the size of one layer's causal decoding state for ONE sequence
(float32, 4 bytes per number): the x axis of the MQAR plot. Its formula sits next to each
registration. None for the bidirectional-only attentions.

The baselines (linear, performer, reformer, sliding_window, linformer) are compact `keras.ops`
code written here for the benchmark only; yoso, linear_relative and softmax are the library
layers; gated_deltanet is keras-hub's layer (an optional benchmark dependency); none (NO_ATTENTION)
returns zeros: the model without attention, the floor every run is judged against.
"""

import dataclasses
import inspect
import math

import keras
import numpy as np
from keras import ops

import keras_yoso

FLOAT_BYTES = 4


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    """One registry entry.

    build(num_heads, key_dim, causal, length, seed, **kwargs) -> layer
    state_bytes(num_heads, key_dim, length, **kwargs) -> int | None
    defaults: the keyword arguments the entry accepts (from --attention-kwargs) and their defaults.
    requires: the modules its layer imports beyond this package's own (an optional dependency).
    """

    name: str
    build: callable
    state_bytes: callable
    defaults: dict
    causal: bool = True
    bidirectional: bool = True
    description: str = ""
    requires: tuple = ()


ATTENTIONS = {}


def register(name, defaults=None, causal=True, bidirectional=True, description="", state_bytes=None, requires=()):
    """Decorator: registers `build` under `name`."""
    def wrap(build):
        ATTENTIONS[name] = AttentionSpec(name, build, state_bytes or (lambda *a, **k: None), dict(defaults or {}),
                                         causal, bidirectional, description, tuple(requires))
        return build
    return wrap


def unavailable(names=None):
    """{name: why} for the attentions (of `names`, default all) whose required modules are not installed here."""
    import importlib.util
    missing = {}
    for name in names or ATTENTIONS:
        absent = [module for module in ATTENTIONS[name].requires if importlib.util.find_spec(module) is None]
        if absent:
            missing[name] = f"needs {', '.join(absent)}, not installed here"
    return missing


def resolve_kwargs(name, kwargs):
    """The full keyword arguments of attention `name`: its defaults updated with the entries of
    `kwargs` it accepts (keys it does not accept are ignored here; run.py checks that every key
    is accepted by at least one of the attentions asked for)."""
    spec = ATTENTIONS[name]
    return {**spec.defaults, **{k: v for k, v in kwargs.items() if k in spec.defaults}}


def build_attention(name, num_heads, key_dim, causal, length, seed, **kwargs):
    """The layer of registry entry `name`; ValueError when it cannot run in that mode."""
    if name not in ATTENTIONS:
        raise ValueError(f"unknown attention {name!r}; choose from {', '.join(ATTENTIONS)}")
    spec = ATTENTIONS[name]
    if causal and not spec.causal:
        raise ValueError(f"attention {name!r} is bidirectional only; task needs causal attention")
    if not causal and not spec.bidirectional:
        raise ValueError(f"attention {name!r} is causal only; task needs bidirectional attention")
    return spec.build(num_heads, key_dim, causal, length, seed, **resolve_kwargs(name, kwargs))


def state_bytes(name, num_heads, key_dim, length, **kwargs):
    """Bytes of one layer's causal decoding state for one sequence (None: not a causal attention)."""
    return ATTENTIONS[name].state_bytes(num_heads, key_dim, length, **resolve_kwargs(name, kwargs))


# ----------------------------------------------------------------------------- library layers

class LibraryAttention(keras.layers.Layer):
    """Wraps a `keras.layers.MultiHeadAttention`-like layer (call(query, value, query_mask=,
    value_mask=, use_causal_mask=)) into the registry's self-attention call."""

    def __init__(self, inner, causal, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True  # padding arrives as `padding_mask`; a Keras mask passes through
        self.inner = inner
        self.causal = causal

    def build(self, input_shape):
        self.inner.build(input_shape, input_shape)

    def compute_output_shape(self, input_shape, *args, **kwargs):
        return tuple(input_shape)

    def call(self, x, padding_mask=None, training=None):
        return self.inner(x, x, query_mask=padding_mask, value_mask=padding_mask, use_causal_mask=self.causal,
                          training=training)


def _yoso_state(num_heads, key_dim, length, num_hashes, hash_code_len, conv_window=None, **_):
    """m bucket tables per head, [m, 2^tau, value_dim], plus YOSO-C's last w - 1 values."""
    history = (conv_window - 1) * num_heads * key_dim if conv_window else 0
    return FLOAT_BYTES * (num_heads * num_hashes * 2 ** hash_code_len * key_dim + history)


# YosoAttention's own defaults (hash_method: the library's default structured projection).
YOSO_DEFAULTS = {name: inspect.signature(keras_yoso.YosoAttention).parameters[name].default
                 for name in ("num_hashes", "hash_code_len", "conv_window", "backward", "hash_method",
                              "use_expectation")}


def _yoso(num_heads, key_dim, causal, length, seed, **kwargs):
    inner = keras_yoso.YosoAttention(num_heads, key_dim, seed=seed, name="yoso", **kwargs)
    return LibraryAttention(inner, causal)


register("yoso", YOSO_DEFAULTS, state_bytes=_yoso_state,
         description="YOSO-m (Zeng et al. 2021): LSH Bernoulli sampling, keras_yoso.YosoAttention")(_yoso)
register("yoso_c", {**YOSO_DEFAULTS, "conv_window": 4}, state_bytes=_yoso_state,
         description="YOSO-C: YOSO plus a depthwise convolution of the values, window 4 (§4.2)")(_yoso)
register("yoso_star", {**YOSO_DEFAULTS, "backward": "collision"}, causal=False,
         description="*YOSO: the collision (true-derivative) backward; keras_yoso implements it for "
                     "bidirectional attention only")(_yoso)
register("yoso_e", {k: v for k, v in YOSO_DEFAULTS.items() if k not in ("num_hashes",)} | {"use_expectation": True},
         causal=False, description="YOSO-E: the expectation over hashes, O(T^2), bidirectional only")(_yoso)


def _linear_relative_state(num_heads, key_dim, length, horizon=None, feature_dim=None, **_):
    """kernel state [F, value_dim + 1] per head (F = feature_dim, the layer's key_dim; value_dim = key_dim
    here), plus with a horizon k the last k rows [V, 1] and the sum before them: (value_dim + 1) * (F + k + 1)
    (LinearRelativeAttention.init_cache)."""
    rows = (feature_dim or key_dim) + (horizon + 1 if horizon else 0)
    return FLOAT_BYTES * num_heads * (key_dim + 1) * rows


def _linear_relative(num_heads, key_dim, causal, length, seed, feature_dim=None, **kwargs):
    """The library layer; with feature_dim its queries and keys get feature_dim features per head
    (key_dim=feature_dim) and its values key_dim (value_dim=key_dim): a wider state at the same model."""
    inner = keras_yoso.LinearRelativeAttention(num_heads, feature_dim or key_dim, value_dim=key_dim, seed=seed,
                                               name="linear_relative", **kwargs)
    return LibraryAttention(inner, causal)


register("linear_relative", {"horizon": 16, "feature_dim": None}, state_bytes=_linear_relative_state,
         description="Scaleformer (Favier & Dal'Maz Silva 2022): elu+1 linear attention + clipped relative "
                     "positions, keras_yoso.LinearRelativeAttention")(_linear_relative)
register("linear_relative_nohorizon", {"horizon": None, "feature_dim": None}, state_bytes=_linear_relative_state,
         description="LinearRelativeAttention(horizon=None): plain elu+1 linear attention "
                     "(the library's kernel)")(_linear_relative)


def _softmax(num_heads, key_dim, causal, length, seed, **kwargs):
    inner = keras.layers.MultiHeadAttention(num_heads, key_dim, seed=seed, name="softmax")
    return LibraryAttention(inner, causal)


register("softmax", {}, state_bytes=lambda h, d, length, **_: 2 * FLOAT_BYTES * h * d * length,  # KV cache
         description="softmax attention, keras.layers.MultiHeadAttention")(_softmax)


# ----------------------------------------------------------------------------- the floor

NO_ATTENTION = "none"


class NoAttention(keras.layers.Layer):
    """No attention: the branch returns zeros, so a block keeps only its other parts (the causal
    models' short convolution, the encoders' feed-forward). The floor a run must beat: a run that does
    no better than this model learned nothing from attention (run.py judges every run against it)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def compute_output_shape(self, input_shape, *args, **kwargs):
        return tuple(input_shape)

    def call(self, x, padding_mask=None, training=None):
        return ops.zeros_like(x)


register(NO_ATTENTION, {}, state_bytes=lambda h, d, length, **_: 0,
         description="no attention (zeros): the floor every attention must beat")(
    lambda h, d, causal, length, seed, **kw: NoAttention(name="no_attention"))


# ----------------------------------------------------------------------------- baselines (keras.ops)

class ProjectedAttention(keras.layers.Layer):
    """Query/key/value projections to `[B, T, heads, key_dim]`, an attention core (`attend`, in
    subclasses) and the output projection back to the input width, like MultiHeadAttention."""

    shared_qk = False  # Reformer: keys are the (normalized) queries, no key projection

    def __init__(self, num_heads, key_dim, causal, seed=None, feature_dim=None, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True  # padding arrives as `padding_mask`; a Keras mask passes through
        self.num_heads, self.key_dim, self.causal, self.seed = num_heads, key_dim, causal, seed
        # queries and keys get feature_dim features per head (the state's width; issue 43 item 4 widens
        # it), values key_dim; None: key_dim
        self.feature_dim = key_dim if feature_dim is None else int(feature_dim)
        if self.feature_dim < 1:
            raise ValueError(f"feature_dim: expected a positive integer or None, got {feature_dim!r}")

    def build(self, input_shape):
        width = input_shape[-1]
        inner = self.num_heads * self.key_dim
        names = ("query", "value") if self.shared_qk else ("query", "key", "value")
        self.dims = {name: self.key_dim if name == "value" else self.feature_dim for name in names}
        self.projections = {name: keras.layers.Dense(self.num_heads * self.dims[name], name=name) for name in names}
        for layer in self.projections.values():
            layer.build(input_shape)
        self.output_dense = keras.layers.Dense(width, name="attention_output")
        self.output_dense.build(tuple(input_shape[:-1]) + (inner,))
        self.build_core(input_shape)

    def build_core(self, input_shape):
        """Subclasses create their own weights here."""

    def compute_output_shape(self, input_shape, *args, **kwargs):
        return tuple(input_shape)

    def call(self, x, padding_mask=None, training=None):
        batch, length = ops.shape(x)[0], ops.shape(x)[1]
        heads = {name: ops.cast(ops.reshape(layer(x), (batch, length, self.num_heads, self.dims[name])), "float32")
                 for name, layer in self.projections.items()}
        out = self.attend(heads["query"], heads.get("key"), heads["value"], padding_mask)
        out = ops.reshape(ops.cast(out, self.compute_dtype), (batch, length, self.num_heads * self.key_dim))
        return self.output_dense(out)

    def attend(self, q, k, v, mask):
        """[B, T, H, D] float32 heads (k None when shared_qk), mask [B, T] bool or None -> [B, T, H, D]."""
        raise NotImplementedError


_NO_SCALE = -1e30  # key_log_scale of a padded key, and the scale of an empty prefix: exp(-1e30 - M) = 0


def _masked_keys(k, mask):
    """Key features / keys with padded positions set to 0 (so they add nothing to kernel sums)."""
    return k if mask is None else k * ops.cast(mask, k.dtype)[:, :, None, None]


def kernel_attention(phi_q, phi_k, v, causal, mask=None, chunk_size=64, epsilon=1e-6, key_log_scale=None):
    """Linear (kernelized) attention: out_i = sum_j <phi_q_i, k_j> v_j / (sum_j <phi_q_i, k_j> + epsilon)
    over j <= i (causal) or all unpadded j (Katharopoulos et al. 2020, eq. 4-6), with the key features
    k_j = exp(key_log_scale_j) phi_k_j (phi_k_j alone when key_log_scale is None).

    phi_q, phi_k: [B, T, H, F] nonnegative features; v: [B, T, H, D]; key_log_scale: [B, T, H] or None
    -> [B, T, H, D]. The denominator rides along as an extra all-ones value column.

    key_log_scale lets a caller hand over keys whose features would overflow or underflow float32 if
    exponentiated whole (Performer's exp(w . k - |k|^2 / 2)): every sum is taken relative to the largest
    scale it contains, the running maximum M_i = max_{j <= i} key_log_scale_j (causal) or the maximum
    over the unpadded keys (bidirectional), so no factor exp(key_log_scale_j - M_i) exceeds 1 and the key
    with the largest scale enters with its own phi_k. M_i multiplies numerator and denominator alike, so
    the result is the formula above exactly, and causal outputs depend on keys j <= i only (online
    softmax does the same with its running max). The caller stops the gradient through key_log_scale.

    Causal: prefix sums over chunks of `chunk_size` rows -- inside a chunk the masked [C, C] products,
    across chunks the exclusive prefix of the per-chunk states sum_j k_j [v_j, 1]^T ([F, D + 1]); the same
    numbers as the paper's per-position cumulative sum (eq. 8), with O(T (C + F D)) work and no
    [T, F, D] tensor. With key_log_scale each chunk's state is taken relative to the chunk's largest
    scale and the prefix is an associative scan that rescales to the larger of two scales.
    """
    phi_k = _masked_keys(phi_k, mask)
    v1 = ops.concatenate([v, ops.ones_like(v[..., :1])], axis=-1)
    if key_log_scale is not None and mask is not None:  # padded keys never set the reference scale
        key_log_scale = ops.where(ops.cast(mask, "bool")[:, :, None], key_log_scale, _NO_SCALE)
    if not causal:
        if key_log_scale is not None:
            reference = ops.max(key_log_scale, axis=1, keepdims=True)
            phi_k = phi_k * ops.exp(key_log_scale - reference)[..., None]
        kv = ops.einsum("bthf,bthe->bhfe", phi_k, v1)
        out = ops.einsum("bthf,bhfe->bthe", phi_q, kv)
        return out[..., :-1] / (out[..., -1:] + epsilon)
    batch, length, heads = ops.shape(phi_q)[:3]
    chunk = min(chunk_size, length)
    chunks = -(-length // chunk)
    pad = chunks * chunk - length

    def blocks(x):
        x = ops.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (len(x.shape) - 2)) if pad else x
        return ops.reshape(x, (batch, chunks, chunk) + tuple(x.shape[2:]))

    q, k, vv = blocks(phi_q), blocks(phi_k), blocks(v1)
    lower = ops.cast(ops.tril(ops.ones((chunk, chunk))), q.dtype)  # key j <= query i inside a chunk
    scores = ops.einsum("bnihf,bnjhf->bnhij", q, k) * lower
    if key_log_scale is None:
        states = ops.einsum("bnjhf,bnjhe->bnhfe", k, vv)
        before = ops.cumsum(states, axis=1) - states  # sum over the earlier chunks only
        inter = ops.einsum("bnihf,bnhfe->bnihe", q, before)
    else:
        scale = ops.transpose(blocks(key_log_scale), (0, 1, 3, 2))  # [B, N, H, C]
        chunk_max = ops.max(scale, axis=-1)  # [B, N, H]
        states = ops.einsum("bnjhf,bnjhe,bnhj->bnhfe", k, vv, ops.exp(scale - chunk_max[..., None]))

        def merge(a, b):  # (scale, state relative to it) of two spans -> of their union
            top = ops.maximum(a[0], b[0])
            return top, (a[1] * ops.exp(a[0] - top)[..., None, None] + b[1] * ops.exp(b[0] - top)[..., None, None])

        upto_max, upto = ops.associative_scan(merge, (chunk_max, states), axis=1)  # chunks 0..n
        earlier_max = ops.pad(upto_max[:, :-1], ((0, 0), (1, 0), (0, 0)), constant_values=_NO_SCALE)
        earlier = ops.pad(upto[:, :-1], ((0, 0), (1, 0), (0, 0), (0, 0), (0, 0)))  # chunks 0..n-1
        within = ops.max(ops.where(ops.cast(lower, "bool"), scale[..., None, :], _NO_SCALE), axis=-1)  # [B,N,H,i]
        running_max = ops.maximum(earlier_max[..., None], within)  # M_i
        scores = scores * ops.exp(ops.minimum(scale[..., None, :] - running_max[..., :, None], 0.0))
        inter = ops.einsum("bnihf,bnhfe,bnhi->bnihe", q, earlier, ops.exp(earlier_max[..., None] - running_max))
    intra = ops.einsum("bnhij,bnjhe->bnihe", scores, vv)
    out = ops.reshape(intra + inter, (batch, chunks * chunk, heads, ops.shape(v1)[-1]))[:, :length]
    return out[..., :-1] / (out[..., -1:] + epsilon)


class LinearAttention(ProjectedAttention):
    """Linear attention with phi(x) = elu(x) + 1 (Katharopoulos et al. 2020, "Transformers are RNNs", eq. 7)."""

    def __init__(self, *args, chunk_size=64, **kwargs):
        super().__init__(*args, **kwargs)
        self.chunk_size = chunk_size

    def attend(self, q, k, v, mask):
        phi = lambda x: ops.elu(x) + 1.0  # noqa: E731
        return kernel_attention(phi(q), phi(k), v, self.causal, mask, self.chunk_size)


register("linear", {"chunk_size": 64, "feature_dim": None},
         # sum phi(k) [v, 1]^T: [feature_dim, value_dim + 1] per head
         state_bytes=lambda h, d, length, feature_dim=None, **_: FLOAT_BYTES * h * (feature_dim or d) * (d + 1),
         description="linear attention, elu+1 features (Katharopoulos et al. 2020)")(
    lambda h, d, causal, length, seed, **kw: LinearAttention(h, d, causal, seed, name="linear", **kw))


def orthogonal_gaussian(num_features, dim, rng):
    """[num_features, dim]: blocks of `dim` orthogonal rows, each row rescaled to the norm of a
    Gaussian vector (the ORF construction of Performer §2.4 / Yu et al. 2016)."""
    blocks = []
    for _ in range(-(-num_features // dim)):
        q, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
        blocks.append(q.T)
    rows = np.concatenate(blocks)[:num_features]
    return (rows * np.linalg.norm(rng.standard_normal((num_features, dim)), axis=1, keepdims=True)).astype("float32")


class PerformerAttention(ProjectedAttention):
    """FAVOR+ (Choromanski et al. 2021, "Rethinking Attention with Performers", eq. 5 and Lemma 1):
    softmax kernel exp(<q, k>/sqrt(d)) estimated with positive orthogonal random features
    phi(x) = exp(w_f . x - |x|^2 / 2) / sqrt(F), x = q / d^(1/4) (or k / d^(1/4)), then
    linear attention (`kernel_attention`, causal by prefix sums), all in float32.

    Numerical stabilisation, as the paper's code does it (the kernel is unchanged, only rescaled):
    each exponent has its maximum subtracted before exp. A query's maximum over its features is a
    per-row factor that the normalisation cancels. A key's maximum over its features, s_j, is handed to
    `kernel_attention` as key_log_scale, which weighs key j by exp(s_j - max_{j' <= i} s_j') for query
    i -- the running maximum, where the official code takes the maximum over the whole sequence, which
    in a causal model would let later keys change earlier outputs through rounding. So no exponent
    is positive, the largest key feature so far is exactly 1 / sqrt(F), and the denominator has an
    epsilon of 1e-6 (the official code's). The earlier version subtracted a data-independent bound from
    the keys instead: once training grew the keys, every key feature underflowed, the denominator
    went below 1e-19, its square (in the gradient) to 0 beside an epsilon of 1e-30, and the runs on
    MQAR (64, 4) turned NaN at steps 186 and 53 of 400 (docs/data/quality_mqar_2026-11-25.json).
    The features are drawn once from `seed` and kept fixed (the paper may redraw them during training).
    """

    def __init__(self, *args, num_features=64, chunk_size=64, **kwargs):
        super().__init__(*args, **kwargs)
        self.num_features, self.chunk_size = num_features, chunk_size

    def build_core(self, input_shape):
        rng = np.random.default_rng(self.seed)
        w = orthogonal_gaussian(self.num_features, self.key_dim, rng)
        self.features = self.add_weight(name="random_features", shape=w.shape, trainable=False,
                                        initializer=keras.initializers.Constant(w))

    def attend(self, q, k, v, mask):
        scale = self.key_dim ** -0.25
        w = ops.convert_to_tensor(self.features)

        def exponent(x):
            x = x * scale
            return ops.einsum("bthd,fd->bthf", x, w) - 0.5 * ops.sum(x * x, axis=-1, keepdims=True)

        zq, zk = exponent(q), exponent(k)
        key_max = ops.stop_gradient(ops.max(zk, axis=-1, keepdims=True))
        norm = 1.0 / math.sqrt(self.num_features)
        phi_q = ops.exp(zq - ops.stop_gradient(ops.max(zq, axis=-1, keepdims=True))) * norm
        phi_k = ops.exp(zk - key_max) * norm
        return kernel_attention(phi_q, phi_k, v, self.causal, mask, self.chunk_size, key_log_scale=key_max[..., 0])


register("performer", {"num_features": 64, "chunk_size": 64},
         state_bytes=lambda h, d, length, num_features, **_: FLOAT_BYTES * h * num_features * (d + 1),
         description="Performer FAVOR+ positive orthogonal random features (Choromanski et al. 2021)")(
    lambda h, d, causal, length, seed, **kw: PerformerAttention(h, d, causal, seed, name="performer", **kw))


class ReformerAttention(ProjectedAttention):
    """Reformer LSH attention (Kitaev et al. 2020, §2-3), compact version.

    Shared QK: keys are the unit-normalised queries (no key projection). Each of `num_hashes`
    rounds draws angular LSH h(x) = argmax([xR; -xR]) over `num_buckets` buckets (R: random
    [key_dim, num_buckets / 2], drawn once from `seed`, fixed), sorts the positions by (bucket,
    position), cuts the sorted order into chunks of `chunk_size` and lets each chunk attend to itself
    and the previous chunk, only to keys of the same bucket; attending to oneself is allowed only
    when nothing else is (score -1e5). The rounds are combined with weights softmax(logsumexp of
    each round's scores) (§2, "multi-round LSH").

    Causal: besides key position <= query position, a query sees only the chunk_size - 1 most
    recent keys of its bucket before it (sorted-order distance < chunk_size). Plain chunking lets
    the chunk boundaries -- and so which earlier keys a query sees -- depend on the buckets of later
    tokens; this rule depends on earlier tokens only. Deviations: fixed (not per-step) random
    rotations; duplicates across rounds are not de-duplicated.
    """

    shared_qk = True

    def __init__(self, *args, num_hashes=2, chunk_size=64, num_buckets=None, length=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.num_hashes, self.chunk_size = num_hashes, chunk_size
        if num_buckets is None:  # about one chunk of tokens per bucket (the paper's setting)
            num_buckets = max(2, 2 * round(length / (2 * chunk_size)))
        if num_buckets % 2:
            raise ValueError(f"reformer num_buckets must be even, got {num_buckets}")
        self.num_buckets = num_buckets

    def build_core(self, input_shape):
        rng = np.random.default_rng(self.seed)
        r = rng.standard_normal((self.num_hashes, self.key_dim, self.num_buckets // 2)).astype("float32")
        self.rotations = self.add_weight(name="rotations", shape=r.shape, trainable=False,
                                         initializer=keras.initializers.Constant(r))

    def attend(self, q, _, v, mask):
        batch, length, heads, dim = ops.shape(q)
        chunk = min(self.chunk_size, length)
        chunks = -(-length // chunk)
        padded = chunks * chunk
        n = batch * heads

        def rows(x):  # [B, T, H, D] -> [B*H, padded, D]
            x = ops.reshape(ops.transpose(x, (0, 2, 1, 3)), (n, length, ops.shape(x)[-1]))
            return ops.pad(x, ((0, 0), (0, padded - length), (0, 0))) if padded > length else x

        x, vv = rows(q), rows(v)
        keys = x * ops.rsqrt(ops.maximum(ops.sum(x * x, axis=-1, keepdims=True), 1e-12))
        valid = ops.ones((batch, length), "bool") if mask is None else ops.cast(mask, "bool")
        valid = ops.reshape(ops.repeat(valid[:, None], heads, axis=1), (n, length))
        valid = ops.pad(valid, ((0, 0), (0, padded - length))) if padded > length else valid
        positions = ops.broadcast_to(ops.arange(padded, dtype="int32")[None], (n, padded))
        sorted_index = ops.arange(padded, dtype="int32")
        rotations = ops.convert_to_tensor(self.rotations)
        outs, lses = [], []
        for r in range(self.num_hashes):
            proj = ops.einsum("ntd,db->ntb", ops.stop_gradient(keys), rotations[r])
            buckets = ops.cast(ops.argmax(ops.concatenate([proj, -proj], axis=-1), axis=-1), "int32")
            buckets = ops.where(valid, buckets, self.num_buckets)  # padding sorts last, in its own bucket
            order = ops.argsort(buckets * padded + positions, axis=-1)
            undo = ops.argsort(order, axis=-1)

            def gather(t):
                return ops.take_along_axis(t, order[..., None] if len(t.shape) == 3 else order, axis=1)

            def blocks(t, back):  # [n, padded, ...] -> [n, chunks, chunk (+ chunk), ...]
                t = ops.reshape(t, (n, chunks, chunk) + tuple(t.shape[2:]))
                return ops.concatenate([ops.roll(t, 1, axis=1), t], axis=2) if back else t

            sq, sk, sv = gather(x), gather(keys), gather(vv)
            sb, sp, svalid = gather(buckets), gather(positions), gather(valid)
            sidx = ops.broadcast_to(sorted_index[None], (n, padded))
            scores = ops.einsum("ncid,ncjd->ncij", blocks(sq, False), blocks(sk, True)) / math.sqrt(dim)
            qb, kb = blocks(sb, False)[..., :, None], blocks(sb, True)[..., None, :]
            qp, kp = blocks(sp, False)[..., :, None], blocks(sp, True)[..., None, :]
            allowed = ops.logical_and(ops.equal(qb, kb), blocks(svalid, True)[..., None, :])
            if self.causal:
                distance = blocks(sidx, False)[..., :, None] - blocks(sidx, True)[..., None, :]
                recent = ops.logical_and(distance >= 0, distance < chunk)
                allowed = ops.logical_and(allowed, ops.logical_and(kp <= qp, recent))
            scores = ops.where(allowed, scores, -1e9)
            scores = ops.where(ops.logical_and(allowed, ops.equal(qp, kp)), -1e5, scores)
            lse = ops.logsumexp(scores, axis=-1, keepdims=True)
            out = ops.einsum("ncij,ncjd->ncid", ops.exp(scores - lse), blocks(sv, True))
            outs.append(ops.take_along_axis(ops.reshape(out, (n, padded, dim)), undo[..., None], axis=1))
            lses.append(ops.take_along_axis(ops.reshape(lse, (n, padded, 1)), undo[..., None], axis=1))
        weights = ops.softmax(ops.stack(lses), axis=0)
        out = ops.sum(ops.stack(outs) * weights, axis=0)[:, :length]
        return ops.transpose(ops.reshape(out, (batch, heads, length, dim)), (0, 2, 1, 3))


register("reformer", {"num_hashes": 2, "chunk_size": 64, "num_buckets": None},
         state_bytes=lambda h, d, length, **_: 2 * FLOAT_BYTES * h * d * length,  # KV cache, as softmax
         description="Reformer shared-QK angular LSH, sorted chunks (Kitaev et al. 2020)")(
    lambda h, d, causal, length, seed, **kw: ReformerAttention(h, d, causal, seed, name="reformer", length=length,
                                                               **kw))


class SlidingWindowAttention(ProjectedAttention):
    """Local softmax attention (the sliding-window part of Longformer, Beltagy et al. 2020, and
    BigBird): causal, query i sees keys i - window + 1 .. i; bidirectional, keys within window // 2
    on either side. A [T, T] banded mask (fine at CPU sizes; O(T^2) work)."""

    def __init__(self, *args, window=64, **kwargs):
        super().__init__(*args, **kwargs)
        self.window = window

    def attend(self, q, k, v, mask):
        length = ops.shape(q)[1]
        i = ops.arange(length)[:, None]
        j = ops.arange(length)[None, :]
        if self.causal:
            band = ops.logical_and(j <= i, j > i - self.window)
        else:
            band = ops.abs(i - j) <= self.window // 2
        allowed = band[None, None]
        if mask is not None:
            allowed = ops.logical_and(allowed, ops.cast(mask, "bool")[:, None, None, :])
        scores = ops.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(self.key_dim)
        weights = ops.softmax(ops.where(allowed, scores, -1e9), axis=-1)
        return ops.einsum("bhij,bjhd->bihd", weights, v)


register("sliding_window", {"window": 64},
         state_bytes=lambda h, d, length, window, **_: 2 * FLOAT_BYTES * h * d * window,  # last w keys, values
         description="local softmax attention of a window w (Longformer / BigBird local part)")(
    lambda h, d, causal, length, seed, **kw: SlidingWindowAttention(h, d, causal, seed, name="sliding_window", **kw))


class LinformerAttention(ProjectedAttention):
    """Linformer (Wang et al. 2020, eq. 7): keys and values projected along the sequence to k rows,
    K' = E K, V' = F K (E, F: learned [k, max_length], one pair per layer shared by the heads), then
    softmax attention of the T queries over the k projected rows. Bidirectional only. Padded
    positions are zeroed before the projection; shorter sequences use the first T columns of E, F."""

    def __init__(self, *args, k=64, max_length=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.k, self.max_length = k, max_length

    def build_core(self, input_shape):
        init = keras.initializers.RandomNormal(stddev=1.0 / math.sqrt(self.max_length), seed=self.seed)
        self.e = self.add_weight(name="key_projection", shape=(self.k, self.max_length), initializer=init)
        self.f = self.add_weight(name="value_projection", shape=(self.k, self.max_length), initializer=init)

    def attend(self, q, k, v, mask):
        length = ops.shape(q)[1]
        e = ops.cast(ops.convert_to_tensor(self.e), "float32")[:, :length]
        f = ops.cast(ops.convert_to_tensor(self.f), "float32")[:, :length]
        k2 = ops.einsum("kt,bthd->bkhd", e, _masked_keys(k, mask))
        v2 = ops.einsum("kt,bthd->bkhd", f, _masked_keys(v, mask))
        scores = ops.einsum("bihd,bkhd->bhik", q, k2) / math.sqrt(self.key_dim)
        return ops.einsum("bhik,bkhd->bihd", ops.softmax(scores, axis=-1), v2)


register("linformer", {"k": 64}, causal=False,
         description="Linformer, keys/values projected along the sequence to k (Wang et al. 2020)")(
    lambda h, d, causal, length, seed, **kw: LinformerAttention(h, d, causal, seed, name="linformer",
                                                                max_length=length, **kw))


# ----------------------------------------------------------------------------- keras-hub Gated DeltaNet

GATED_DELTANET_SOURCE = "keras_hub.src.models.qwen3_5.qwen3_5_gated_delta_net.Qwen3_5GatedDeltaNet"


class GatedDeltaNet(keras.layers.Layer):
    """keras-hub's Gated DeltaNet (Yang et al. 2025) layer of Qwen3.5 (keras-hub >= 0.32): its own
    q/k/v/gate projections, causal depthwise conv of kernel 4 + SiLU on q, k, v, L2-normalised q, k,
    the chunked gated delta rule S_t = a_t S_{t-1} (I - b_t k_t k_t^T) + b_t v_t k_t^T, a gated RMSNorm
    and the output projection. Causal only. keras-hub is an optional benchmark dependency
    (`pip install keras-hub`); importing it loads TensorFlow when installed (slow start).

    The layer is keras-hub's, called as Qwen3.5 calls it (checked: its chunked form equals its recurrent
    form to 2e-7, all 9 of its weights receive gradients); only the initial values of its decay parameters
    are ours, those of the Gated DeltaNet paper's code for training from scratch (flash-linear-attention's
    GatedDeltaNet, after Mamba-2): A = exp(A_log) ~ U(0, 16) and dt_bias = softplus^-1(dt), dt log-uniform
    in [1e-3, 1e-1], so the decay a_t = exp(-A softplus(x_t W_a + dt_bias)) starts close to 1 (median
    0.99 per token). keras-hub initialises A_log = 0 and dt_bias = 1 -- placeholders that a Qwen3.5
    checkpoint overwrites -- a decay of about 0.28 per token: a token 60 positions back weighs 1e-34 in the
    state, the output 16 positions after an input changes by 1e-6 when that input changes by 1, and no
    gradient can teach the layer to remember longer. So initialised it learned nothing on MQAR (64, 4)
    (docs/data/quality_mqar_2026-11-25.json: test loss 8.37 after 400 steps; the model with no attention
    reaches 8.36).
    Initialised as here, the same run (JAX, lr 1e-2, seed 0) reaches test loss 7.62, still above
    softmax's 0.31 and with 0.004 accuracy: it has started to learn, more slowly than softmax does.
    """

    DT_RANGE = (1e-3, 1e-1)
    DT_FLOOR = 1e-4
    A_RANGE = (0.0, 16.0)

    def __init__(self, num_heads, key_dim, conv_kernel=4, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True
        try:
            from keras_hub.src.models.qwen3_5.qwen3_5_gated_delta_net import Qwen3_5GatedDeltaNet
        except ImportError as error:
            raise ImportError(f"--attention gated_deltanet needs keras-hub >= 0.32 ({GATED_DELTANET_SOURCE}): "
                              f"pip install keras-hub (an optional benchmark dependency). Import failed: {error}"
                              ) from error
        self.num_heads, self.key_dim, self.conv_kernel, self.seed = num_heads, key_dim, conv_kernel, seed
        self._cls = _from_scratch(Qwen3_5GatedDeltaNet)

    def build(self, input_shape):
        rng = np.random.default_rng(self.seed)
        a = rng.uniform(*self.A_RANGE, self.num_heads)
        dt = np.maximum(np.exp(rng.uniform(*np.log(self.DT_RANGE), self.num_heads)), self.DT_FLOOR)
        initial = {"A_log": np.log(a), "dt_bias": dt + np.log(-np.expm1(-dt))}  # softplus(dt_bias) = dt
        self.inner = self._cls(hidden_size=input_shape[-1], linear_num_key_heads=self.num_heads,
                               linear_num_value_heads=self.num_heads, linear_key_head_dim=self.key_dim,
                               linear_value_head_dim=self.key_dim, linear_conv_kernel_dim=self.conv_kernel,
                               initial_values=initial, name="gated_delta_net")
        self.inner.build(input_shape)

    def compute_output_shape(self, input_shape, *args, **kwargs):
        return tuple(input_shape)

    def call(self, x, padding_mask=None, training=None):
        return self.inner(x, attention_mask=padding_mask)


def _from_scratch(layer_class):
    """`layer_class` (keras-hub's Qwen3_5GatedDeltaNet) taking `initial_values` {weight name: array}: those
    weights are created with a Constant initializer of that value. An initializer, not an assign() after
    build: Keras builds a model inside a stateless scope (on TensorFlow, JAX and PyTorch), where assignments in
    build() are dropped (tried: A_log stayed 0 in the model on all three)."""

    class FromScratch(layer_class):
        def __init__(self, *args, initial_values=None, **kwargs):
            super().__init__(*args, **kwargs)
            self.initial_values = dict(initial_values or {})

        def add_weight(self, *args, name=None, initializer=None, **kwargs):
            if name in self.initial_values:
                initializer = keras.initializers.Constant(np.asarray(self.initial_values[name], "float32"))
            return super().add_weight(*args, name=name, initializer=initializer, **kwargs)

    FromScratch.__name__ = f"{layer_class.__name__}FromScratch"
    return FromScratch


register("gated_deltanet", {"conv_kernel": 4}, bidirectional=False, requires=("keras_hub",),
         # recurrent state [key_dim, value_dim] per head + the conv history of q, k, v (kernel - 1 rows)
         state_bytes=lambda h, d, length, conv_kernel, **_: FLOAT_BYTES * h * (d * d + 3 * d * (conv_kernel - 1)),
         description="Gated DeltaNet, keras-hub's Qwen3.5 layer (optional dependency), initialised for training "
                     "from scratch as the paper's code does")(
    lambda h, d, causal, length, seed, **kw: GatedDeltaNet(h, d, seed=seed, name="gated_deltanet", **kw))
