"""The DeepSpeed workers: one process's roles (actor, reference, critic, rollout) and what they build on.

- the roles: ``actor`` (policy updates and the frozen reference), ``critic``, ``hybrid`` (one colocated rank of them
  all), ``rollout_hf`` / ``rollout_vllm`` with ``rollout_layout`` (verl's padded batch), ``weight_buckets``;
- one role's engine: ``engine`` (loading, ``deepspeed.initialize``, the micro-batch loop), ``mini_batches``,
  ``checkpoint``, ``engaged`` / ``placement`` (what the engine really does, read back), ``profiling``, ``faults``;
- the model's forward and backward: ``packing`` and ``varlen`` (remove-padding, FlashAttention over packed rows;
  ``fa4_kernels`` for FlashAttention-4), ``ulysses``, ``lora``, ``logprob``, ``rms_norm``, ``layer_compile``,
  ``activation_checkpointing``;
- DeepSpeed's stages: ``overflow_check`` (ZeRO-1/2), ``zero3_leaf``, ``zero3_linear``, ``zero3_persist_gather``,
  ``zero3_persist_hooks`` (ZeRO-3).

Layer 6 of ``repro/__init__.py``'s table: may import ``devices``, ``batching``, ``rewards``, ``collectives``,
``data``, ``config``, ``rl``, ``cluster`` and ``run``; never the controller (``trainer``, ``scenarios``) or a front
door (``main_ppo``, ``bench``, ``integrations``).
"""
