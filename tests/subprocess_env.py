"""The environment of the Python processes a test starts."""

from __future__ import annotations

import os


def pythonpath(*roots: os.PathLike | str) -> str:
    """``roots`` ahead of the inherited PYTHONPATH, never instead of it.

    An environment may get its packages through PYTHONPATH (the GPU machine gets deepspeed, ray,
    hydra and omegaconf from wheels unpacked into /tmp/site): a child given the checkout alone loses
    them and fails on an import that has nothing to do with the test.
    """
    inherited = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join([*(str(r) for r in roots), *([inherited] if inherited else [])])
