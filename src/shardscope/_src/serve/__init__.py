"""Serving plans (``shardscope.serve``): layouts and batches, estimated and compiled, offline
and at a request rate. Bottom up: ``types`` (the records and the layout vocabulary),
``layouts``, ``estimate`` (the roofline's step), ``compiled`` (the compiled step), ``search``
(:func:`~shardscope._src.serve.search.serve_request`, the front door), and ``online`` (the
queueing at a request rate)."""
