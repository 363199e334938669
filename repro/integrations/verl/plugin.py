"""The ``verl.plugins`` entry point's target: importing it registers repro's DeepSpeed engines.

verl imports (``EntryPoint.load``) every ``verl.plugins`` entry point when ``verl`` itself is
imported, and calls nothing, so the registration happens at import. ``VERL_USE_EXTERNAL_MODULES=
repro.integrations.verl.plugin`` does the same without an installed entry point.
"""

from __future__ import annotations

from repro.integrations.verl import register

register()
