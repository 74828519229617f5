"""keras_yoso.ops: the functional API of keras-yoso.

The compiled custom ops are loaded when this package is imported; every
function hides the custom-op / composite choice behind `implementation=`.
"""

from keras_yoso.ops._library import custom_ops_available
from keras_yoso.ops.linear_relative import linear_relative_attention
from keras_yoso.ops.yoso import hash_codes
from keras_yoso.ops.yoso import hash_parameters
from keras_yoso.ops.yoso import lsh_cumulation
from keras_yoso.ops.yoso import weighted_lsh_cumulation
from keras_yoso.ops.yoso import yoso_cumulation
from keras_yoso.ops.yoso import yoso_expectation
from keras_yoso.ops.yoso import yoso_expectation_weights

__all__ = [
    "custom_ops_available",
    "hash_codes",
    "hash_parameters",
    "linear_relative_attention",
    "lsh_cumulation",
    "weighted_lsh_cumulation",
    "yoso_cumulation",
    "yoso_expectation",
    "yoso_expectation_weights",
]
