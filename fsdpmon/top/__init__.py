"""`fsdpmon top`: one live terminal view of a whole FSDP job.

Sources (plain scrape targets, Prometheus, Kubernetes) build the same frozen
:class:`~fsdpmon.top.snapshot.JobSnapshot`; views are pure functions of a snapshot; the app is a
thin refresh loop around them.
"""
