"""One module per launcher command (launch, sbatch, runs, logs, stop, attach, demo); the options of
`xl launch`, which `xl sbatch` shares, are parsed in options.py."""
