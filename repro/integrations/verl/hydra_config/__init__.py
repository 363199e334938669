"""Hydra config group files verl's trainer composes with ``model_engine=deepspeed``.

Add this package to verl's search path: ``hydra.searchpath=[pkg://repro.integrations.verl.hydra_config]``.
"""
