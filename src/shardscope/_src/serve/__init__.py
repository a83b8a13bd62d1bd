"""Serving plans (``shardscope.serve``): layouts and batches, estimated and compiled, offline
and at a request rate."""
