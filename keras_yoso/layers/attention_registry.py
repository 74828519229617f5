"""The attention layers a TransformerEncoderBlock builds, by name.

Each attention layer class registers itself, `@register_attention("name")`, so a new variant is
found by the name it gives, without an edit to the block. The block builds any registered class
through one contract: the constructor of `keras.layers.MultiHeadAttention` (num_heads, key_dim,
seed, ...) plus the variant's own arguments, `layer(x, x, query_mask=, value_mask=,
use_causal_mask=, cache=, cache_update_index=)` and `init_cache(batch_size, max_length=None)`.
`attention_like` builds one like a given MultiHeadAttention (replace_attention, keras_yoso.hub).
"""

from keras_yoso import _validation

_ATTENTIONS = {}


def register_attention(name):
    """Class decorator: registers the attention layer class under `name`."""
    def decorate(cls):
        _ATTENTIONS[name] = cls
        return cls

    return decorate


def attention_class(name):
    """The attention layer class registered under `name` (ValueError naming the registered names)."""
    return _ATTENTIONS[_validation.choice(name, "attention", tuple(sorted(_ATTENTIONS)), layer=True)]


# MultiHeadAttention's constructor arguments: the replaced layer's, never `attention_kwargs`'.
MULTI_HEAD_ATTENTION_ARGUMENTS = ("num_heads", "key_dim", "value_dim", "dropout", "use_bias", "use_gate",
                                  "output_shape", "attention_axes", "sliding_window", "kernel_initializer",
                                  "bias_initializer", "kernel_regularizer", "bias_regularizer",
                                  "activity_regularizer", "kernel_constraint", "bias_constraint")


def attention_like(layer, attention, attention_kwargs):
    """A new, unbuilt `attention` layer with the heads, sizes, initializers, dtype and name of
    `layer` (a `keras.layers.MultiHeadAttention` or a keras_yoso attention) and `attention_kwargs`."""
    config = layer.get_config()
    arguments = {key: config[key] for key in MULTI_HEAD_ATTENTION_ARGUMENTS if key in config}
    return attention_class(attention)(**arguments, **attention_kwargs, dtype=layer.dtype_policy, name=layer.name)


def checked_attention_kwargs(attention, attention_kwargs, name="attention_kwargs"):
    """`attention_kwargs` as a new dict with a resolved `seed` (kept in get_config, so a layer rebuilt
    from its config hashes as the original); ValueError naming the argument for one that belongs to
    the replaced MultiHeadAttention, or for a value the attention refuses."""
    if attention_kwargs is not None and not isinstance(attention_kwargs, dict):
        raise ValueError(f"Received an invalid value for argument `{name}`: expected a dict or None. Received: "
                         f"{name}={attention_kwargs!r}")
    attention_kwargs = dict(attention_kwargs or {})
    taken = sorted(set(attention_kwargs) & set(MULTI_HEAD_ATTENTION_ARGUMENTS))
    if taken:
        raise ValueError(f"`{name}` sets the {attention!r} attention's own arguments; {taken} come from the "
                         f"replaced MultiHeadAttention (its trained projections fix them). Received: "
                         f"{name}={attention_kwargs!r}")
    attention_kwargs["seed"] = _validation.resolve_seed(attention_kwargs.get("seed"), f"{name}['seed']")
    attention_class(attention)(num_heads=1, key_dim=1, **attention_kwargs)  # its own checks, now
    return attention_kwargs
