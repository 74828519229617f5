"""`calibrate`: a converted model's YOSO layers brought closer to the softmax layers they replaced, with no
training (issue 42, item 2).

For each YOSO layer of a model made by `keras_yoso.replace_attention`, the softmax model it came from is run
on calibration inputs and the input of each of its attention layers is recorded. Given that same input, the
YOSO layer with hash_code_len tau and per-head output scale s outputs

    y(tau, s) = c(tau) + sum_h s_h Z_h(tau),   Z_h = (head h's N-YOSO output, masked) @ W_o[h]

(W_o[h] the output projection's rows of head h; c the projection's bias plus YOSO-C's convolution, if any),
linear in s. For each candidate tau the scale minimizing |y(tau, s) - y_softmax|^2 over the unpadded queries
of every calibration input is the solution of the normal equations G s = b, G_hk = <Z_h, Z_k>,
b_h = <Z_h, y_softmax - c> (a num_heads x num_heads system: least squares on the layer's output, what the
residual receives, so the heads' scales are fitted jointly). The tau whose fitted scale gives the smallest
relative error |y - y_softmax| / |y_softmax| is kept. Each layer is fitted on the softmax model's own
hidden states (errors do not compound from layer to layer), as benchmarks/conversion_error.py measures.
"""

import inspect
import time

import keras
import numpy as np

from keras_yoso import _validation
from keras_yoso.conversion import _check_rewritable
from keras_yoso.conversion import _kind
from keras_yoso.conversion import _learned_length
from keras_yoso.conversion import _relative_path
from keras_yoso.conversion import replace_attention
from keras_yoso.layers.multi_head_attention_base import MultiHeadAttentionBase
from keras_yoso.layers.yoso_attention import YosoAttention

# The candidate taus when none are given: with m = 32 hashes, all-MiniLM-L6-v2's layers err least at tau 5-6 (at 512
# and 2,048 tokens; above 10 the sampling noise dominates, docs/results.md), and every tau more costs one more pass
# over the inputs per layer. YOSO-E (use_expectation=True) prefers 11-16: pass range(2, 17) for it.
DEFAULT_HASH_CODE_LENS = tuple(range(2, 11))

# The arguments of an attention call that calibration replays on the YOSO layer (training is always False).
_REPLAYED = ("query", "value", "key", "query_mask", "value_mask", "key_mask", "attention_mask", "use_causal_mask")
_UNITS = ("attention", "hub_encoder", "hub_decoder", "block")


def _numpy(tensor):
    return np.asarray(keras.ops.convert_to_numpy(keras.ops.stop_gradient(tensor)))


def _attention_units(model, where):
    """[(layer, [its attention layers])] in model order: every layer of the model (nested Functional and
    Sequential models included) that is, or holds, an attention replace_attention replaces."""
    units = []
    for layer in model.layers:
        kind = _kind(layer)
        if kind == "model":
            units += _attention_units(layer, f"layer {layer.name!r} of {where}")
        elif kind in _UNITS:
            inner = [layer] if kind == "attention" else [
                sub for sub in layer._flatten_layers(include_self=False, recursive=True)
                if isinstance(sub, (keras.layers.MultiHeadAttention, MultiHeadAttentionBase))]
            units.append((layer, kind, inner))
    return units


def _checked_pairs(model, reference, function="calibrate"):
    """[(unit layer of `model`, kind, its YosoAttention, the reference's attention)], or ValueError saying
    why `model` is not a YOSO conversion of `reference` that `function` (calibrate, transfer_attention) can
    rewrite."""
    _check_rewritable(model, f"model {model.name!r}")
    converted, original = _attention_units(model, "model"), _attention_units(reference, "original")
    if not converted:
        raise ValueError(f"{function} found no attention layer in model {model.name!r}: pass the model that "
                         "keras_yoso.replace_attention(original, 'yoso', ...) returned.")
    if len(converted) != len(original):
        raise ValueError(f"{function} pairs the attention layers of `model` and `original` in order, and they differ "
                         f"in number: {len(converted)} in model {model.name!r}, {len(original)} in original "
                         f"{reference.name!r}. Pass the model replace_attention made from `original`.")
    pairs = []
    for (layer, kind, inner), (old, _, old_inner) in zip(converted, original):
        if layer.name != old.name:
            raise ValueError(f"{function} pairs the attention layers of `model` and `original` in order: layer "
                             f"{layer.name!r} of model {model.name!r} meets {old.name!r} of original "
                             f"{reference.name!r}. Pass the model replace_attention made from `original`.")
        if len(inner) != 1 or len(old_inner) != 1:
            raise ValueError(f"{function} fits one YOSO attention per layer, and layer {layer.name!r} "
                             f"({type(layer).__name__}) holds {len(inner)}: a decoder's self- and cross-attention "
                             "share one attention_kwargs, so they cannot take two calibrations.")
        attention = inner[0]
        if not isinstance(attention, YosoAttention):
            raise ValueError(f"{function} fits YosoAttention layers; layer {layer.name!r} of model {model.name!r} "
                             f"is {type(attention).__name__}. Convert with replace_attention(original, 'yoso').")
        if attention.num_heads != old_inner[0].num_heads:
            raise ValueError(f"{function}: layer {layer.name!r} has {attention.num_heads} heads and its original "
                             f"{old_inner[0].num_heads}. Pass the model replace_attention made from `original`.")
        config = attention.get_config()
        if config["use_gate"] or config["attention_axes"] not in (None, (1,), [1]):
            raise ValueError(f"{function} fits the output scale of layers with the default attention_axes and no "
                             f"gate; layer {layer.name!r} has use_gate={config['use_gate']}, attention_axes="
                             f"{config['attention_axes']!r}.")
        pairs.append((layer, kind, attention, old_inner[0]))
    return pairs


def _batches(inputs, batch_size, function="calibrate"):
    """The calibration inputs cut into batches of `batch_size` along axis 0 (the same structure, NumPy)."""
    leaves = keras.tree.flatten(inputs)
    if not leaves:
        raise ValueError(f"{function} expects `inputs`: an array, or a dict or list of arrays, what the model takes, "
                         "with the examples along axis 0. Received an empty structure.")
    try:
        arrays = [np.asarray(keras.ops.convert_to_numpy(leaf)) for leaf in leaves]
    except Exception as error:  # noqa: BLE001  (any backend's conversion error, named below)
        raise ValueError(f"{function} expects `inputs` of arrays (what the model takes). Received leaves of types "
                         f"{sorted({type(leaf).__name__ for leaf in leaves})}: {error}") from error
    counts = {a.shape[0] if a.ndim else None for a in arrays}
    if len(counts) != 1 or None in counts or 0 in counts:
        raise ValueError(f"{function} expects `inputs` whose arrays all have the same number (>= 1) of examples along "
                         f"axis 0. Received shapes {[a.shape for a in arrays]}.")
    count = counts.pop()
    structure = keras.tree.map_structure(lambda _: None, inputs)
    return [keras.tree.pack_sequence_as(structure, [a[start:start + batch_size] for a in arrays])
            for start in range(0, count, batch_size)], count


def _record_calls(reference, attentions, batches):
    """For each attention layer of `reference`, the arguments and output of each of its calls while the
    reference runs on `batches`: [[(replayable keyword arguments, output `[B, T, features]`)]]."""
    records = [[] for _ in attentions]

    def recorder(layer, store):
        call, signature = layer.call, inspect.signature(layer.call)

        def record(*args, **kwargs):
            output = call(*args, **kwargs)
            bound = signature.bind(*args, **kwargs).arguments
            replay = {}
            for name in _REPLAYED:
                value = bound.get(name)
                if value is not None and not isinstance(value, bool):
                    replay[name] = _numpy(value)
                elif isinstance(value, bool):
                    replay[name] = value
            for name in ("query", "value", "key"):  # a Keras mask carried by the tensor itself
                mask = getattr(bound.get(name), "_keras_mask", None)
                if mask is not None and f"{name}_mask" not in replay:
                    replay[f"{name}_mask"] = _numpy(mask)
            store.append((replay, _numpy(output[0] if isinstance(output, tuple) else output)))
            return output

        return record

    try:
        for layer, store in zip(attentions, records):
            object.__setattr__(layer, "call", recorder(layer, store))
        for batch in batches:
            reference(batch, training=False)
    finally:
        for layer in attentions:
            if "call" in vars(layer):
                object.__delattr__(layer, "call")
    return records


def _candidate(attention, hash_code_len):
    """A copy of `attention` with `hash_code_len` and no output scale: its weights (the hash functions too, when
    their shape allows; else those its seed draws) copied once it is built (see `_statistics`)."""
    config = {**attention.get_config(), "hash_code_len": hash_code_len, "output_scale": None}
    return YosoAttention.from_config(config)


def _copy_weights(source, target):
    """Each weight of `target` takes `source`'s of the same path and shape (the hash functions of another tau
    keep the target's, drawn from the same seed). A copy of the values, never the source's buffer: JAX's
    `fit` donates the buffers of the model it trains, which would delete the source's."""
    weights = {_relative_path(v, source): v for v in source.weights}
    for variable in target.weights:
        match = weights.get(_relative_path(variable, target))
        if match is not None and tuple(match.shape) == tuple(variable.shape):
            variable.assign(np.array(_numpy(match.value)))


def _statistics(layer, calls):
    """The least-squares statistics of `layer` (output scale 1) against the recorded softmax outputs, summed
    over `calls`: G `[heads, heads]`, b `[heads]`, |t - c|^2 and |t|^2 (module docstring), float64."""
    heads = layer.num_heads
    gram, cross, residual, total = np.zeros((heads, heads)), np.zeros(heads), 0.0, 0.0
    for kwargs, target in calls:
        seen = []
        object.__setattr__(layer, "_head_recorder", lambda out, mask: seen.append((out, mask)))
        try:
            output = _numpy(layer(**kwargs, training=False)).astype(np.float64)
        finally:
            object.__setattr__(layer, "_head_recorder", None)
        out, mask = (_numpy(t) for t in seen[-1])
        mask = mask.astype(bool)
        kernel = _numpy(layer.output_dense.kernel).astype(np.float64)
        kernel = kernel.reshape(heads, kernel.shape[1], -1)
        out = out.astype(np.float64)[mask]  # [rows, heads, value_dim]: the unpadded queries
        z = np.einsum("rnh,nhD->nrD", out, kernel)  # each head's part of the output
        target = target.astype(np.float64).reshape(mask.shape + (-1,))[mask]
        rest = target - (output.reshape(mask.shape + (-1,))[mask] - z.sum(axis=0))  # t - c
        gram += np.einsum("nrD,krD->nk", z, z)
        cross += np.einsum("nrD,rD->n", z, rest)
        residual += float((rest ** 2).sum())
        total += float((target ** 2).sum())
    return gram, cross, residual, total


def _relative_error(statistics, scale):
    gram, cross, residual, total = statistics
    squared = scale @ gram @ scale - 2.0 * cross @ scale + residual
    return float(np.sqrt(max(squared, 0.0) / total))


def _fit(layer, calls, hash_code_lens, verbose, label):
    """(tau, scale, error before, error after, {tau: error}) of one YOSO layer on its recorded calls."""
    own_scale = np.ones(layer.num_heads) if layer.output_scale is None else np.asarray(layer.output_scale)
    taus = sorted(set(hash_code_lens) | {layer.hash_code_len})
    best, errors, before = None, {}, None
    start = time.perf_counter()
    if verbose:
        print(f"calibrate: {label}: tau", end="", flush=True)
    for tau in taus:
        candidate = _candidate(layer, tau)
        candidate(**calls[0][0], training=False)  # builds it
        _copy_weights(layer, candidate)
        statistics = _statistics(candidate, calls)
        scale = np.linalg.lstsq(statistics[0], statistics[1], rcond=None)[0]
        errors[tau] = _relative_error(statistics, scale)
        if tau == layer.hash_code_len:
            before = _relative_error(statistics, own_scale)
        if best is None or errors[tau] < best[2]:
            best = (tau, scale, errors[tau])
        if verbose:
            print(f" {tau}: {errors[tau]:.3f}", end="", flush=True)
    if verbose:
        print(f"; kept tau {best[0]} (was {layer.hash_code_len}), error {before:.3f} -> {best[2]:.3f} "
              f"({time.perf_counter() - start:.0f} s)", flush=True)
    return best[0], best[1], before, best[2], errors


def calibrate(model, original, inputs, hash_code_lens=DEFAULT_HASH_CODE_LENS, batch_size=8, verbose=True):
    """A new model: `model`'s YOSO layers with the tau and per-head output scale that best match `original`.

    For each YosoAttention of `model` (a model `keras_yoso.replace_attention(original, "yoso", ...)`
    made), `original` runs on `inputs` and the input of its matching attention layer is recorded; the
    YOSO layer, given that input, is then fitted to the softmax layer's output: for each tau in
    `hash_code_lens` (and the layer's own), the per-head output scale s `[num_heads]` solving the least
    squares of the layer's output against the softmax layer's (closed form, the module docstring), and
    the tau with the smallest relative error |y - y_softmax| / |y_softmax| over the unpadded positions
    is kept. So on `inputs` each layer's error is at most the converted layer's. Fit on text other than
    the text you evaluate on. The weights are the same; a layer whose tau changes hashes with new hash
    functions drawn from its seed (those the fit evaluated).

    What the fit optimizes is each layer's error, not a downstream quantity. Sampled YOSO's noise grows
    with tau (fewer collisions per hash), so a sampled layer's best tau sits below YOSO-E's, and its
    error is mostly per-token noise that a pooled output averages out while the broader kernel's bias
    stays: on all-MiniLM-L6-v2 (m = 32, held-out text) the mean layer error falls from 0.81 to 0.74 at
    512 tokens while the mean-pooled embedding's cosine to the original falls from 0.795 to 0.769; at
    2,048 tokens the error falls from 0.72 to 0.60 and the cosine rises from 0.862 to 0.910; with
    YOSO-E (no noise) at 512 it rises from 0.793 to 0.828. Check the model on held-out text before
    keeping a calibration. What the per-token norms of q and k carried, dropped by YOSO's L2
    normalization, no tau or scale restores (docs/results.md, "Calibration with no training").

    Args:
        model: The converted Functional or Sequential model (its YosoAttention layers standalone, in
            keras-hub TransformerEncoders or in TransformerEncoderBlocks; decoders, gated or
            multi-axis attention raise ValueError).
        original: The softmax model `model` was converted from. When `model` has more learned
            positions (replace_attention's `max_length`), the reference is `original` with its
            positions extended the same way (`replace_attention(original, "softmax", max_length=...)`).
        inputs: What the models take (an array, or a dict or list of arrays), the calibration examples
            along axis 0, e.g. keras-hub's {"token_ids", "segment_ids", "padding_mask"}.
        hash_code_lens: The candidate taus (ints in [1, 20]); default 2..10.
        batch_size: Examples per forward pass (memory: the softmax model forms [T, T] scores per head).
        verbose: Print each layer's candidate errors, its choice and time as it goes.

    Returns:
        A new model like `model` whose YosoAttention layers have the chosen `hash_code_len` and
        `output_scale` in their config (a `.keras` file keeps them); `model` is left unchanged.
    """
    if not isinstance(model, keras.Model):
        raise ValueError(f"calibrate expects the converted keras.Model as `model`. Received: {type(model).__name__}")
    if not isinstance(original, keras.Model):
        raise ValueError("calibrate expects the softmax keras.Model that `model` was converted from as `original`. "
                         f"Received: {type(original).__name__}")
    if isinstance(hash_code_lens, (str, bytes)) or not hasattr(hash_code_lens, "__iter__"):
        raise ValueError("calibrate expects `hash_code_lens`: a non-empty list of ints in "
                         f"[1, {_validation.MAX_CUMULATION_HASH_CODE_LEN}]. Received: {hash_code_lens!r}")
    hash_code_lens = list(hash_code_lens)
    if not hash_code_lens:
        raise ValueError("calibrate expects `hash_code_lens`: a non-empty list of ints in "
                         f"[1, {_validation.MAX_CUMULATION_HASH_CODE_LEN}]. Received an empty one.")
    hash_code_lens = [_validation.hash_code_len(tau, cumulation=True, layer=True) for tau in hash_code_lens]
    batch_size = _validation.integer(batch_size, "batch_size", 1, layer=True)
    verbose = _validation.boolean(verbose, "verbose", layer=True)
    reference = _reference_for(model, original)
    pairs = _checked_pairs(model, reference)
    batches, count = _batches(inputs, batch_size)
    start = time.perf_counter()
    records = _record_calls(reference, [old for _, _, _, old in pairs], batches)
    if verbose:
        print(f"calibrate: ran the softmax model on {count} example(s) in {len(batches)} batch(es): "
              f"{time.perf_counter() - start:.0f} s", flush=True)
    settings = {}
    for n, (layer, kind, attention, _) in enumerate(pairs):
        tau, scale, _, _, _ = _fit(attention, records[n], hash_code_lens, verbose,
                                   f"layer {layer.name!r} ({n + 1}/{len(pairs)})")
        settings[id(layer)] = (kind, {"hash_code_len": tau, "output_scale": [float(s) for s in scale]})
    return _rebuilt(model, settings)


def _reference_for(model, original):
    """The softmax model to record: `original`, its learned positions extended as `model`'s were
    (`replace_attention(original, "softmax", max_length=...)`) when `model` has more."""
    length, original_length = _learned_length(model), _learned_length(original)
    if length is not None and original_length is not None and length > original_length:
        return replace_attention(original, "softmax", max_length=length)
    return original


def _rebuilt(model, settings, assign=None):
    """`model` cloned with each calibrated layer's new settings ({id(layer): (kind, settings)}), weights copied;
    then `assign(old layer, new layer)`, when given, changes the new layers' weights."""
    pairs = []

    def clone(layer):
        config = layer.get_config()
        if not isinstance(layer, keras.layers.Layer):  # an operation of the graph (e.g. x[:, 0]): no weights
            return layer.__class__.from_config(config)
        if id(layer) in settings:
            kind, changes = settings[id(layer)]
            if kind == "attention":
                config.update(changes)
            else:
                config["attention_kwargs"] = {**config["attention_kwargs"], **changes}
        new = layer.__class__.from_config(config)
        pairs.append((layer, new))
        return new

    new_model = keras.models.clone_model(model, clone_function=clone, recursive=True)
    for old, new in pairs:
        _copy_weights(old, new)
        if assign is not None:
            assign(old, new)
    return new_model
