"""Where `fsdpmon top` reads from: each source's ``fetch()`` returns a JobSnapshot."""
