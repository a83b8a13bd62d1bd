"""A planner worker process: ``python -m shardscope._src.plan N`` runs the tasks it reads on
stdin on N simulated CPU devices (see :mod:`shardscope._src.plan.worker`)."""

import sys

from shardscope._src.plan.worker import work

if __name__ == "__main__":
    raise SystemExit(work(int(sys.argv[1]), targets="targets" in sys.argv[2:]))
