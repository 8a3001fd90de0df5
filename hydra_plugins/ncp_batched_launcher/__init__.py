"""`hydra/launcher=batched`: every point of a sweep in one process, sharing its engines (ncp_local/launch/sweep.py)."""
