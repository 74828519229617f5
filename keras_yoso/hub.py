"""keras-hub's TransformerEncoder and TransformerDecoder with a keras_yoso attention.

`keras_yoso.replace_attention` puts these in place of keras-hub's layers (inside `BertBackbone`
and every other backbone built from them). Each is keras-hub's layer, unchanged except that its
attention sublayers (keras-hub builds `MultiHeadAttention` / `CachedMultiHeadAttention`) are
`attention` (a name of `keras_yoso.layers.attention_registry`: "yoso", "linear_relative") with
`attention_kwargs`, under the same names ("self_attention_layer", "cross_attention_layer") and with
the same projections, so keras-hub's weights load into them.

keras-hub is an optional extra: importing this module imports it, and `import keras_yoso` does not
import this module. A converted model saved as `.keras` loads after `import keras_yoso` alone, in
either order with keras_hub: keras_yoso.conversion registers these layers' names with Keras, and
loading the first of them imports this module.
"""

import keras
import keras_hub

from keras_yoso.layers.attention_registry import attention_class
from keras_yoso.layers.attention_registry import attention_like
from keras_yoso.layers.attention_registry import checked_attention_kwargs


def _replace_sublayer(owner, attribute, attention, attention_kwargs, query_shape, value_shape):
    """Puts an `attention` layer like `owner.<attribute>` (built by keras-hub) in its place, built."""
    old = getattr(owner, attribute)
    new = attention_like(old, attention, attention_kwargs)
    owner._tracker.untrack(old)  # Keras keeps every layer assigned to an attribute; the old one must go
    setattr(owner, attribute, new)
    new.build(query_shape, value_shape)


class _ReplacedAttention:
    """The `attention` and `attention_kwargs` arguments and config of the two layers below."""

    def _set_attention(self, attention, attention_kwargs):
        attention_class(attention)
        self.attention = attention
        self.attention_kwargs = checked_attention_kwargs(attention, attention_kwargs)

    def get_config(self):
        return {**super().get_config(), "attention": self.attention, "attention_kwargs": dict(self.attention_kwargs)}


@keras.saving.register_keras_serializable(package="keras_yoso", name="HubTransformerEncoder")
class TransformerEncoder(_ReplacedAttention, keras_hub.layers.TransformerEncoder):
    """`keras_hub.layers.TransformerEncoder` whose self-attention is a keras_yoso attention.

    Args: keras-hub's, plus `attention` ("yoso" or "linear_relative") and `attention_kwargs` (the
    attention's own arguments, e.g. num_hashes, hash_code_len; a missing seed is drawn now and kept in
    the config). Call: keras-hub's. `padding_mask` (or the inputs' Keras mask) reaches the attention as
    a `[B, 1, S]` key mask, which every backend takes, compiled or not; an `attention_mask` must be a
    padding mask (docs/errors.md).
    """

    def __init__(self, *args, attention="yoso", attention_kwargs=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._set_attention(attention, attention_kwargs)

    def build(self, inputs_shape):
        super().build(inputs_shape)
        _replace_sublayer(self, "_self_attention_layer", self.attention, self.attention_kwargs, inputs_shape,
                          inputs_shape)


@keras.saving.register_keras_serializable(package="keras_yoso", name="HubTransformerDecoder")
class TransformerDecoder(_ReplacedAttention, keras_hub.layers.TransformerDecoder):
    """`keras_hub.layers.TransformerDecoder` whose attentions are keras_yoso attentions.

    The self-attention is built with `causal=True`: the decoder's causal mask becomes the attention's
    own causal form (linear in the length), and `decoder_padding_mask` a `[B, 1, S]` key mask. The
    cross-attention (with `encoder_sequence`) is bidirectional. keras-hub's key/value caches
    (`self_attention_cache`, used by keras-hub's `generate`) are not supported (ValueError): decode
    with `keras_yoso.models.CausalLM`, whose state is constant-size. `use_causal_mask=False` raises.
    """

    def __init__(self, *args, attention="yoso", attention_kwargs=None, decoder_sequence_shape=None,
                 encoder_sequence_shape=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._set_attention(attention, attention_kwargs)
        if decoder_sequence_shape:  # keras-hub builds from these (its config holds them) once the attention is set
            self.build(decoder_sequence_shape, encoder_sequence_shape)

    def build(self, decoder_sequence_shape, encoder_sequence_shape=None):
        super().build(decoder_sequence_shape, encoder_sequence_shape)
        causal = {"causal": True} if self._causal_attention else {}
        _replace_sublayer(self, "_self_attention_layer", self.attention, {**self.attention_kwargs, **causal},
                          decoder_sequence_shape, decoder_sequence_shape)
        if self._cross_attention_layer is not None:
            _replace_sublayer(self, "_cross_attention_layer", self.attention, self.attention_kwargs,
                              decoder_sequence_shape, encoder_sequence_shape)

    @property
    def _causal_attention(self):
        """Whether the self-attention is built causal: every attention but softmax ("softmax", a
        MultiHeadAttention), which keeps keras-hub's causal mask and caches."""
        return not issubclass(attention_class(self.attention), keras.layers.MultiHeadAttention)

    def _compute_self_attention_mask(self, decoder_sequence, decoder_padding_mask, decoder_attention_mask,
                                     use_causal_mask, self_attention_cache, self_attention_cache_update_index):
        if not self._causal_attention:
            return super()._compute_self_attention_mask(
                decoder_sequence, decoder_padding_mask, decoder_attention_mask, use_causal_mask,
                self_attention_cache, self_attention_cache_update_index)
        if self_attention_cache is not None:
            raise ValueError(f"{type(self).__name__} with {self.attention!r} attention does not take keras-hub's "
                             "key/value caches (`self_attention_cache`, `cross_attention_cache`): its attention "
                             "keeps a constant-size decoding state of its own. Call it without caches, or decode "
                             "with keras_yoso.models.CausalLM.")
        if not use_causal_mask:
            raise ValueError(f"{type(self).__name__} with {self.attention!r} attention is causal (its "
                             "self-attention was built with causal=True). Received use_causal_mask="
                             f"{use_causal_mask!r}; use TransformerEncoder for bidirectional attention.")
        # keras-hub's mask without its causal part (which the attention computes itself): the padding mask
        # merged with `decoder_attention_mask`. keras-hub has no public function for it.
        return super()._compute_self_attention_mask(decoder_sequence, decoder_padding_mask, decoder_attention_mask,
                                                    use_causal_mask=False, self_attention_cache=None,
                                                    self_attention_cache_update_index=None)
