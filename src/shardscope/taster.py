"""The sharding taster lab, one step a function: ``shardscope lab`` runs :func:`run`, and the
notebook ``notebooks/sharding_taster.py`` calls the steps one by one. Every step takes the
:class:`~shardscope.Lab` it records its checks in."""

from shardscope._src.lab.taster import LAB_ID as LAB_ID
from shardscope._src.lab.taster import audit_demo as audit_demo
from shardscope._src.lab.taster import check_devices as check_devices
from shardscope._src.lab.taster import exercises as exercises
from shardscope._src.lab.taster import lab_device_counts as lab_device_counts
from shardscope._src.lab.taster import make_inputs as make_inputs
from shardscope._src.lab.taster import memory_layouts as memory_layouts
from shardscope._src.lab.taster import memory_picture as memory_picture
from shardscope._src.lab.taster import mesh_1d as mesh_1d
from shardscope._src.lab.taster import mesh_2d as mesh_2d
from shardscope._src.lab.taster import processes_agree as processes_agree
from shardscope._src.lab.taster import reshard as reshard
from shardscope._src.lab.taster import run as run
from shardscope._src.lab.taster import shard_parameter as shard_parameter
from shardscope._src.lab.taster import sharded_matmul as sharded_matmul
