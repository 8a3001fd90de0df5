"""What drives modes from outside: the command line (`cli.main`, which run.py calls), the batched
sweep launcher's driver (every point in one process on shared engines), the Slurm submitter
(`submit.main`, which slurm/submit.py calls; `slurm` and `served` talk to Slurm) and the `--help`
text. The top layer: it may import everything.
"""
