"""repro: a testing-first reproducibility and validation suite for DeepSpeed as an RL backend."""

__version__ = "0.1.0"
