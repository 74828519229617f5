"""How the ops run on a device mesh: the one place that knows `keras.distribution` and `jax.shard_map`.

Under a `keras.distribution` on JAX, the dense parts of a model (projections, normalization,
feed-forward) are partitioned by XLA (GSPMD) from the input and variable layouts. Two things
are not:

- an XLA FFI custom call (the native kernels) has no partitioning rule: under plain `jax.jit`
  on sharded inputs XLA gathers its operands and runs it whole on every device. `run` puts it
  inside `jax.shard_map`, so each device runs it on its own block (data parallel: blocks of the
  batch);
- under `keras_yoso.distribution.SequenceParallel` the sequence is split too, and attention
  needs its cross-shard terms: YOSO's bucket tables (`parallel/yoso_tables.py`), and the kernel state
  and horizon halo of LinearRelativeAttention (`parallel/linear_relative_halo.py`). Those run inside
  `jax.shard_map` with the collectives below, over the mesh's sequence axis.

`plan()` says which applies: None outside a distribution, on other backends, and inside a
`shard_map` already running (nothing nests).
"""

import contextvars

from keras_yoso import _backend
from keras_yoso.distribution import SequenceParallel

# True while a body of `run` is traced: the ops it calls run on their block, unsharded.
_INSIDE = contextvars.ContextVar("keras_yoso_inside_shard_map", default=False)


class Plan:
    """The active device mesh and the roles of its axes.

    mesh: the `jax.sharding.Mesh`; batch: the name of the axis that splits the batch (None if
    the distribution names none); seq: the name of the axis that splits the sequence (None:
    data parallel only); sizes: axis name -> number of devices along it.
    """

    def __init__(self, mesh, batch, seq):
        self.mesh = mesh
        self.batch = batch
        self.seq = seq
        self.sizes = dict(zip(mesh.axis_names, mesh.devices.shape))

    @property
    def seq_size(self):
        return self.sizes[self.seq] if self.seq else 1


def plan():
    """The `Plan` of the active `keras.distribution` on JAX, or None (no distribution, another
    backend, a one-device mesh, or inside a body of `run`)."""
    if _backend.backend() != "jax" or _INSIDE.get():
        return None
    import keras

    distribution = keras.distribution.distribution()
    if distribution is None:
        return None
    device_mesh = distribution.device_mesh
    if device_mesh is None or device_mesh.devices.size <= 1:
        return None
    names = list(device_mesh.axis_names)
    batch = distribution.batch_dim_name if distribution.batch_dim_name in names else None
    seq = distribution.sequence_dim_name if isinstance(distribution, SequenceParallel) else None
    return Plan(device_mesh.backend_mesh, batch, seq if seq in names else None)


def sequence_length_check(active, length, what):
    """ValueError when `length` (static) does not split evenly over the sequence axis of `active`."""
    if active is None or not active.seq or length is None:
        return
    if length % active.seq_size:
        raise ValueError(f"sequence parallelism splits {what} of length {length} over the {active.seq!r} axis of "
                         f"the device mesh ({active.seq_size} devices): the length must be a multiple of "
                         f"{active.seq_size}, received {length} (pad the sequences to a multiple of "
                         f"{active.seq_size}, with a padding mask).")


def run(active, fn, args, roles, out_roles):
    """`fn(*args)` inside `jax.shard_map` on `active.mesh`: each device gets its block of every
    argument (axes split as `roles` say, one tuple per argument, e.g. ("batch", "seq", None)) and
    returns its block of every output (`out_roles`, one tuple per output, or one tuple for a
    single output). The batch axis is split only when it divides over the mesh's batch axis (else
    every device holds all rows). The ops `fn` calls see `plan()` None (they run on the block)."""
    import jax
    from jax.sharding import PartitionSpec

    batches = [_backend.static_shape(arg)[role.index("batch")] for arg, role in zip(args, roles) if "batch" in role]
    split_batch = active.batch is not None and all(
        n is not None and n % active.sizes[active.batch] == 0 for n in batches)

    def spec(axis_roles):
        return PartitionSpec(*(active.batch if role == "batch" and split_batch else
                               active.seq if role == "seq" and active.seq else None for role in axis_roles))

    in_specs = tuple(spec(role) for role in roles)
    single = bool(out_roles) and not isinstance(out_roles[0], tuple)
    out_specs = spec(out_roles) if single else tuple(spec(role) for role in out_roles)

    def body(*blocks):
        token = _INSIDE.set(True)
        try:
            return fn(*blocks)
        finally:
            _INSIDE.reset(token)

    # The bodies write their own cross-device sums (and the gradients' in custom_gradient), so JAX's
    # replication checks are off: check_vma (jax >= 0.7), check_rep (jax.experimental before).
    if hasattr(jax, "shard_map"):
        mapped = jax.shard_map(body, mesh=active.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
    else:
        from jax.experimental.shard_map import shard_map

        mapped = shard_map(body, mesh=active.mesh, in_specs=in_specs, out_specs=out_specs, check_rep=False)
    return mapped(*args)


# ---------------------------------------------------------------------------- collectives over the sequence axis
# Called inside a body of `run` with the sequence axis name.

def psum(x, axis):
    """The sum of `x` over the devices of `axis` (an all-reduce)."""
    import jax

    return jax.lax.psum(x, axis)


def exclusive_scan(x, axis, size, direction=1):
    """The sum of `x` over the devices before this one along `axis` (direction=1), or after it
    (direction=-1); zeros on the first (last) device. One shift to the neighbour, then a
    Hillis-Steele scan over distances up to size - 2: 1 + ceil(log2(size - 1)) ppermutes of x's
    size (1 for 2 devices, 4 for 8), no [size, ...] buffer."""
    total = from_neighbour(x, axis, size, direction)
    step = 1
    while step < size - 1:
        total = total + from_neighbour(total, axis, size, step * direction)
        step *= 2
    return total


def from_neighbour(x, axis, size, offset):
    """`x` of the device `offset` places before this one along `axis` (after it when offset < 0),
    one ppermute; zeros on the devices that have no such neighbour (no wrap-around)."""
    import jax

    if offset > 0:
        pairs = [(source, source + offset) for source in range(size - offset)]
    else:
        pairs = [(source, source + offset) for source in range(-offset, size)]
    return jax.lax.ppermute(x, axis, pairs)

