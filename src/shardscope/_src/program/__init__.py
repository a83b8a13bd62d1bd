"""Plans of the user's own program (``shardscope.plan_program``): every rule set on every mesh
shape, compiled and ranked."""
