"""What viewers read from a run directory: the incremental reader (reader.py) that yields frozen
RunView snapshots (runview.py), and what is derived from them: the digest, the step timing and a
comparison of runs."""
