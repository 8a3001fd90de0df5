"""What drives modes from outside: the batched sweep launcher's driver (every point in one
process on shared engines) and the `--help` text. The top layer: it may import everything.
"""
