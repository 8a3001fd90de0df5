"""ncp-local: a local-model evaluation rig for NCP-Bench."""

__version__ = "0.1.0"
