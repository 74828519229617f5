"""Keras' own MultiHeadAttention tests, run unchanged with keras_yoso's layers in its place.

The test class ships with the installed keras (keras/src/layers/attention/multi_head_attention_test.py).
Each class below subclasses it and, for the length of each test, makes its `layers.MultiHeadAttention`
name YosoAttention or LinearRelativeAttention: every test Keras wrote for its own layer runs on ours,
on the running backend. The tests that cannot pass are listed below with their reason, in three kinds:

- softmax values: the test compares outputs or weights with softmax attention's numbers (YOSO's
  kernel is (1 - arccos(<q, k>)/pi)^tau, linear attention's is elu(q)+1 . elu(k)+1).
- a mask the attention cannot express: a lower-triangular or banded [T, S] mask, a causal mask
  between sequences of different lengths, or `sliding_window`. These tests must raise the error
  that docs/errors.md documents for it, and they are run to check that they do.
- counts of state: the test counts seed generators or weights. YosoAttention keeps a SeedGenerator
  for its training hash functions and its inference hash functions as a non-trainable weight (so
  that weights-only checkpoints reproduce inference); LinearRelativeAttention has its relative
  position embeddings as a weight.

Two more kinds are skipped: the tests that ask LinearRelativeAttention for attention scores, which
linear attention never forms, and the one that needs MultiHeadAttention's causal mask as a [T, S]
tensor inside `_compute_attention`. Every kind but "mask" is skipped with its reason.
"""

import types

import pytest

keras_suite = pytest.importorskip("keras.src.layers.attention.multi_head_attention_test",
                                  reason="the installed keras ships no MultiHeadAttention tests")

from keras.src import layers as keras_layers  # noqa: E402

from keras_yoso.layers import LinearRelativeAttention  # noqa: E402
from keras_yoso.layers import YosoAttention  # noqa: E402



def _keras_test():
    """Keras' test class (not bound to a module name: pytest would collect it as it is)."""
    return keras_suite.MultiHeadAttentionTest


SOFTMAX = "compares with softmax attention's values"
SEEDS_AND_WEIGHTS = ("counts seed generators and weights: YosoAttention keeps a SeedGenerator (training hash "
                     "functions) and the non-trainable weight hash_functions (inference hash functions, saved with "
                     "the weights)")
# The documented errors (docs/errors.md) of the masks that LSH or linear attention cannot express.
NOT_PADDING = "received an `attention_mask` that is not a padding mask"
SLIDING_WINDOW = "does not support `sliding_window`"
CAUSAL_LENGTHS = "is causal self-attention: `query` and `value` must have the same length"

# test name -> (kind, the reason or the documented error it raises)
YOSO_EXCEPTIONS = {
    "test_correctness_disable_flash_attention": ("softmax", SOFTMAX),
    "test_correctness_enable_flash_attention": ("softmax", SOFTMAX),
    "test_basics": ("counts", SEEDS_AND_WEIGHTS),
    "test_basics_with_flash_attention": ("counts", SEEDS_AND_WEIGHTS),
    **{name: ("counts", SEEDS_AND_WEIGHTS) for name in dir(_keras_test())
       if name.startswith("test_high_dim_attention_")},
    "test_lora": ("counts", SEEDS_AND_WEIGHTS + " (it counts 3 non-trainable variables)"),
    # A lower-triangular [T, S] attention_mask, alone or with another mask.
    "test_masking_with_different_shapes": ("mask", NOT_PADDING),
    "test_causal_only_fast_path": ("mask", NOT_PADDING),
    "test_causal_only_with_other_mask_falls_back": ("mask", NOT_PADDING),
    "test_causal_only_masks_when_fused_path_disabled_dropout_only": ("mask", NOT_PADDING),
    "test_compute_attention_combines_causal_and_explicit_mask_fused_fallback": ("mask", NOT_PADDING),
    "test_compute_attention_combines_causal_and_explicit_mask_manual_path": ("mask", NOT_PADDING),
    # Causal attention of 5 queries over 3 keys: a [5, 3] lower triangle, not causal self-attention.
    "test_masking_causal": ("mask", CAUSAL_LENGTHS),
    "test_sliding_window": ("mask", SLIDING_WINDOW),
    "test_sliding_window_serialization": ("mask", SLIDING_WINDOW),
    # MultiHeadAttention hands its causal mask to `_compute_attention` as a [T, S] tensor; LSH attention
    # keeps causality in its kernel and never forms that tensor, so the overriding hook sees none.
    "test_causal_only_skipped_for_subclass": ("hook", "needs the causal mask as a [T, S] tensor in "
                                                      "`_compute_attention`, which LSH attention never forms"),
}

LINEAR_WEIGHTS = "counts weights: LinearRelativeAttention has its relative position embeddings as one more weight"
NO_SCORES = "asks for attention scores: linear attention never forms them (ValueError, docs/errors.md)"
LINEAR_RELATIVE_EXCEPTIONS = {
    **{name: kind for name, kind in YOSO_EXCEPTIONS.items() if kind[0] in ("softmax", "mask")},
    "test_masking_causal": ("mask", NOT_PADDING),
    "test_basics": ("counts", LINEAR_WEIGHTS),
    "test_basics_with_flash_attention": ("counts", LINEAR_WEIGHTS),
    "test_lora": ("counts", LINEAR_WEIGHTS),
    **{name: ("counts", LINEAR_WEIGHTS) for name in dir(_keras_test()) if name.startswith("test_high_dim_attention_")},
    "test_causal_only_skipped_for_subclass": YOSO_EXCEPTIONS["test_causal_only_skipped_for_subclass"],
    "test_attention_axes_negative_indexing": ("scores", NO_SCORES),
    "test_causal_only_masks_non_4d_inputs": ("scores", NO_SCORES),
    "test_causal_only_masks_when_fused_path_disabled_dropout_and_scores": ("scores", NO_SCORES),
    "test_causal_only_masks_when_fused_path_disabled_scores_only": ("scores", NO_SCORES),
    "test_symbolic_return_attention_scores0": ("scores", NO_SCORES),
    "test_symbolic_return_attention_scores1": ("scores", NO_SCORES),
    "test_compute_attention_combines_causal_and_explicit_mask_fused_fallback": ("mask", NOT_PADDING),
    "test_compute_attention_combines_causal_and_explicit_mask_manual_path": ("scores", NO_SCORES),
}


def _layers_with(layer_class):
    """keras.src.layers with `MultiHeadAttention` bound to `layer_class`."""
    class Layers(types.ModuleType):
        def __getattr__(self, name):
            return layer_class if name == "MultiHeadAttention" else getattr(keras_layers, name)

    return Layers("layers")


def _skipped(reason):
    def test(self):
        pytest.skip(reason)

    return test


def _raises_documented_error(name, match):
    def test(self):
        with pytest.raises(ValueError, match=match):
            getattr(_keras_test(), name)(self)

    return test


def _suite(layer_class, exceptions):
    """Keras' test class with `layer_class` in MultiHeadAttention's place and `exceptions` replaced."""
    unknown = sorted(set(exceptions) - set(dir(_keras_test())))
    assert not unknown, f"listed exceptions that Keras' test class does not have: {unknown}"

    def setUp(self):  # noqa: N802 (unittest's name)
        _keras_test().setUp(self)
        self._keras_layers = keras_suite.layers
        keras_suite.layers = _layers_with(layer_class)

    def tearDown(self):  # noqa: N802
        keras_suite.layers = self._keras_layers
        _keras_test().tearDown(self)

    namespace = {"setUp": setUp, "tearDown": tearDown}
    for name, (kind, detail) in exceptions.items():
        namespace[name] = _raises_documented_error(name, detail) if kind == "mask" else _skipped(detail)
    return type(f"Test{layer_class.__name__}InPlaceOfMultiHeadAttention", (_keras_test(),), namespace)


TestYosoAttentionInPlaceOfMultiHeadAttention = _suite(YosoAttention, YOSO_EXCEPTIONS)
TestLinearRelativeAttentionInPlaceOfMultiHeadAttention = _suite(LinearRelativeAttention, LINEAR_RELATIVE_EXCEPTIONS)


def test_every_exception_is_a_test_of_the_keras_suite_and_most_tests_run():
    tests = [name for name in dir(_keras_test()) if name.startswith("test_")]
    assert set(YOSO_EXCEPTIONS) <= set(tests) and set(LINEAR_RELATIVE_EXCEPTIONS) <= set(tests)
    assert len(tests) - len(YOSO_EXCEPTIONS) >= 29, (len(tests), len(YOSO_EXCEPTIONS))
