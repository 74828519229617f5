"""The attention layers a TransformerEncoderBlock builds, by name.

Each attention layer class registers itself, `@register_attention("name")`, so a new variant is
found by the name it gives, without an edit to the block. The block builds any registered class
through one contract: the constructor of `keras.layers.MultiHeadAttention` (num_heads, key_dim,
seed, ...) plus the variant's own arguments, `layer(x, x, query_mask=, value_mask=,
use_causal_mask=, cache=, cache_update_index=)` and `init_cache(batch_size, max_length=None)`.
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
