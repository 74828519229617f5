"""The provider of one device's block of a sequence split over a mesh axis (`_dispatch.on_mesh`
wraps the op's provider in it under `keras_yoso.distribution.SequenceParallel`)."""

from keras_yoso.ops.composite.chunking import f32
from keras_yoso.ops.parallel import linear_relative_halo
from keras_yoso.ops.parallel import yoso_tables
from keras_yoso.ops.providers import base


class SequenceShardedProvider(base.DelegatingProvider):
    """`inner` (the provider chosen for the op, whose declarations it reports) on this device's
    block, plus the other blocks' terms over the mesh axis `axis` of `size` devices: YOSO's through
    bucket tables (`yoso_tables`), LinearRelativeAttention's through its kernel state and horizon
    halo (`linear_relative_halo`). Codes and masks are the block's; queries and keys are in the
    same blocks of the sequence axis (cross-attention: blocks of each side's own length)."""

    def __init__(self, inner, axis, size):
        super().__init__(inner)
        self.axis, self.size = axis, size

    def run(self, name, *arguments):
        """lsh_cumulation: the block's own keys (`inner`) plus the other blocks' tables; hashing is
        per position (`inner` alone); the weighted and collision cumulations have no
        sequence-parallel form (ValueError)."""
        if name.endswith("hash_codes"):
            return self.inner.run(name, *arguments)
        if name == "lsh_cumulation":
            return f32(self.inner.run(name, *arguments)) + yoso_tables.lsh_remote(self.axis, self.size, *arguments)
        if name == "collision_cumulation":
            raise ValueError("backward=\"collision\" (*YOSO) is not sequence-parallel: its pair weight depends on "
                             "<Q_i, K_j> itself, so it needs the colliding keys of every device, not bucket sums. "
                             "Use backward=\"lower_bound\" (paper eq. 4) under "
                             "keras_yoso.distribution.SequenceParallel.")
        raise ValueError(f"{name} has no sequence-parallel form here: call it outside "
                         "keras_yoso.distribution.SequenceParallel (YOSO's backward uses lower_bound_gradients).")

    def lower_bound_gradients(self, *arguments, fused=True):
        dq, dk = self.inner.lower_bound_gradients(*arguments, fused=fused)
        remote_dq, remote_dk = yoso_tables.lower_bound_remote(self.axis, self.size, *arguments)
        return f32(dq) + remote_dq, f32(dk) + remote_dk

    def linear_relative_total(self, phi_q, phi_k, v, scores, horizon, causal, chunk_size):
        return linear_relative_halo.block_total(self.axis, self.size, phi_q, phi_k, v, scores, horizon, causal,
                                                chunk_size)
