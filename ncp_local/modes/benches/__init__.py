"""`mode=bench`'s parts, run by modes/bench.py: the four ways and their tallies (ways), the engine's
scaling and the cost projection (scaling), the sweep bench (sweep), the long horizon, the speculative
player, the unbounded-cache simulation and the figures record."""
