"""The ops on a device mesh: `mesh` (the active `keras.distribution`, `shard_map` and the
collectives), `yoso_tables` (YOSO's other blocks through bucket tables) and
`linear_relative_halo` (LinearRelativeAttention's kernel state and horizon halo)."""
