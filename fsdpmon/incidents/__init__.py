"""After the fact: a run's incidents and goodput, from its JSONL or from Prometheus history."""
