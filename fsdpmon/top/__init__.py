"""`fsdpmon top`: one live terminal view of a whole FSDP job.

The terminal UI only: views are pure functions of a :class:`~fsdpmon.job.snapshot.JobSnapshot`
and the diagnosis's verdict, rendered with rich; the app is a thin refresh loop around a source
from the scrape layer (:mod:`fsdpmon.scrape`).
"""
