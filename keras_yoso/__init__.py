"""keras-yoso: linear-cost attention for long sequences in Keras 3 / TensorFlow.

Importing the package loads the compiled TensorFlow ops (so SavedModels that
use them can be loaded afterwards) and falls back to pure-TF composites with a
warning if they cannot be loaded.
"""

from keras_yoso import layers
from keras_yoso import ops
from keras_yoso.layers import LinearRelativeAttention
from keras_yoso.layers import TransformerEncoderBlock
from keras_yoso.layers import YosoAttention

__version__ = "0.1.0"

__all__ = ["LinearRelativeAttention", "TransformerEncoderBlock", "YosoAttention", "layers", "ops"]
