"""The run directory's one owner: its record (run.json), events, metrics, reader and store."""
