"""The ``verl.plugins`` entry point's target: importing it registers repro's DeepSpeed engines.

verl imports (``EntryPoint.load``) every ``verl.plugins`` entry point when ``verl`` itself is
imported, and calls nothing, so the registration happens at import. ``VERL_USE_EXTERNAL_MODULES=
repro.integrations.verl.plugin`` does the same without an installed entry point.

verl 0.9.1 catches an entry point that fails to load and logs it at debug level only, so a broken
registration (say, a verl API that moved) would surface much later as "no engine deepspeed". The
failure is therefore logged here at error level, with its traceback, before verl swallows it
(``tests/verl_parity/engine/test_engine_config.py`` breaks it on purpose).
"""

from __future__ import annotations

import logging

from repro.integrations.verl import register

try:
    register()
except Exception:
    logging.getLogger(__name__).error(
        "repro's DeepSpeed engine for verl did not register (model_engine=deepspeed will not be found)",
        exc_info=True)
    raise
