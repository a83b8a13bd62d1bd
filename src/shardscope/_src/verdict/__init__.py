"""The verdict: what a compiled program communicates against the minimum, per axis and kind.

:mod:`~shardscope._src.check.compare` (a floor below, shared with the planner) is pure: an
audit and a bound in, a :class:`Verdict` out (rows per mesh axes and kind, the ratio, and the
instructions that exceed the bound with their source lines).
:mod:`~shardscope._src.verdict.hints` compiles the changes that should reach the bound, and
:mod:`~shardscope._src.verdict.reports` holds the two front doors, :func:`matmul_verdict` and
:func:`transformer_verdict`, which build and compile the program, audit it, judge it and,
when it exceeds the bound, report the traffic each hint achieves: a hint is only ever given
with the bytes it was measured to send.
"""

from shardscope._src.check.bound import TOLERANCE as TOLERANCE
from shardscope._src.check.bound import Standing as Standing
from shardscope._src.check.compare import Excess as Excess
from shardscope._src.check.compare import ExcessCause as ExcessCause
from shardscope._src.check.compare import Hint as Hint
from shardscope._src.check.compare import Row as Row
from shardscope._src.check.compare import Verdict as Verdict
from shardscope._src.check.compare import VerdictNote as VerdictNote
from shardscope._src.check.compare import compare as compare
from shardscope._src.check.compare import narrowed_bytes as narrowed_bytes
from shardscope._src.verdict.reports import MatmulReport as MatmulReport
from shardscope._src.verdict.reports import MoEReport as MoEReport
from shardscope._src.verdict.reports import TransformerReport as TransformerReport
from shardscope._src.verdict.reports import matmul_verdict as matmul_verdict
from shardscope._src.verdict.reports import moe_verdict as moe_verdict
from shardscope._src.verdict.reports import transformer_verdict as transformer_verdict
