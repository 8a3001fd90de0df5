"""`mode=bench`'s further workloads (modes/bench.py runs them): the long horizon, the speculative player."""
