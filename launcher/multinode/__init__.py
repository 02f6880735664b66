"""Runs across nodes: the node link to node 0, its join command and token, and Slurm."""
