"""The run directory's one owner: its record (run.json), events, metrics, the tail and JSONL
decoding its readers share, the incremental reader, and the store (list and resolve runs)."""
