"""Training plans (``shardscope.plan``): candidates screened by the analytic model, the best
compiled, validated and ranked."""
