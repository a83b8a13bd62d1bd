"""Minimum communication of collectives (bandwidth-optimal bytes per device, alpha-beta time).

>>> from shardscope import comm
>>> comm.traffic_bytes("all-reduce", 16 * 1024 * 4, 8)
114688
"""

from shardscope._src.base.comm import KINDS as KINDS
from shardscope._src.base.comm import CollectiveKind as CollectiveKind
from shardscope._src.base.comm import format_bytes as format_bytes
from shardscope._src.base.comm import latency_steps as latency_steps
from shardscope._src.base.comm import traffic_bytes as traffic_bytes
from shardscope._src.cost.links import alpha_beta_time as alpha_beta_time
