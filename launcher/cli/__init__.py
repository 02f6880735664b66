"""One module per launcher command (launch, sbatch, runs, logs, stop, attach, demo)."""
