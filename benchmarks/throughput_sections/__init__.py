"""The sections of `benchmarks/throughput.py`, one module each: `env` (a), `end_to_end` (b + c),
`transport` (d), `planning` (e); `common` holds the timing, table and config helpers they share.
`throughput.py` keeps the command line, runs the sections and writes the JSON."""
