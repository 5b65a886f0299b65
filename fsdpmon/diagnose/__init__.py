"""Diagnosis: from a job's numbers to a verdict (which rank, pod, node, GPU, and why).

A pure package: snapshots (oldest first) and stack evidence in, findings out; no I/O, no clock.
"""

from fsdpmon.diagnose.engine import diagnose
from fsdpmon.diagnose.findings import CAUSES, CRITICAL, WARNING, Finding, Verdict
from fsdpmon.diagnose.history import SnapshotHistory
from fsdpmon.diagnose.stacks import RankStack, StackClass, merge, parse_stacks

__all__ = ["CAUSES", "CRITICAL", "WARNING", "Finding", "RankStack", "SnapshotHistory",
           "StackClass", "Verdict", "diagnose", "merge", "parse_stacks"]
