"""spade: Self-Play in Adaptive Synthetic Executable Environments."""

__version__ = "0.1.0"
