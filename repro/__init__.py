"""repro: a testing-first reproducibility and validation suite for DeepSpeed as an RL backend.

The package is layered. A module may import from its own subpackage and from lower layers only;
subpackages that share a layer are independent of each other. ``tests/unit/test_architecture.py``
reads this table and fails on any import against it (lazy and ``TYPE_CHECKING`` imports included),
and on an import cycle between the modules of one subpackage.

    layer  what                                  names
    0      foundations (no repro imports)        devices batching rewards collectives
    1      data, tokenizer, tiny policy          data
    2      what a run is                         config
    3      RL math                               rl
    4      processes, ranks, Ray, nodes          cluster
    5      a run on disk                         run
    6      DeepSpeed workers                     workers
    7      the single controller, scenarios      trainer scenarios collectives_trace
    8      front doors                           main_ppo bench integrations

``devices`` (CPU or CUDA, NVML) sits at the bottom because the tiny policy's SFT (``data``) and
the plan (``config``) ask it too; ``collectives_trace`` is the trace tool's entry point and public
API over ``collectives`` (layered inside by its own table: ``record``, ``check``, ``analyze``,
``launch``), which a job's process group (``cluster.process_group``) switches on through
``collectives.record.session.install_from_env``.
"""

__version__ = "0.1.0"
