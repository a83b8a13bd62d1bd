"""Compiled collectives against a bound, pure and shared by the verdict and the planner.

:mod:`~shardscope._src.check.bound` holds the one rule (match, exceed, undercut) and its one
tolerance; :mod:`~shardscope._src.check.compare` judges an audit against a bound with it (rows
per mesh axes and kind, the ratio, the instructions that exceed the bound with their source
lines). Nothing here compiles.
"""

from shardscope._src.check.bound import TOLERANCE as TOLERANCE
from shardscope._src.check.bound import Standing as Standing
from shardscope._src.check.bound import standing as standing
from shardscope._src.check.bound import within_bound as within_bound
