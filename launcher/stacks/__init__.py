"""Every rank's stacks: asking one rank (ask.py), gathering them across the nodes (gather.py,
nodes.py), who holds up whom (verdict.py), and the capture a hang starts (hang.py)."""
