"""``shardscope.suggest``: proposes the rules and the mesh of the user's program, proved by
compiling them."""
