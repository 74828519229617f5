"""keras_yoso.layers: Keras layers built on keras_yoso.ops."""

from keras_yoso.layers.cached_multi_head_attention import CachedMultiHeadAttention
from keras_yoso.layers.linear_relative_attention import LinearRelativeAttention
from keras_yoso.layers.transformer_encoder_block import TransformerEncoderBlock
from keras_yoso.layers.yoso_attention import YosoAttention

__all__ = ["CachedMultiHeadAttention", "LinearRelativeAttention", "TransformerEncoderBlock", "YosoAttention"]
