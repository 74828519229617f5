"""SavedModels that classify raw strings: tokenization in the graph (tensorflow-text), then the
classifier. TensorFlow backend only (imported by sequence_classification/outputs.py there).

`export(..., portable=True)` (the examples' default) traces the classifier with every keras_yoso
op on its composite (`keras_yoso.export_portable`), so the SavedModel loads and serves in a process
with TensorFlow and tensorflow-text that never imports keras_yoso; portable=False keeps the C++
custom ops (faster), and the serving process must `import keras_yoso` before loading.
"""

import os

import keras
import tensorflow as tf
import tensorflow_text as tf_text

import keras_yoso


class StringTokenizer(keras.layers.Layer):
    """A batch of strings `[batch]` -> token ids `[batch, length]` (int32, 0 = padding, at most
    max_length), as the NumPy tokenizers of sequence_classification/tokenizers.py compute them."""

    def __init__(self, kind, max_length, vocabulary=None, **kwargs):
        super().__init__(trainable=False, **kwargs)
        self.kind, self.max_length = kind, max_length
        if kind == "whitespace":
            self._lookup = keras.layers.StringLookup(vocabulary=list(vocabulary), mask_token="[PAD]",
                                                     num_oov_indices=1, output_mode="int")
        elif kind == "wordpiece":
            self._bert = tf_text.FastBertTokenizer(vocab=list(vocabulary), token_out_type=tf.int32,
                                                   unknown_token="[UNK]", lower_case_nfd_strip_accents=True)

    def call(self, texts):
        if self.kind == "bytes":
            ids = tf.cast(tf_text.ByteSplitter().split(texts), tf.int32) + 1
        elif self.kind == "whitespace":
            words = tf_text.WhitespaceTokenizer().tokenize(texts)
            ids = words.with_flat_values(tf.cast(self._lookup(words.flat_values), tf.int32))
        else:
            ids = self._bert.tokenize(texts)
        return ids[:, :self.max_length].to_tensor(0)

    def compute_output_spec(self, texts):
        return keras.KerasTensor(tuple(texts.shape) + (None,), dtype="int32")


def serving_model(classifier, tokenizer_config):
    """raw strings `[batch]` (tf.string) -> class probabilities."""
    texts = keras.Input((), dtype="string", name="texts")
    return keras.Model(texts, classifier(StringTokenizer(**tokenizer_config)(texts)), name="serving_model")


def export(classifier, tokenizer_config, class_names, export_dir, portable=True):
    """Writes the SavedModel (`serve`: strings -> probabilities) and its labels (assets.extra/labels.txt)."""
    model = serving_model(classifier, tokenizer_config)
    if portable:
        keras_yoso.export_portable(model, export_dir, format="tf_saved_model", verbose=False)
    else:
        model.export(export_dir, format="tf_saved_model", verbose=False)
    labels_dir = os.path.join(export_dir, "assets.extra")
    os.makedirs(labels_dir, exist_ok=True)
    with open(os.path.join(labels_dir, "labels.txt"), "w", encoding="utf-8") as f:
        f.write("".join(f"{name}\n" for name in class_names))
    return model
