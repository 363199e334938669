"""verl parity tests run only where verl 0.9.1 is installed: `nox -s verl` (its own .venv-verl).

In the main environment there is no verl (it pins transformers<5.11), so these modules are not
collected at all rather than reported as failures.
"""

from __future__ import annotations

import importlib.util
import warnings

collect_ignore_glob: list[str] = []
if importlib.util.find_spec("verl") is None:
    collect_ignore_glob.append("test_*.py")
else:
    # verl announces the GPU engines it cannot load on a CPU machine; irrelevant to its RL math.
    warnings.filterwarnings("ignore", message=".*engine is not available.*")
