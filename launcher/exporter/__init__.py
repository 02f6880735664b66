"""`xl exporter`, a process of its own: the command (command.py), what it reads and renders
(metrics.py, with gpus.py and nodes.py for each GPU's and a big run's per-node series) and its
bounded HTTP server (server.py)."""
