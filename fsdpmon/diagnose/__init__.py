"""Diagnosis: from a job's numbers to a verdict (which rank, pod, node, GPU, and why).

A pure package: snapshots (oldest first) and stack evidence in, findings out; no I/O, no clock.
"""

from fsdpmon.diagnose.engine import diagnose, judge
from fsdpmon.diagnose.findings import CAUSES, Finding, Verdict
from fsdpmon.diagnose.glance import glance
from fsdpmon.diagnose.history import SnapshotHistory
from fsdpmon.diagnose.stacks import RankStack, StackClass, merge, parse_stacks

__all__ = ["CAUSES", "Finding", "RankStack", "SnapshotHistory", "StackClass", "Verdict",
           "diagnose", "glance", "judge", "merge", "parse_stacks"]
