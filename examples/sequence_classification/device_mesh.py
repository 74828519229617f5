"""--mesh data=D,seq=S (JAX): the option, its checks, the `keras_yoso.distribution.SequenceParallel`
it trains under, and what the run prints and records about it."""

import os

import keras

import keras_yoso


# The user-facing axis names of --mesh and the keras.distribution.DeviceMesh axes they become.
MESH_AXES = {"data": "batch", "seq": "seq"}
DISTRIBUTED_DOC = "docs/distributed.md"


def add_mesh_argument(parser):
    """--mesh data=D,seq=S: data and sequence parallel training on D*S devices (JAX)."""
    group = parser.add_argument_group("devices (JAX)")
    group.add_argument("--mesh", default=None, metavar="data=D,seq=S",
                       help="train data and sequence parallel on a D x S device mesh "
                            "(keras_yoso.distribution.SequenceParallel; KERAS_BACKEND=jax): each batch is split in D "
                            "row blocks and each sequence in S blocks; --batch-size must be a multiple of D, "
                            "--max-length of S. An axis left out is 1. With fewer devices than D*S on CPU, the script "
                            "makes D*S virtual CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count). "
                            f"Default: one device. TensorFlow / PyTorch: see {DISTRIBUTED_DOC}")


def parse_mesh(text):
    """{"data": D, "seq": S} of a --mesh value such as "data=2,seq=4" (an axis left out is 1);
    ValueError saying what is wrong."""
    sizes = {}
    for item in text.split(","):
        name, equals, value = item.strip().partition("=")
        name = name.strip()
        if not equals or name not in MESH_AXES:
            raise ValueError(f"{item.strip()!r} is not an axis: write data=D,seq=S (axes {', '.join(MESH_AXES)})")
        if name in sizes:
            raise ValueError(f"the axis {name} is given twice")
        try:
            sizes[name] = int(value)
        except ValueError:
            raise ValueError(f"{name}={value.strip()!r}: the number of devices must be an integer") from None
        if sizes[name] < 1:
            raise ValueError(f"{name}={sizes[name]}: the number of devices must be >= 1")
    return {name: sizes.get(name, 1) for name in MESH_AXES}


def _mesh_text(sizes):
    return ",".join(f"{name}={size}" for name, size in sizes.items())


def check_mesh_arguments(parser, args):
    """parser.error() unless --mesh can run: a well-formed mesh, --max-length a multiple of seq,
    --batch-size of data, the JAX backend, and data*seq devices (virtual CPU devices are asked for
    when JAX has not started yet). Normalizes args.mesh to "data=D,seq=S"."""
    try:
        sizes = parse_mesh(args.mesh)
    except ValueError as error:
        parser.error(f"--mesh {args.mesh}: {error}")
    args.mesh = _mesh_text(sizes)
    if args.max_length % sizes["seq"]:
        parser.error(f"--max-length {args.max_length} must be a multiple of the seq axis of --mesh {args.mesh} "
                     f"({sizes['seq']}): each sequence is split in {sizes['seq']} equal blocks")
    if args.batch_size % sizes["data"]:
        parser.error(f"--batch-size {args.batch_size} must be a multiple of the data axis of --mesh {args.mesh} "
                     f"({sizes['data']}): each batch is split in {sizes['data']} equal row blocks")
    if keras.backend.backend() != "jax":
        parser.error(f"--mesh (sequence parallelism, keras_yoso.distribution.SequenceParallel) needs KERAS_BACKEND=jax, "
                     f"this is KERAS_BACKEND={keras.backend.backend()}. For data parallel training on TensorFlow "
                     f"(tf.distribute) or PyTorch (DistributedDataParallel), see {DISTRIBUTED_DOC}")
    count = sizes["data"] * sizes["seq"]
    devices = mesh_devices(count)
    if len(devices) < count:
        platform = devices[0].platform if devices else "?"
        hint = (f" JAX had started before the script could ask for {count} virtual CPU devices: set "
                f"XLA_FLAGS=--xla_force_host_platform_device_count={count} in the environment before Python imports "
                "jax (run as a script, long_text_classifier.py does this itself)." if platform == "cpu" else "")
        parser.error(f"--mesh {args.mesh} needs {sizes['data']} x {sizes['seq']} = {count} devices, JAX has "
                     f"{len(devices)} ({platform}).{hint}")


def mesh_devices(count):
    """JAX's devices, after asking for `count` virtual CPU devices if JAX has not started yet and
    XLA_FLAGS does not say how many (on a GPU machine the CPU count is unused)."""
    import jax

    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        try:
            if jax.config.jax_num_cpu_devices < count:
                jax.config.update("jax_num_cpu_devices", count)
        except (RuntimeError, AttributeError):  # JAX's backends are up already (or an older JAX): count as they are
            pass
    return jax.devices()


def mesh_distribution(args):
    """The `keras_yoso.distribution.SequenceParallel` of --mesh (axes "batch" and "seq" of a
    keras.distribution.DeviceMesh on the first data*seq devices), or None without --mesh."""
    if getattr(args, "mesh", None) is None:
        return None
    sizes = parse_mesh(args.mesh)
    count = sizes["data"] * sizes["seq"]
    mesh = keras.distribution.DeviceMesh((sizes["data"], sizes["seq"]), [MESH_AXES[name] for name in sizes],
                                         keras.distribution.list_devices()[:count])
    return keras_yoso.distribution.SequenceParallel(mesh, batch_dim_name="batch", sequence_dim_name="seq")


def mesh_rows(args):
    """Rows of a batch must be a multiple of this: the data axis of --mesh (1 without)."""
    return parse_mesh(args.mesh)["data"] if getattr(args, "mesh", None) else 1


def mesh_length_multiple(args):
    """Padded lengths must be a multiple of this: the seq axis of --mesh (1 without)."""
    return parse_mesh(args.mesh)["seq"] if getattr(args, "mesh", None) else 1


def describe_mesh(args, probe, num_train):
    """Prints how --mesh splits the batches, and how many training examples a pass leaves out."""
    sizes = parse_mesh(args.mesh)
    mesh = keras.distribution.distribution().device_mesh
    platform = str(mesh.devices.flat[0]).split(":")[0]
    print(f"--mesh {args.mesh}: data and sequence parallel on {mesh.devices.size} {platform} devices "
          f"(keras_yoso.distribution.SequenceParallel, mesh axes {list(mesh.axis_names)} of shape {tuple(mesh.shape)}): "
          f"each device holds {args.batch_size // sizes['data']} row(s) x 1/{sizes['seq']} of each sequence "
          f"({args.max_length // sizes['seq']} of {args.max_length} positions at the longest)", flush=True)
    kept = sum(len(rows) for _, rows in probe._batches_of_pass(0))
    if kept < num_train:
        print(f"note: {num_train - kept} of {num_train} training examples per pass are left out (a bucket's last batch "
              f"is cut to a multiple of data={sizes['data']} rows; the shuffle of each pass picks which)", flush=True)


def mesh_metrics(args):
    """metrics.json's "mesh": None on one device, else the axes and the devices of --mesh."""
    if not getattr(args, "mesh", None):
        return None
    mesh = keras.distribution.distribution().device_mesh
    return {**parse_mesh(args.mesh), "axis_names": list(mesh.axis_names),
            "devices": [str(device) for device in mesh.devices.flat]}
