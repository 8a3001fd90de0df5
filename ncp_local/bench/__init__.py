"""`mode=bench`'s ways: the rig measured as `mode=run` plays it (execution/life.py), against the engine's
ceiling, at paper length with an engine that answers at once, and the engine alone.

Above the execution layer and below the modes (`modes/bench.py` is its thin entry), as vLLM keeps its
benchmarks outside its command layer. Never imports a mode or the report.
"""
