"""Sequence parallelism for keras_yoso's attention layers, on `keras.distribution` (JAX).

    mesh = keras.distribution.DeviceMesh((2, 4), ["batch", "seq"], keras.distribution.list_devices())
    keras.distribution.set_distribution(keras_yoso.distribution.SequenceParallel(mesh))
    model.fit(tokens, labels)          # tokens [B, N]: device (i, j) holds batch block i, sequence block j

See docs/distributed.md for data parallelism on every backend, what is communicated per layer,
and the worked example.
"""

import keras

__all__ = ["SequenceParallel"]


class SequenceParallel(keras.distribution.ModelParallel):
    """A `keras.distribution.Distribution` that splits each input over its batch AND its sequence.

    The data layout shards every model input of rank >= 2 as [batch, seq, ...]: axis 0 over the
    mesh axis `batch_dim_name`, axis 1 over `sequence_dim_name` (axis 1 stays whole on each
    device when its length does not divide over that axis: e.g. [B, num_classes] labels), and
    rank-1 inputs over the batch. Variables are replicated unless `layout_map` gives them a
    layout (as `keras.distribution.ModelParallel`).

    Set (`keras.distribution.set_distribution(dist)` or `with dist.scope():`), `model.fit`,
    `predict` and `evaluate` run sequence-parallel on JAX: the dense layers are partitioned by
    XLA along the sequence; `keras_yoso.layers.YosoAttention` computes per-device bucket tables
    and combines them with one psum per call (forward; the eq. 4 backward reduces the tables of
    dY and the outer-product tables of (V, K) and (dY, Q)), native kernels running on each
    device's block inside `jax.shard_map`; causal YOSO takes the tables of the earlier devices
    (an exclusive scan: 1 + ceil(log2(P - 1)) ppermutes); `keras_yoso.layers.LinearRelativeAttention` psums its
    kernel state S = sum phi(k) [v, 1] and exchanges the `horizon` rows at each block edge with
    its neighbours (ppermute). Hash functions are the same on every device (same seed and
    step). Results equal the one-device run to float32 rounding.

    A sequence length that does not divide over the sequence axis, or a batch that does not divide
    over the batch axis, raises ValueError naming both numbers (pad the sequences to a multiple, with
    a padding mask; choose the batch size a multiple). On TensorFlow and PyTorch use
    tf.distribute / DistributedDataParallel (data parallel; docs/distributed.md).

    Args:
        device_mesh: A `keras.distribution.DeviceMesh` holding both axes.
        batch_dim_name: The mesh axis that splits the batch (default "batch").
        sequence_dim_name: The mesh axis that splits the sequence (default "seq").
        layout_map: Optional `keras.distribution.LayoutMap` (on the same mesh) for variables or
            intermediate tensors that should not be replicated.
    """

    def __init__(self, device_mesh, batch_dim_name="batch", sequence_dim_name="seq", layout_map=None):
        if keras.backend.backend() != "jax":
            raise ValueError(f"SequenceParallel runs on the JAX backend (keras.distribution, jax.shard_map); this is "
                             f"KERAS_BACKEND={keras.backend.backend()}. Train data parallel with "
                             "tf.distribute.MirroredStrategy (TensorFlow) or torch DistributedDataParallel "
                             "(PyTorch): docs/distributed.md.")
        if not isinstance(device_mesh, keras.distribution.DeviceMesh):
            raise ValueError("SequenceParallel needs device_mesh: a keras.distribution.DeviceMesh, received "
                             f"{type(device_mesh).__name__}")
        names = list(device_mesh.axis_names)
        for argument, name in (("batch_dim_name", batch_dim_name), ("sequence_dim_name", sequence_dim_name)):
            if name not in names:
                raise ValueError(f"SequenceParallel: {argument}={name!r} is not an axis of the device mesh, whose "
                                 f"axes are {names}")
        if batch_dim_name == sequence_dim_name:
            raise ValueError("SequenceParallel: batch_dim_name and sequence_dim_name must name two different mesh "
                             f"axes, both are {batch_dim_name!r}")
        if layout_map is None:
            layout_map = keras.distribution.LayoutMap(device_mesh)
        elif not isinstance(layout_map, keras.distribution.LayoutMap):
            raise ValueError("SequenceParallel: layout_map must be a keras.distribution.LayoutMap or None, received "
                             f"{type(layout_map).__name__}")
        elif layout_map.device_mesh is not device_mesh:
            raise ValueError("SequenceParallel: layout_map must be built on the same device_mesh "
                             f"(LayoutMap(device_mesh)); its mesh is {layout_map.device_mesh}, device_mesh is "
                             f"{device_mesh}")
        super().__init__(layout_map=layout_map, batch_dim_name=batch_dim_name)
        self._sequence_dim_name = sequence_dim_name

    @property
    def sequence_dim_name(self):
        """The mesh axis that splits the sequence (axis 1 of the inputs)."""
        return self._sequence_dim_name

    @property
    def sequence_shards(self):
        """The number of devices along the sequence axis."""
        return self.device_mesh.shape[list(self.device_mesh.axis_names).index(self._sequence_dim_name)]

    @property
    def batch_shards(self):
        """The number of devices along the batch axis."""
        return self.device_mesh.shape[list(self.device_mesh.axis_names).index(self.batch_dim_name)]

    def get_data_layout(self, data_shape):
        """[batch, seq, None, ...] for inputs of rank >= 2 (axis 1 whole when it does not divide over
        the sequence axis), [batch] for rank 1. A batch that does not divide over the batch axis
        raises ValueError naming both numbers (JAX's own error names neither argument nor remedy)."""
        if data_shape and data_shape[0] is not None and data_shape[0] % self.batch_shards:
            size = self.batch_shards
            raise ValueError(f"sequence parallelism splits the batch of {data_shape[0]} rows (an input of shape "
                             f"{tuple(data_shape)}) over the {self.batch_dim_name!r} axis of the device mesh ({size} "
                             f"devices): the batch size must be a multiple of {size}, received {data_shape[0]} "
                             f"(pass a batch_size that is a multiple of {size}; Keras lays out every batch of an "
                             "epoch like its first, so make the number of examples a multiple of batch_size too, or "
                             "drop the last batch).")
        axes = [None] * len(data_shape)
        if axes:
            axes[0] = self.batch_dim_name
        if len(axes) >= 2 and data_shape[1] is not None and data_shape[1] % self.sequence_shards == 0:
            axes[1] = self._sequence_dim_name
        return keras.distribution.TensorLayout(axes, self.device_mesh)

    def __repr__(self):
        return (f"<SequenceParallel device_mesh={self.device_mesh}, batch_dim_name={self.batch_dim_name!r}, "
                f"sequence_dim_name={self._sequence_dim_name!r}>")
