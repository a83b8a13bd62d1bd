"""The implementation of shardscope; the public API is the package's top level."""
