"""Put a rank process back into the state it had before it hosted a run, so it can host another.

A rank process pays seconds of start-up (Python, torch, transformers, DeepSpeed imports) before
its first step; a test suite of many short runs pays it again for every rank of every run. Two
places keep rank processes warm instead: the test harness's rank pool (``tests/rank_pool.py``)
and Ray ranks reused across runs on one cluster (``REPRO_REUSE_RANKS``, ``repro.cluster.worker_group``). Both
take a :class:`ProcessSnapshot` before the first run and call :meth:`ProcessSnapshot.restore`
after each, once the run's process group is destroyed.

What a run leaves behind that the next would see: DeepSpeed's communication backend, its
process-group registries (data parallel, Ulysses sequence parallel, the all-to-all group names)
and ZeRO-3's process-wide id counters (``Init.param_id``, the ``count=[0]`` default of
``_register_deepspeed_module``; ZeRO-3 checks that every rank numbers its modules alike, so a
counter advanced on one rank only breaks the next ZeRO-3 run); ``os.environ``; torch's default
dtype, grad mode and thread count; engines not yet collected (collected, and the survivors
frozen out of later collections, see ``restore``).
"""

from __future__ import annotations

import gc
import importlib
import inspect
import os
from collections.abc import Callable

_STATEFUL_MODULES = ("deepspeed.utils.groups", "deepspeed.runtime.zero.partition_parameters",
                     "deepspeed.runtime.zero.parameter_offload", "deepspeed.runtime.sequence_parallel.parallel_state_sp",
                     "deepspeed.sequence.layer")
_PLAIN = (type(None), bool, int, float, str, list, dict)


def _restorer(owner: object, name: str, value: object) -> Callable[[], None]:
    """A function that puts ``owner.name`` back to ``value`` (containers in place: others hold them)."""
    if isinstance(value, list):
        saved_list = list(value)
        return lambda: value.__setitem__(slice(None), saved_list)
    if isinstance(value, dict):
        saved_dict = dict(value)
        return lambda: (value.clear(), value.update(saved_dict))
    return lambda: setattr(owner, name, value)


def _module_state_restorers() -> list[Callable[[], None]]:
    restore = []
    for module_name in _STATEFUL_MODULES:
        module = importlib.import_module(module_name)
        for name, value in vars(module).items():
            if not name.startswith("__") and isinstance(value, _PLAIN):
                restore.append(_restorer(module, name, value))
            elif inspect.isclass(value) and value.__module__ == module_name:
                for attr, member in vars(value).items():
                    if not attr.startswith("__") and isinstance(member, (int, float)):
                        restore.append(_restorer(value, attr, member))
                    for default in getattr(member, "__defaults__", None) or ():
                        if isinstance(default, (list, dict)):
                            restore.append(_restorer(None, "", default))
    return restore


class ProcessSnapshot:
    """The state a run may change, taken once before the process hosts its first run."""

    def __init__(self) -> None:
        self.env = dict(os.environ)
        self._restorers = _module_state_restorers()

    def restore(self) -> None:
        """Back to the snapshot; the run's process group must already be destroyed."""
        import deepspeed.comm.comm as ds_comm
        import torch

        ds_comm.cdb = None
        for restore in self._restorers:
            restore()
        os.environ.clear()
        os.environ.update(self.env)
        torch.set_default_dtype(torch.float32)
        torch.set_grad_enabled(True)
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        gc.collect()
        # What survives the collection is the process's own state (modules, caches): freezing it
        # keeps every later collection to the next run's objects. A full collection over torch,
        # DeepSpeed and transformers takes 0.13 s or more, and DeepSpeed's ZeRO-3 set-up runs
        # one per engine (zero.utils.defragment): in the suites this was about a tenth of all CPU.
        gc.freeze()
