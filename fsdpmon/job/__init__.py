"""The job model: the frozen snapshot of a whole job (its ranks, GPUs, nodes, processes and
targets), the one-word job state, and the ``--json`` contract they make.

Every reader of a job reads this: `top`'s views, `diagnose`, the demo. Sources (the scrape layer)
build it. It imports only the bottom layer.
"""
