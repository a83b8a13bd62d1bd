"""The implementation of shardscope; the public API is the package's top level."""

from shardscope._src.base.startup import import_jax as _import_jax

# Before any module here imports JAX: its first import is made quietly (see import_jax). It
# sets no environment variable; the deviceless set-up waits until a target is asked for.
_import_jax()
