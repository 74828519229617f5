"""`transfer_attention`: a converted model's YOSO layers trained, one at a time and with everything else frozen,
to reproduce the softmax layers they replaced (issue 42, item 3; the attention transfer of LoLCATs, Zhang et al.
2025, and Hedgehog, Zhang et al. 2024, with YOSO's angular kernel in place of a learned feature map).

Why the queries and keys need a map. YOSO attends by angle alone: query i weighs key j by the collision
probability (1 - theta_ij/pi)^tau (paper eq. 2, YOSO-E) of the L2-normalized q_i and k_j, so the per-token norms
that softmax's exp(q_i.k_j / sqrt(d)) reads are dropped (docs/results.md: the largest single cause of a
converted layer's error). A temperature per head cannot help either: it changes no angle. What can is a map
of q and k before the normalization. Per head h the student computes

    q'_i = q_i A_h + a_h,   k'_j = k_j B_h + b_h       (A_h, B_h `[key_dim, key_dim]`, a_h, b_h `[key_dim]`)

and then the layer's own N-YOSO: the angles of the mapped rows, through the offsets a_h, b_h, depend on the
norms of q_i A_h and k_j B_h, so the map can carry what the norms carried. With the per-head output scale s_h
(YosoAttention's `output_scale`) these are the only trained numbers: 2 H d (d + 1) + H per layer (0.7% of
all-MiniLM-L6-v2), the projections, values and everything else frozen. The map is affine in q, which is
affine in the layer's input, so it folds into the query and key projections exactly (kernel W_h A_h, bias
c_h A_h + a_h): the result is a plain YosoAttention layer, saved and loaded like any other.

A layer converted with `local_window=w` (an exact softmax window beside YOSO, as LoLCATs keeps one) also
trains its per-head window scale g_h (H more numbers, zero at the start): the window reads the same mapped
queries and keys as YOSO, so the folded projections give it what the student had.

The student is, by default, the layer itself: sampled YOSO drawing fresh hash functions at each step (as
`training=True` does), so the loss it minimizes is the expected one over hash functions, the sampling noise
included, through the layer's own gradient estimator (eq. 4 or the collision estimator). With
`student="expectation"` it is YOSO-E (`use_expectation=True`: the exact expectation of eq. 2 and its exact
derivative, O(T S)): the map then fits what sampled YOSO estimates, not its noise. It trains with Adam
(cosine decay) on the mean squared error of the layer's output (after the output projection, what the
residual receives, over the unpadded queries; both sides divided by the root mean square of the softmax
output so that one learning rate suits every layer) against the softmax layer's, given the input the
softmax model feeds that layer, so errors do not compound from layer to layer.
"""

import math
import time

import keras
import numpy as np
from keras import ops

from keras_yoso import _validation
from keras_yoso.calibration import _batches
from keras_yoso.calibration import _checked_pairs
from keras_yoso.calibration import _copy_weights
from keras_yoso.calibration import _numpy
from keras_yoso.calibration import _record_calls
from keras_yoso.calibration import _rebuilt
from keras_yoso.calibration import _reference_for
from keras_yoso.calibration import _relative_error
from keras_yoso.calibration import _statistics
from keras_yoso.layers.yoso_attention import YosoAttention

# The forms a student can take: the layer's own (sampled YOSO with fresh hash functions at each step, or YOSO-E
# for a YOSO-E layer), or YOSO-E for every layer.
_STUDENTS = (None, "expectation")

# The inputs of an attention call that the student trains on (arrays); the rest (use_causal_mask) are fixed.
_ARRAYS = ("query", "value", "key", "query_mask", "value_mask", "key_mask", "attention_mask")


class _Student(YosoAttention):
    """A YOSO-E copy of a converted layer whose queries and keys pass through a trained per-head affine map
    before the normalization, and whose per-head output scale is trained (module docstring); its projections
    are frozen once built."""

    def _build_attention(self, query_shape, value_shape):
        super()._build_attention(query_shape, value_shape)
        heads, size = self._num_heads, self._key_dim
        identity = np.broadcast_to(np.eye(size, dtype="float32"), (heads, size, size))

        def weight(name, value):
            return self.add_weight(name=name, shape=value.shape, dtype="float32", autocast=False,
                                   initializer=keras.initializers.Constant(np.array(value, "float32")))

        self.query_map, self.key_map = weight("query_map", identity), weight("key_map", identity)
        # The offsets fold into the projections' biases: a layer without biases trains none.
        self.query_offset = weight("query_offset", np.zeros((heads, size))) if self._use_bias else None
        self.key_offset = weight("key_offset", np.zeros((heads, size))) if self._use_bias else None
        self.head_scale = weight("head_scale", np.ones(heads))  # _train starts it at its least-squares fit

    def _projected_heads(self, query, value, key, query_mask, key_mask):
        query_heads, key_heads, value_heads = super()._projected_heads(query, value, key, query_mask, key_mask)
        query_heads = ops.einsum("bthd,hde->bthe", query_heads, self.query_map)
        key_heads = ops.einsum("bthd,hde->bthe", key_heads, self.key_map)
        if self._use_bias:
            query_heads, key_heads = query_heads + self.query_offset, key_heads + self.key_offset
        # Padded keys stay zero (the composite's masks do the rest).
        return query_heads, ops.where(key_mask[:, :, None, None], key_heads, 0.0), value_heads

    def _scaled(self, heads):
        return heads * ops.cast(self.head_scale, heads.dtype)[None, None, :, None]

    def freeze_projections(self):
        for layer in (self.query_dense, self.key_dense, self.value_dense, self.output_dense):
            layer.trainable = False
        if self._conv_window is not None:
            self._conv_kernel.trainable = False

    def folded(self):
        """The trained map folded into the projections: {relative weight path: value} of the query and key
        projections (kernel `[features, heads, key_dim]`, bias `[heads, key_dim]`), and the output scale."""
        weights = {}
        for name, dense, matrix, offset in (("query", self.query_dense, self.query_map, self.query_offset),
                                            ("key", self.key_dense, self.key_map, self.key_offset)):
            matrix = _numpy(matrix).astype(np.float64)
            kernel = _numpy(dense.kernel).astype(np.float64)
            weights[f"{name}/kernel"] = np.einsum("fhd,hde->fhe", kernel, matrix).astype("float32")
            if self._use_bias:
                bias = np.einsum("hd,hde->he", _numpy(dense.bias).astype(np.float64), matrix)
                weights[f"{name}/bias"] = (bias + _numpy(offset)).astype("float32")
        if self._local_window is not None:
            weights["local_window_scale"] = _numpy(self._local_window_scale).astype("float32")
        return weights, [float(s) for s in _numpy(self.head_scale)]


class _StudentModel(keras.Model):
    """The student called on a dict of the recorded arrays, its output divided by the target's scale."""

    def __init__(self, student, fixed, scale):
        super().__init__(name="transfer_student")  # TensorFlow's name scopes refuse the default, "_student_model"
        self.student, self.fixed, self.scale = student, fixed, scale

    def call(self, inputs, training=False):
        # Sampled YOSO draws fresh hash functions at each training step (its loss: the expected one over them).
        return self.student(**inputs, **self.fixed, training=training) / self.scale


def _training_data(calls):
    """The recorded calls of one layer as arrays along axis 0: ({argument: array}, fixed keyword arguments,
    target `[N, T, features]`, query mask `[N, T]` float32)."""
    names = [n for n in _ARRAYS if n in calls[0][0]]
    arrays = {n: np.concatenate([kwargs[n] for kwargs, _ in calls]) for n in names}
    fixed = {n: v for n, v in calls[0][0].items() if n not in _ARRAYS}
    target = np.concatenate([t for _, t in calls]).astype("float32")
    mask = arrays.get("query_mask")
    mask = np.ones(target.shape[:2], "float32") if mask is None else mask.astype("float32")
    return arrays, fixed, target, mask


def _student(attention, calls, expectation):
    """A `_Student` of `attention` (with `expectation`, YOSO-E at its tau with the exact derivative), built
    with its weights copied."""
    config = {**attention.get_config(), "dropout": 0.0}
    if expectation:
        config.update(use_expectation=True, backward="collision")
    config.pop("name", None)
    student = _Student.from_config(config)
    student(**calls[0][0], training=False)
    _copy_weights(attention, student)
    student.freeze_projections()
    return student


class _Progress(keras.callbacks.Callback):
    """Prints the loss of the student every `every` epochs on one line."""

    def __init__(self, every):
        super().__init__()
        self.every = every

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.every == 0:
            print(f" {logs['loss']:.3f}", end="", flush=True)


def _train(attention, calls, steps, learning_rate, batch_size, verbose, label, expectation):
    """Trains a student of `attention` on its recorded calls; returns (folded weights, output scale, the
    student's relative error on the calls before and after, seconds)."""
    start = time.perf_counter()
    arrays, fixed, target, mask = _training_data(calls)
    weight = mask.sum()
    scale = float(np.sqrt((target ** 2 * mask[:, :, None]).sum() / (weight * target.shape[-1])))
    student = _student(attention, calls, expectation)
    # The scale starts at its least-squares fit to the softmax outputs (calibrate's, computed at scale 1).
    student.head_scale.assign(np.ones(attention.num_heads, "float32"))
    statistics = _statistics(student, calls)
    start_scale = np.linalg.lstsq(statistics[0], statistics[1], rcond=None)[0]
    student.head_scale.assign(start_scale.astype("float32"))
    before = _relative_error(statistics, start_scale)  # the start's error, from the fit's own statistics
    model = _StudentModel(student, fixed, scale)
    count = target.shape[0]
    batch_size = min(batch_size, count)
    steps_per_epoch = math.ceil(count / batch_size)
    epochs = max(1, math.ceil(steps / steps_per_epoch))

    def error():
        out = np.concatenate([_numpy(model({n: a[i:i + batch_size] for n, a in arrays.items()})) * scale
                              for i in range(0, count, batch_size)])
        difference = ((out - target) ** 2).sum(axis=-1) * mask
        return float(np.sqrt(difference.sum() / ((target ** 2).sum(axis=-1) * mask).sum()))

    start_values = [_numpy(v) for v in student.trainable_weights]
    schedule = keras.optimizers.schedules.CosineDecay(learning_rate, epochs * steps_per_epoch)
    model.compile(optimizer=keras.optimizers.Adam(schedule), loss="mse")
    if verbose:
        form = "YOSO-E" if expectation else f"sampled, m={attention.num_hashes}"
        print(f"transfer: {label}, {form} student, tau={attention.hash_code_len}: error {before:.3f}, loss", end="",
              flush=True)
    model.fit(arrays, target / scale, sample_weight=mask, batch_size=batch_size, epochs=epochs, shuffle=True,
              verbose=0, callbacks=[_Progress(max(1, epochs // 4))] if verbose else [])
    after = error()
    if after > before:  # never worse than the start on `inputs`: a rate too high, or too few steps
        for variable, value in zip(student.trainable_weights, start_values):
            variable.assign(value)
        after = before
    weights, output_scale = student.folded()
    return weights, output_scale, before, after, time.perf_counter() - start


def _assign(attention, weights):
    """`attention`'s query and key projections (and its local window's per-head scale, if it has one) take
    the folded `weights` ({relative path: value})."""
    for name, dense in (("query", attention.query_dense), ("key", attention.key_dense)):
        dense.kernel.assign(weights[f"{name}/kernel"])
        if attention.use_bias:
            dense.bias.assign(weights[f"{name}/bias"])
    if "local_window_scale" in weights:
        attention._local_window_scale.assign(weights["local_window_scale"])


def transfer_attention(model, original, inputs, steps=100, learning_rate=2e-2, batch_size=4, student=None,
                       verbose=True):
    """A new model: `model`'s YOSO layers trained to reproduce the softmax layers of `original` they replaced.

    For each YosoAttention of `model` (what `keras_yoso.replace_attention(original, "yoso", ...)` made, or
    `keras_yoso.calibrate` then made of it), `original` runs on `inputs` (unlabelled examples: text the
    model will read) and the input and output of its matching attention layer are recorded. A student of
    the layer, whose queries and keys pass through a per-head affine map before the normalization and whose
    per-head output scale is free (the module docstring: 2 H d (d + 1) + H numbers per layer, nothing else
    trained), is trained for `steps` Adam steps (cosine decay from `learning_rate`) to give the softmax
    layer's output on that input (the scale starts at `calibrate`'s least-squares fit). The map is folded into the layer's query and key projections and the
    scale becomes its `output_scale`; a layer with a `local_window` also trains that window's per-head scale
    (`local_window_scale`, from zero). A layer whose error on `inputs` (with its inference hash functions)
    ends above its start keeps the start (no map, the least-squares scale). Layers train one after another
    on the softmax model's hidden states.

    The result is an ordinary converted model (its YOSO layers' query and key projections and output scale
    changed; tau, num_hashes and everything else kept): fine-tune it, save it, or `calibrate` it as any
    other. Train on text other than the text you evaluate on. Cost: the softmax model once over `inputs`,
    then `steps` student steps per layer (a sampled student costs O(T) per step, a YOSO-E one O(T^2)).
    What it buys on all-MiniLM-L6-v2 (m = 32, tau = 8; docs/results.md): each layer's error against the
    softmax layer falls on held-out text (mean 0.81 to 0.65 at 512 tokens, 0.72 to 0.48 at 2,048); the
    mean-pooled embedding's cosine to the original's rises at 2,048 tokens (0.862 to 0.947), not at 512;
    with 200 steps on 16 texts to 0.950 and 0.948 on two seeds, and with `local_window=64` to 0.971 and 0.968.

    Args:
        model: The converted `keras.Model`, Functional or Sequential, with one YosoAttention per converted
            layer (a keras-hub decoder's self- and cross-attention share one config and are refused, as
            calibrate refuses them).
        original: The softmax `keras.Model` `model` was converted from (with `max_length`, the model before
            its positions were extended: its layers run over the extended positions as the converted
            model's do).
        inputs: What the models take, with the examples along axis 0, e.g. keras-hub's
            {"token_ids", "segment_ids", "padding_mask"}.
        steps: Adam steps per layer (>= 1).
        learning_rate: The peak learning rate (> 0) of the cosine decay.
        batch_size: Examples per forward pass and per step.
        student: None (default): each layer's own form, sampled YOSO with fresh hash functions each step (or
            YOSO-E for a `use_expectation=True` layer); "expectation": YOSO-E for every layer.
        verbose: Print, per layer, the error before, the loss as training goes and the error after (on the
            inputs, the layer's inference hash functions).

    Returns:
        A new model like `model`, whose YosoAttention layers have the trained query and key projections
        and `output_scale` (a `.keras` file keeps both); `model` is left unchanged.
    """
    if not isinstance(model, keras.Model):
        raise ValueError("transfer_attention expects the converted keras.Model as `model`. Received: "
                         f"{type(model).__name__}")
    if not isinstance(original, keras.Model):
        raise ValueError("transfer_attention expects the softmax keras.Model that `model` was converted from as "
                         f"`original`. Received: {type(original).__name__}")
    steps = _validation.integer(steps, "steps", 1, layer=True)
    learning_rate = _validation.positive_float(learning_rate, "learning_rate", layer=True)
    batch_size = _validation.integer(batch_size, "batch_size", 1, layer=True)
    if student not in _STUDENTS:
        raise ValueError(f"transfer_attention expects `student` in {_STUDENTS}: the layers' own form (None), or "
                         f"YOSO-E (\"expectation\"). Received: student={student!r}")
    verbose = _validation.boolean(verbose, "verbose", layer=True)
    reference = _reference_for(model, original)
    pairs = _checked_pairs(model, reference, "transfer_attention")
    for layer, _, attention, _ in pairs:
        if attention.causal:
            raise ValueError(f"transfer_attention trains a YOSO-E student, which has no causal form, and layer "
                             f"{layer.name!r} is causal (causal=True): transfer the attention of encoders.")
    batches, count = _batches(inputs, batch_size, "transfer_attention")
    start = time.perf_counter()
    records = _record_calls(reference, [old for _, _, _, old in pairs], batches)
    for (layer, _, _, _), calls in zip(pairs, records):
        if any(kwargs.get("use_causal_mask") for kwargs, _ in calls):
            raise ValueError(f"transfer_attention trains a YOSO-E student, which has no causal form, and the "
                             f"softmax layer matching {layer.name!r} is called with use_causal_mask=True: "
                             "transfer the attention of encoders.")
    if verbose:
        print(f"transfer: ran the softmax model on {count} example(s) in {len(batches)} batch(es): "
              f"{time.perf_counter() - start:.0f} s", flush=True)
    settings, weights = {}, {}
    for n, (layer, kind, attention, _) in enumerate(pairs):
        label = f"layer {layer.name!r} ({n + 1}/{len(pairs)})"
        expectation = attention.use_expectation or student == "expectation"
        folded, scale, before, after, seconds = _train(attention, records[n], steps, learning_rate, batch_size,
                                                       verbose, label, expectation)
        if verbose:
            print(f"; error {before:.3f} -> {after:.3f} ({seconds:.0f} s)", flush=True)
        settings[id(layer)] = (kind, {"output_scale": scale})
        weights[id(layer)] = folded

    def assign(old, new):  # the new unit layer's one YosoAttention (checked by _checked_pairs) takes the map
        if id(old) in weights:
            attention = next(sub for sub in new._flatten_layers(include_self=True, recursive=True)
                             if isinstance(sub, YosoAttention))
            _assign(attention, weights[id(old)])

    return _rebuilt(model, settings, assign)
