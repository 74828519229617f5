"""The providers of the YOSO primitives, one per implementation (see `base.Provider`):
`composite` (keras.ops, every backend), `tensorflow` (the TF op library), `jax` (XLA FFI) and
`torch` (torch.library) over the native library that `native_library` loads. `_dispatch` imports
the running backend's native provider by name; nothing here imports a provider for another."""
