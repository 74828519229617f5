"""Tokenizers to NumPy token ids, id 0 being padding: UTF-8 bytes, whitespace words of a fixed
vocabulary, BERT wordpieces (tensorflow-text). `serving_config()` is what text_serving.StringTokenizer
needs to compute the same ids in a SavedModel's graph."""

import numpy as np

PAD_ID = 0


class ByteTokenizer:
    """UTF-8 bytes (the LRA Text setting): id = byte + 1, 0 is padding."""

    kind = "bytes"
    vocab_size = 257

    def __init__(self, max_length):
        self.max_length = max_length

    def encode(self, texts):
        """A list of int32 id arrays, one per text, truncated to max_length."""
        return [np.frombuffer(text.encode("utf-8")[:self.max_length], np.uint8).astype(np.int32) + 1
                for text in texts]

    def serving_config(self):
        return {"kind": self.kind, "max_length": self.max_length}


class WhitespaceTokenizer:
    """Whitespace-separated words of a fixed `vocabulary`: id 0 padding, 1 unknown, 2 + i `vocabulary[i]`."""

    kind = "whitespace"

    def __init__(self, vocabulary, max_length):
        self.vocabulary = list(vocabulary)
        self.max_length = max_length
        self._ids = {word: index + 2 for index, word in enumerate(self.vocabulary)}

    @property
    def vocab_size(self):
        return len(self.vocabulary) + 2

    def encode(self, texts):
        return [np.fromiter((self._ids.get(word, 1) for word in text.split()[:self.max_length]), np.int32)
                for text in texts]

    def serving_config(self):
        return {"kind": self.kind, "max_length": self.max_length, "vocabulary": self.vocabulary}


class WordpieceTokenizer:
    """BERT wordpieces (lower-cased, accents stripped) of `vocabulary`, whose entry 0 is the padding
    token. Tokenizes with tensorflow-text, so it needs TensorFlow installed (any Keras backend)."""

    kind = "wordpiece"

    def __init__(self, vocabulary, max_length):
        import tensorflow as tf
        import tensorflow_text as tf_text

        self.vocabulary = list(vocabulary)
        self.max_length = max_length
        self._tf = tf
        self._tokenizer = tf_text.FastBertTokenizer(vocab=self.vocabulary, token_out_type=tf.int32,
                                                    unknown_token="[UNK]", lower_case_nfd_strip_accents=True)

    @property
    def vocab_size(self):
        return len(self.vocabulary)

    def encode(self, texts, batch=1024):
        ids = []
        for start in range(0, len(texts), batch):
            ragged = self._tokenizer.tokenize(self._tf.constant(texts[start:start + batch]))[:, :self.max_length]
            ids += [np.asarray(row, np.int32) for row in ragged.to_list()]
        return ids

    def serving_config(self):
        return {"kind": self.kind, "max_length": self.max_length, "vocabulary": self.vocabulary}
