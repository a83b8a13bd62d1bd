"""A measured profile of a program beside the audit's prediction of it (``shardscope.profile``)."""
