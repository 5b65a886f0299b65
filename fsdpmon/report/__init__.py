"""`fsdpmon report`: the scaling study across runs of different sizes.

loader (JSONL logs) and prometheus (range queries) produce RunData; stats turns it into RunStats;
table and chart write the Markdown report and the PNG; cli ties them to the command line.
"""
