"""keras_yoso.layers: Keras layers built on keras_yoso.ops."""

from keras_yoso.layers.transformer_encoder_block import TransformerEncoderBlock
from keras_yoso.layers.yoso_attention import YosoAttention

__all__ = ["TransformerEncoderBlock", "YosoAttention"]
