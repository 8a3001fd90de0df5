"""What drives modes from outside: the command line (`cli.main`, which run.py calls), the batched
sweep launcher's driver (every point in one process on shared engines) and the `--help` text. The
top layer: it may import everything.
"""
