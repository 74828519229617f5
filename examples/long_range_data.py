"""The built-in long-text task of examples/long_text_classifier.py: "is the tag of the document's topic warm?".

Each document is `length` whitespace-separated words. Its filler words are drawn at random from one of
two topics (two disjoint word lists, TOPICS), and it holds two tag words at random positions at least
`length // 4` apart (on average about length / 2): one tag of topic 0 (red or blue) and one tag of
topic 1 (yellow or green), in random order. The label is whether the tag *of the document's own topic*
is warm (red, yellow) or cool (blue, green); the other tag is a distractor. Balanced: the topic and
both tags are independent fair coins.

Why it needs attention over long range: the label is a multiplexer, "topic 0 ? tag 0 : tag 1", of one
strong feature (the topic, spread over every word) and two features each carried by one word of
`length`. With attention every filler word can fetch the tag of its own topic from ~length / 2 positions
away, and the mean over the document then carries the answer at full strength. A model that only pools
per-token features (bag of words) sees the topic and both tags, but must gate two 1/length-sized signals
by the topic after pooling; in docs/results.md ("Built-in task") it stays at chance on the training budget
that takes YosoAttention to ~100%.

Deterministic from the seed (NumPy's PCG64), so every backend and machine trains on the same data.
"""

import numpy as np

TOPICS = (("the", "a", "of", "and", "to", "in", "is", "was", "it", "for", "on", "with", "as", "at", "by", "this",
           "that", "from", "or", "an", "be", "are", "film", "story", "plot", "scene", "actor", "music", "long",
           "short", "good", "bad"),
          ("very", "not", "but", "so", "one", "two", "time", "end", "first", "last", "old", "new", "book", "page",
           "word", "line", "part", "place", "day", "night", "light", "dark", "water", "stone", "tree", "road",
           "house", "door", "window", "table", "chair", "paper"))
# TAGS[topic] = (cool, warm): the label is 1 when the tag of the document's topic is its warm word.
TAGS = (("blue", "red"), ("green", "yellow"))
VOCABULARY = TOPICS[0] + TOPICS[1] + TAGS[0] + TAGS[1]
CLASS_NAMES = ("cool", "warm")


def generate_documents(count, seed, length=2048):
    """(texts, labels): `count` documents of `length` words and their labels (1: the topic's tag is warm).

    `seed`: anything np.random.default_rng accepts. Raises ValueError when `length` < 8.
    """
    if length < 8:
        raise ValueError(f"documents need at least 8 words, got length={length}")
    rng = np.random.default_rng(seed)
    words = np.array(VOCABULARY)
    topic_size = len(TOPICS[0])
    topic = rng.integers(0, 2, size=count)
    ids = rng.integers(0, topic_size, size=(count, length)) + topic_size * topic[:, None]
    warm = rng.integers(0, 2, size=(count, 2))  # warm[:, t]: whether the tag of topic t is warm
    gap = length // 4
    first = rng.integers(0, length - gap, size=count)
    second = np.minimum(first + gap + (rng.random(count) * (length - gap - first)).astype(int), length - 1)
    topic_0_first = rng.integers(0, 2, size=count).astype(bool)
    rows = np.arange(count)
    tag_ids = 2 * topic_size + 2 * np.arange(2)[None, :] + warm  # [count, 2]: the id of each topic's tag
    ids[rows, np.where(topic_0_first, first, second)] = tag_ids[:, 0]
    ids[rows, np.where(topic_0_first, second, first)] = tag_ids[:, 1]
    labels = warm[rows, topic]
    return [" ".join(words[row]) for row in ids], labels.astype(np.int32)


def truncation_ceiling(texts, words):
    """The expected accuracy, on `texts` (documents of generate_documents), of the best model that reads
    only each document's first `words` words (e.g. a model truncated to its positions).

    Such a model knows the label exactly where the tag of the document's own topic is among those words
    (the filler gives the topic, the tag gives warm or cool); elsewhere the other tag is independent of
    the label, so it can do no better than a fair coin there. Returns share_seen + (1 - share_seen) / 2.
    With length 2,046 and words 510 (a 512-position BERT and its [CLS] and [SEP]), the second tag is
    always beyond the window and the first tag is the own one half the time: about 0.58.
    """
    if words < 0:
        raise ValueError(f"words must be >= 0, got {words}")
    tag_topic = {tag: topic for topic, tags in enumerate(TAGS) for tag in tags}
    seen = 0
    for text in texts:
        document = text.split()
        topic = 0 if next(word for word in document if word not in tag_topic) in TOPICS[0] else 1
        seen += any(tag_topic.get(word) == topic for word in document[:words])
    return (seen + (len(texts) - seen) / 2) / max(len(texts), 1)
