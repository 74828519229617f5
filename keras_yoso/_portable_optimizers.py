"""`.keras` files of compiled models saved on PyTorch name their optimizer as the other backends do.

On PyTorch, `keras.optimizers.Adam(...)` builds `keras.src.backend.torch.optimizers.torch_adam.Adam`,
a subclass that Keras does not export. Keras' serializer (`serialize_with_public_class` in
keras/src/saving/serialization_lib.py) finds no public name for it and writes the module of the
subclass, so a compiled model saved on PyTorch loads on JAX or TensorFlow only where torch is
installed (and then with the PyTorch optimizer, whose `fit` fails on JAX or TensorFlow variables);
without torch the load fails with "Could not deserialize class 'Adam' because its parent module
keras.src.backend.torch.optimizers.torch_adam cannot be imported".

`register_public_names()` gives each such subclass the public name of the class it replaces
(`keras.optimizers.Adam`), the name TensorFlow and JAX write: a file saved on PyTorch then holds
`{"module": "keras.optimizers", "class_name": "Adam"}` and loads on every backend, where Keras
builds that backend's Adam and restores the optimizer variables into it. Only the
class-to-name direction is added (the name still resolves to `keras.optimizers.Adam`, which
PyTorch's `TorchOptimizer.__new__` turns into its subclass again), and a name Keras already
gives a class is kept.
"""

import importlib
import inspect
import pkgutil

import keras
from keras.src import api_export


def _torch_optimizer_classes():
    """The optimizer classes defined in Keras' PyTorch backend package."""
    package = importlib.import_module("keras.src.backend.torch.optimizers")
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for cls in vars(module).values():
            if inspect.isclass(cls) and cls.__module__ == module.__name__:
                yield cls


def public_name(cls):
    """The exported name of the public Keras optimizer that `cls` stands in for: its nearest base
    of the same class name with an exported name (`keras.optimizers.Adam` for the PyTorch Adam);
    None for anything else."""
    for base in cls.__mro__[1:]:
        name = api_export.get_name_from_symbol(base)
        if base.__name__ == cls.__name__ and name is not None:
            return name
    return None


def register_public_names():
    """On the PyTorch backend, serializes each of Keras' PyTorch optimizer subclasses under the
    public name of its base class (no-op on the other backends, which have no such subclasses)."""
    if keras.backend.backend() != "torch":
        return
    for cls in _torch_optimizer_classes():
        name = public_name(cls)
        if name is not None:
            api_export.REGISTERED_OBJS_TO_NAMES.setdefault(cls, name)


register_public_names()
