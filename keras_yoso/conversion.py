"""`replace_attention`: an existing Keras model with keras_yoso attention, its trained weights kept.

Every `keras.layers.MultiHeadAttention` (subclasses included) of a Functional or Sequential model,
nested models included, becomes a keras_yoso attention with the same projections; keras-hub's
`TransformerEncoder`/`TransformerDecoder` become `keras_yoso.hub`'s (the same layers with the
attention swapped); keras_yoso's `TransformerEncoderBlock` takes the new attention by name. With
`max_length`, learned position embeddings are extended as Longformer extended RoBERTa's (Beltagy et
al. 2020; the long-sequence survey, "Longformer": "initialized by copying the 512 positional
embeddings from RoBERTa eight times"): the trained rows are copied in order, again and again.
"""

import sys

import keras
import numpy as np
from keras.src.models.functional import Functional

from keras_yoso import _validation
from keras_yoso.layers.attention_registry import MULTI_HEAD_ATTENTION_ARGUMENTS
from keras_yoso.layers.attention_registry import attention_class
from keras_yoso.layers.attention_registry import attention_like
from keras_yoso.layers.attention_registry import checked_attention_kwargs
from keras_yoso.layers.multi_head_attention_base import MultiHeadAttentionBase
from keras_yoso.layers.transformer_encoder_block import TransformerEncoderBlock

# The layers of keras_yoso.hub, by the names they register with Keras. keras_yoso.hub imports keras_hub, which
# takes seconds (3 s more than `import keras_yoso` on JAX and PyTorch where TensorFlow is installed: keras_hub
# imports it), so `import keras_yoso` does not import it: these names stand in Keras' registry for its classes
# instead, and the first one a `.keras` file holds imports keras_yoso.hub (whose classes then replace them) and
# loads with its class. Loading thus works whether keras_hub was imported before keras_yoso, after it, or not
# at all (Keras imports the keras_hub layers of a file itself).
_HUB_LAYER_NAMES = ("keras_yoso>HubTransformerEncoder", "keras_yoso>HubTransformerDecoder")


class _HubLayerOnLoad:
    """Stands in Keras' registry for the keras_yoso.hub layer registered as `registered_name`, until
    keras_yoso.hub is imported: `from_config` imports it and returns its layer."""

    def __init__(self, registered_name):
        self.registered_name = registered_name

    def from_config(self, config):
        try:
            from keras_yoso import hub  # noqa: F401  (registers its classes in place of these)
        except ModuleNotFoundError as error:
            if error.name != "keras_hub":
                raise
            raise ImportError(f"Loading {self.registered_name} (a keras-hub layer with keras_yoso attention, as "
                              "keras_yoso.replace_attention makes them) needs keras-hub, which is not installed: "
                              "`pip install keras-hub`.") from error
        # From the global registry: the loading's custom-object scope holds a copy of it taken before, with
        # this stand-in.
        return keras.saving.get_custom_objects()[self.registered_name].from_config(config)


def _register_hub_layers():
    """Puts a `_HubLayerOnLoad` in Keras' registry for each keras_yoso.hub layer not registered yet."""
    registry = keras.saving.get_custom_objects()
    for name in _HUB_LAYER_NAMES:
        registry.setdefault(name, _HubLayerOnLoad(name))


_register_hub_layers()


def _keras_hub():
    """The keras_hub module when it is imported (a model holding keras-hub layers imported it), else None."""
    return sys.modules.get("keras_hub")


def _position_length_key(layer):
    """The config key holding the length of a learned position embedding (None for other layers):
    keras-hub's PositionEmbedding and TokenAndPositionEmbedding, and a keras Embedding whose name
    says "position" (a model's table of positions)."""
    hub = _keras_hub()
    if hub is not None and isinstance(layer, (hub.layers.PositionEmbedding, hub.layers.TokenAndPositionEmbedding)):
        return "sequence_length"
    if isinstance(layer, keras.layers.Embedding) and "position" in layer.name.lower():
        return "input_dim"
    return None


def _kind(layer):
    """How replace_attention rewrites `layer`: "attention", "hub_encoder", "hub_decoder", "block",
    "position", "model" (a Functional or Sequential model, rewritten layer by layer) or None (copied)."""
    if isinstance(layer, (keras.layers.MultiHeadAttention, MultiHeadAttentionBase)):
        return "attention"
    if isinstance(layer, TransformerEncoderBlock):
        return "block"
    hub = _keras_hub()
    if hub is not None and isinstance(layer, hub.layers.TransformerEncoder):
        return "hub_encoder"
    if hub is not None and isinstance(layer, hub.layers.TransformerDecoder):
        return "hub_decoder"
    if _position_length_key(layer) is not None:
        return "position"
    if isinstance(layer, (Functional, keras.Sequential)):
        return "model"
    return None


def _holds_attention(layer):
    return any(isinstance(inner, (keras.layers.MultiHeadAttention, MultiHeadAttentionBase))
               for inner in layer._flatten_layers(include_self=False, recursive=True))


def _check_rewritable(model, where):
    """ValueError for what replace_attention cannot rewrite: a subclassed model, or a layer that
    creates a MultiHeadAttention in its own code (it would keep it)."""
    if not isinstance(model, (Functional, keras.Sequential)):
        raise ValueError(f"replace_attention rewrites Functional and Sequential models (keras-hub backbones are "
                         f"Functional), layer by layer. {where} is a subclassed model, {type(model).__name__}, "
                         "whose call() is Python code that creates and calls its layers: build it with "
                         "keras_yoso.YosoAttention (or keras_yoso.LinearRelativeAttention) in place of "
                         "MultiHeadAttention instead.")
    for layer in model.layers:
        kind = _kind(layer)
        if kind == "model":
            _check_rewritable(layer, f"layer {layer.name!r} of {where}")
        elif kind is None and _holds_attention(layer):
            raise ValueError(f"replace_attention cannot rewrite layer {layer.name!r} ({type(layer).__name__}) of "
                             f"{where}: it creates a MultiHeadAttention in its own code, which replace_attention "
                             "cannot reach (it rewrites MultiHeadAttention layers of Functional and Sequential "
                             "models, keras-hub's TransformerEncoder and TransformerDecoder, and keras_yoso's "
                             "TransformerEncoderBlock). Create keras_yoso.YosoAttention in that layer instead.")


def _relative_path(variable, layer):
    prefix = layer.path + "/"
    return variable.path[len(prefix):] if variable.path.startswith(prefix) else variable.name


def _extended_rows(table, length):
    """Rows 0, 1, ..., n - 1, 0, 1, ... of `table` [n, width] up to `length` rows (Longformer's copy)."""
    repeats = -(-length // table.shape[0])
    return np.concatenate([table] * repeats, axis=0)[:length]


_REPLACED = ("attention", "hub_encoder", "hub_decoder", "block")  # the kinds whose attention is replaced


class _Rewrite:
    """The clone function of `keras.models.clone_model` for replace_attention, and the weight copy."""

    def __init__(self, attention, attention_kwargs, max_length):
        self.attention = attention
        self.attention_kwargs = attention_kwargs
        self.seed = attention_kwargs.pop("seed")
        self.max_length = max_length
        self.pairs = []  # (old layer, new layer, kind)

    def _kwargs(self):
        # One seed per replaced layer, so the layers hash with different functions: stream i of the seed for
        # the i-th layer cloned (every layer counts, replaced or copied).
        return {**self.attention_kwargs, "seed": _validation.derived_seed(self.seed, len(self.pairs))}

    def clone(self, layer):
        config = layer.get_config()
        if not isinstance(layer, keras.layers.Layer):  # an operation of the graph (e.g. x[:, 0]): no weights
            return layer.__class__.from_config(config)
        kind = _kind(layer)
        if kind == "attention":
            new = attention_like(layer, self.attention, self._kwargs())
        elif kind in ("hub_encoder", "hub_decoder"):
            from keras_yoso import hub

            cls = hub.TransformerEncoder if kind == "hub_encoder" else hub.TransformerDecoder
            config = {key: value for key, value in config.items() if key not in ("attention", "attention_kwargs")}
            new = cls.from_config({**config, "attention": self.attention, "attention_kwargs": self._kwargs()})
        elif kind == "block":
            kept = {key: value for key, value in config["attention_kwargs"].items()
                    if key in MULTI_HEAD_ATTENTION_ARGUMENTS}
            new = TransformerEncoderBlock.from_config(
                {**config, "attention": self.attention, "attention_kwargs": {**kept, **self._kwargs()}})
        else:
            if kind == "position" and self.max_length is not None:
                config[_position_length_key(layer)] = self.max_length
            new = layer.__class__.from_config(config)
        self.pairs.append((layer, new, kind))
        return new

    def copy_weights(self):
        """Each new layer takes its original's trained weights by path. The replaced attentions' own weights
        (YOSO's hash functions, drawn from the new seed; LinearRelativeAttention's relative positions) keep
        their initial values; a trained weight with no place in the new layer is an error, never dropped."""
        for old, new, kind in self.pairs:
            sources = {_relative_path(v, old): v for v in old.weights}
            used = set()
            for variable in new.weights:
                if kind in _REPLACED and not variable.trainable:
                    continue  # the new attention's own state (YOSO's hash functions): from its seed
                path = _relative_path(variable, new)
                source = sources.get(path)
                if source is None:
                    if kind in _REPLACED:
                        continue
                    raise ValueError(f"replace_attention: layer {new.name!r} has a weight {path!r} that "
                                     f"{old.name!r} lacks.")
                used.add(path)
                value = keras.ops.convert_to_numpy(source.value)
                if tuple(value.shape) != tuple(variable.shape):
                    if kind != "position" or value.ndim != 2 or value.shape[1] != variable.shape[1]:
                        raise ValueError(f"replace_attention: weight {path!r} of layer {old.name!r} has shape "
                                         f"{value.shape}, its replacement {tuple(variable.shape)}.")
                    value = _extended_rows(value, variable.shape[0])
                variable.assign(value)
            lost = sorted(path for path, v in sources.items() if path not in used and v.trainable)
            if lost:
                raise ValueError(f"replace_attention: the trained weights {lost} of layer {old.name!r} "
                                 f"({type(old).__name__}) have no place in its replacement {type(new).__name__}.")


def _learned_length(model):
    """The one length of the model's learned position embeddings (None without any); ValueError when
    they disagree."""
    lengths = {}
    for layer in model._flatten_layers(include_self=False, recursive=True):
        key = _position_length_key(layer)
        if key is not None:
            lengths[layer.name] = layer.get_config()[key]
    if len(set(lengths.values())) > 1:
        raise ValueError(f"replace_attention(max_length=...) extends the model's learned positions to one new "
                         f"length, but they have different lengths: {lengths}.")
    return next(iter(lengths.values()), None)


def replace_attention(model, attention="yoso", max_length=None, **attention_kwargs):
    """A new model: `model` with keras_yoso attention in place of MultiHeadAttention, weights carried over.

    Every `keras.layers.MultiHeadAttention` (and subclass, e.g. keras-hub's
    `CachedMultiHeadAttention`) of a Functional or Sequential model, in nested models too, becomes
    `attention` with the same num_heads, key_dim, value_dim, use_bias, use_gate, output_shape,
    attention_axes, dropout, name and trained projection weights. keras-hub's `TransformerEncoder`
    and `TransformerDecoder` (e.g. the layers of a `BertBackbone`) become `keras_yoso.hub`'s, whose
    attentions are replaced the same way (the decoder's causal mask becomes the attention's causal
    form); keras_yoso's `TransformerEncoderBlock` takes the new attention by name. Every other layer
    is copied with its weights; `model` is left unchanged. A compiled model's clone is compiled alike.

    Args:
        model: A Functional or Sequential `keras.Model` (keras-hub backbones are Functional). A
            subclassed model, or a layer that creates a MultiHeadAttention in its own code, raises
            ValueError naming it: its attention cannot be reached.
        attention: "yoso" (`YosoAttention`) or "linear_relative" (`LinearRelativeAttention`), or
            another name of `keras_yoso.layers.attention_registry`.
        max_length: None, or the new number of learned positions: keras-hub's `PositionEmbedding`
            and `TokenAndPositionEmbedding` and any `keras.layers.Embedding` whose name contains
            "position" get `max_length` rows, the trained rows copied in order and repeated
            (Longformer's initialization), and a Functional model's inputs whose length axis (axis 1)
            was the old number of positions get `max_length`. A length below the model's raises
            ValueError (it would drop trained rows); to read shorter sequences, leave it out.
        **attention_kwargs: The new attention's own arguments (e.g. `num_hashes`, `hash_code_len`,
            `use_expectation` for YOSO; `max_relative_position`, `causal` for LinearRelative). The
            replaced layer's arguments (num_heads, key_dim, ...) cannot be set here. With `seed=s`,
            the replaced layers get distinct seeds derived from s: (s + i) mod 2**31 for the layer cloned
            after i others, replaced or copied, in model order (s drawn now when absent).

    Returns:
        A new Functional (or Sequential) model. A keras-hub backbone comes back as a Functional model
        with the same inputs and outputs (no longer of its backbone class). Weights the new attention
        has and MultiHeadAttention lacks (YOSO's `hash_functions`, LinearRelativeAttention's relative
        position embeddings) start from their initializers.
    """
    if not isinstance(model, keras.Model):
        raise ValueError(f"replace_attention expects a keras.Model as `model`. Received: {type(model).__name__}")
    attention_class(attention)
    max_length = _validation.integer(max_length, "max_length", 1, allow_none=True)
    attention_kwargs = checked_attention_kwargs(attention, attention_kwargs, "attention_kwargs")
    _check_rewritable(model, f"model {model.name!r}")
    if not any(_kind(layer) in _REPLACED
               for layer in model._flatten_layers(include_self=False, recursive=True)):
        raise ValueError(f"replace_attention found no MultiHeadAttention in model {model.name!r} (nor a keras-hub "
                         "TransformerEncoder/TransformerDecoder or keras_yoso TransformerEncoderBlock).")
    input_tensors = None
    if max_length is not None:
        old_length = _learned_length(model)
        if old_length is None:
            raise ValueError(f"replace_attention(max_length={max_length}) extends learned position embeddings, and "
                             f"model {model.name!r} has none (keras-hub PositionEmbedding or "
                             "TokenAndPositionEmbedding, or a keras Embedding named '...position...').")
        if max_length < old_length:
            raise ValueError(f"replace_attention(max_length={max_length}) extends learned position embeddings, and "
                             f"model {model.name!r} has {old_length} trained positions: a shorter table would drop "
                             f"rows {max_length}..{old_length - 1}, and the model could no longer read sequences "
                             f"longer than {max_length}. Leave max_length out (the model reads sequences of up to "
                             f"{old_length} positions as they are), or pass max_length >= {old_length}.")

        def resized(tensor):
            shape = tuple(tensor.shape)
            if len(shape) >= 2 and shape[1] == old_length:
                shape = (shape[0], max_length, *shape[2:])
            return keras.Input(batch_shape=shape, dtype=tensor.dtype, name=tensor.name)

        if isinstance(model, Functional):
            input_tensors = keras.tree.map_structure(resized, model.input)
    rewrite = _Rewrite(attention, attention_kwargs, max_length)
    new_model = keras.models.clone_model(model, input_tensors=input_tensors, clone_function=rewrite.clone,
                                         recursive=True)
    rewrite.copy_weights()
    return new_model
