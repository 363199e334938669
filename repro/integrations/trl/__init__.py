"""TRL as a peer to measure against: its ``GRPOTrainer`` on repro's tiny task (``peer``).

Only ``python -m repro.integrations.trl.peer`` imports ``trl``, in an environment that has it
(the peer benchmark's, never the core's: TRL 1.16 also breaks verl's value-head import).
"""
