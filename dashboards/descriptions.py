"""What each panel shows, for panels whose builder call gives no description of its own.

Grafana shows the description as the panel's (i) tooltip; every panel has one (a test checks),
so an on-call engineer never has to guess what a line means. Keyed by panel title.
"""

from __future__ import annotations

DESCRIPTIONS = {
    # Job overview
    "Tokens/s": "Tokens per second of the whole job: the sum over ranks of each rank's rate "
                "over its last log window.",
    "Tokens/s per GPU": "Mean tokens per second per rank (one rank per GPU): compare runs of "
                        "different sizes; it falls when scaling stops being linear.",
    "Progress": "Highest step reached over the planned number of steps.",
    "Tokens/s (job)": "The job's tokens per second over time (sum over ranks).",
    "Step time (median and slowest rank)": "Median and maximum over ranks of the mean step "
                                           "time in the last log window; a gap between them "
                                           "points at a straggler.",
    "MFU": "Model FLOPs utilisation, mean over ranks; absent on devices whose peak FLOP/s is "
           "unknown (and on CPU).",
    "Steps per second": "Optimiser steps per second (the fastest rank's counter rate).",
    "Loss (mean and max over ranks)": "Training loss at the last log step: mean and maximum "
                                      "over ranks; a rank far above the mean has bad data.",
    "Learning rate": "Learning rate at the last log step (schedule: warm-up then decay).",
    "Gradient norm": "Global gradient norm at the last log step; spikes precede loss spikes.",
    "Ranks reporting": "Ranks whose series Prometheus scrapes now; a drop means a rank or pod "
                       "went away.",
    # Ranks
    "Step time per rank": "Mean step time of each rank over its last log window. In "
                          "synchronous training they are alike: the straggler is the rank "
                          "that waits least, not the one with the longest step.",
    "Step time spread (rank 0's view of the job)": "Fastest, median and slowest rank's step "
                                                    "time as rank 0 computed them.",
    "Step duration p50 / p99 per rank": "Quantiles of each rank's step durations from its "
                                        "histogram, over the rate interval.",
    "Data-wait share per rank": "Share of each rank's step time spent blocked waiting for "
                                "input data; a rank above the others is input-bound.",
    "Time per step by phase": "Mean time per step in each phase (data, forward, backward, "
                              "optimizer, checkpoint) over the last log window.",
    "Heartbeat age per rank": "Seconds since each rank completed a step; a rank whose line "
                              "climbs while others stay flat is the one that hangs.",
    "Tokens/s per rank": "Tokens per second of each rank over its last log window.",
    "Highest peak memory over ranks": "The largest peak active device memory over ranks "
                                      "(process RSS on CPU runs), and which rank holds it.",
    "Allocator retries and OOMs": "CUDA caching-allocator retries (a cudaMalloc failed and the "
                                  "cache was flushed) and out-of-memory errors, per rank.",
    "Ranks now": "Every rank's current figures in one table: step, step time, data wait, "
                 "memory and heartbeat.",
    # Nodes and GPUs
    "GPU utilisation": "Share of time each GPU had a kernel running (NVML utilisation).",
    "SM and tensor-core activity": "GPM SM and tensor-core activity (Hopper and newer): how "
                                   "busy the GPU really is, unlike NVML utilisation.",
    "Average GPU utilisation per node": "Mean GPU utilisation over each node's GPUs.",
    "GPU memory used": "Device memory in use per GPU.",
    "GPU memory used share": "Device memory in use over total, per GPU; near 100% risks OOM.",
    "GPU memory used per node": "Device memory in use summed over each node's GPUs.",
    "Temperature": "GPU core temperature; thermal slowdown starts in the high 80s C.",
    "Power": "GPU power draw; against the power limit it explains power-cap throttling.",
    "GPU power per node": "Power draw summed over each node's GPUs.",
    "Clocks": "SM and memory clocks against their maxima; a GPU held below its peers is "
              "throttled.",
    "ECC errors and remapped rows": "ECC error counters by type and remapped memory rows by "
                                    "cause; uncorrected errors or failed remaps mean draining "
                                    "the node.",
    "PCIe replays": "PCIe replay counter rate: link errors between host and GPU.",
    "PCIe traffic": "PCIe throughput per GPU by direction.",
    "NVLink traffic": "NVLink throughput per GPU summed over links, by direction: the "
                      "collectives' traffic inside a node.",
    "Host CPU": "Node CPU utilisation; saturated CPUs starve data loaders.",
    "Host memory": "Node memory used and total.",
    "Exporter sample time": "How long the exporter took to sample NVML, processes and the "
                            "host; near the scrape timeout it loses scrapes.",
    "Busiest processes": "Processes using the most CPU or GPU memory, with their pod.",
    # Runs compared
    "Tokens/s (job) by world size": "Job tokens per second of runs grouped by world size: "
                                    "the scaling chart.",
    "Step time by world size": "Median step time of runs grouped by world size.",
    "Peak memory per GPU": "Highest peak device memory per GPU of each run: it falls as more "
                           "GPUs shard the model.",
}
