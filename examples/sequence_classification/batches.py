"""Labelled splits (`Split`, `hold_out`) and their length-bucketed batches (`Batches`, a
`keras.utils.PyDataset`): the batch of training step s is a fixed function of --seed and s, so
training split into pieces (`--checkpoint-dir`, `--stop-after-steps`) is the same training as one run."""

import dataclasses

import keras
import numpy as np

from .device_mesh import mesh_length_multiple, mesh_rows
from .tokenizers import PAD_ID


# Shortest bucket of the length bucketing; each next bucket doubles, up to max_length.
_FIRST_BUCKET_BOUNDARY = 128


@dataclasses.dataclass
class Split:
    """Texts and integer labels of one split."""

    texts: list
    labels: np.ndarray

    def __post_init__(self):
        self.labels = np.asarray(self.labels, np.int32)
        if len(self.labels) != len(self.texts):
            raise ValueError(f"{len(self.texts)} texts but {len(self.labels)} labels")

    def __len__(self):
        return len(self.texts)

    def subset(self, indices):
        return Split([self.texts[i] for i in indices], self.labels[indices])


def hold_out(train, fraction, seed):
    """(train, validation): a seeded random `fraction` of `train` held out, at least one example each."""
    if len(train) < 2:
        raise ValueError(f"need at least 2 training examples to hold out a validation split, got {len(train)}")
    order = np.random.default_rng(seed).permutation(len(train))
    num_validation = min(max(1, round(fraction * len(train))), len(train) - 1)
    return train.subset(np.sort(order[num_validation:])), train.subset(np.sort(order[:num_validation]))


def bucket_boundaries(max_length, multiple=1):
    """Upper length bounds of the buckets: 128, 256, ... and max_length (the last bucket), each
    rounded up to a multiple of `multiple` (the seq axis of --mesh; max_length is one already)."""
    boundaries, boundary = [], _FIRST_BUCKET_BOUNDARY
    while boundary < max_length:
        rounded = -(-boundary // multiple) * multiple
        if rounded < max_length and (not boundaries or rounded > boundaries[-1]):
            boundaries.append(rounded)
        boundary *= 2
    return boundaries + [max_length]


class Batches(keras.utils.PyDataset):
    """Length-bucketed batches of token ids, padded to their bucket's upper bound (few distinct shapes,
    so compiled steps are reused), as (ids [batch, bound] int32, labels [batch] int32).

    Training (`seed` given): pass p over the data shuffles each bucket and the order of all batches
    with NumPy generators seeded by (seed, p); item i is the batch of global step first_step + i, so
    any range of steps can be taken in any invocation. Evaluation (`seed` None): one pass in a
    fixed order.

    On a device mesh (--mesh) every batch must split evenly over the data axis: `row_multiple`.
    A training batch of a bucket's last few examples is then cut to a multiple of it (each pass's
    shuffle picks the examples cut; a bucket of fewer than `row_multiple` examples is not trained);
    an evaluation batch is padded with rows of padding to a multiple of it (`real_rows` says how
    many rows of item i are examples). Bucket lengths are multiples of `length_multiple` (the seq axis).
    """

    def __init__(self, token_ids, labels, batch_size, max_length, seed=None, first_step=0, num_steps=None,
                 row_multiple=1, length_multiple=1):
        super().__init__(workers=1, use_multiprocessing=False)
        self.token_ids, self.labels = token_ids, np.asarray(labels, np.int32)
        self.batch_size, self.seed, self.first_step = batch_size, seed, first_step
        self.row_multiple = row_multiple
        self.boundaries = bucket_boundaries(max_length, length_multiple)
        lengths = np.array([max(1, len(ids)) for ids in token_ids])
        self.bucket_of = np.searchsorted(self.boundaries, lengths, side="left")
        self._pass = None
        self.batches_per_pass = len(self._batches_of_pass(0))
        self.num_steps = self.batches_per_pass if num_steps is None else num_steps

    def _batches_of_pass(self, index):
        """[(bucket, example indices)] of pass `index`, in the order they are trained."""
        if self._pass is not None and self._pass[0] == index:
            return self._pass[1]
        rng = np.random.default_rng([self.seed, index]) if self.seed is not None else None
        batches = []
        for bucket in range(len(self.boundaries)):
            members = np.flatnonzero(self.bucket_of == bucket)
            if rng is not None:
                members = rng.permutation(members)
            batches += [(bucket, members[i:i + self.batch_size]) for i in range(0, len(members), self.batch_size)]
        if rng is not None and self.row_multiple > 1:  # training on a mesh: whole row blocks only
            batches = [(bucket, members[:len(members) - len(members) % self.row_multiple])
                       for bucket, members in batches if len(members) >= self.row_multiple]
        if rng is not None:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        self._pass = (index, batches)
        return batches

    def __len__(self):
        return self.num_steps

    def __getitem__(self, item):
        step = self.first_step + item
        bucket, members = self._batches_of_pass(step // self.batches_per_pass)[step % self.batches_per_pass]
        rows = -(-len(members) // self.row_multiple) * self.row_multiple  # padded rows: evaluation on a mesh
        ids = np.full((rows, self.boundaries[bucket]), PAD_ID, np.int32)
        for row, index in enumerate(members):
            ids[row, :len(self.token_ids[index])] = self.token_ids[index]
        labels = np.zeros(rows, np.int32)
        labels[:len(members)] = self.labels[members]
        return ids, labels

    def keras_input(self):
        """What `fit`, `evaluate` and `predict` take: these batches, or on TensorFlow a tf.data.Dataset of
        them whose signature leaves the length free. (Keras would infer a PyDataset's signature from its
        first two batches and then refuse a batch of another bucket's length.)"""
        if keras.backend.backend() != "tensorflow":
            return self
        import tensorflow as tf

        signature = (tf.TensorSpec((None, None), tf.int32), tf.TensorSpec((None,), tf.int32))
        dataset = tf.data.Dataset.from_generator(lambda: (self[i] for i in range(len(self))), output_signature=signature)
        return dataset.apply(tf.data.experimental.assert_cardinality(len(self)))

    def real_rows(self, item):
        """How many rows of item `item` are examples (the rest: padding rows of evaluation on a mesh)."""
        step = self.first_step + item
        return len(self._batches_of_pass(step // self.batches_per_pass)[step % self.batches_per_pass][1])


def split_batches(args, encoded, split, **kwargs):
    """Batches of one split, whose rows and lengths split evenly over --mesh."""
    return Batches(encoded, split.labels, args.batch_size, args.max_length, row_multiple=mesh_rows(args),
                   length_multiple=mesh_length_multiple(args), **kwargs)
