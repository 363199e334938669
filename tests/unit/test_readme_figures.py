"""The main-job figures the README and results/main_job.md quote are the committed result's.

``python scripts/main_job.py`` runs the README's first command and writes ``results/main_job/``
(summary, metrics, curves, the tiny policy's build report); the phrases below are made from those
files, so a README figure that no run produced, or a result regenerated without updating the
README, fails here. The result must also be of the tiny-policy recipe and the transformers
version this checkout builds, or its figures describe another policy.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

from repro.data import tiny_fixture
from repro.data.sft import RECIPE_VERSION, SFTRecipe

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "results" / "main_job"


def _script():
    spec = importlib.util.spec_from_file_location("main_job_script", ROOT / "scripts" / "main_job.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _flat(path: Path) -> str:
    return " ".join(path.read_text().split())  # a phrase may wrap across lines


def test_the_readme_and_the_results_page_quote_the_committed_main_job():
    phrases = _script().readme_figures(RESULT)
    assert len(phrases) == 3
    for page in (ROOT / "README.md", ROOT / "results" / "main_job.md"):
        text = _flat(page)
        missing = [p for p in phrases if p not in text]
        assert not missing, f"{page.name} does not quote {missing} (results/main_job/ says so)"


def test_the_committed_main_job_is_of_this_checkouts_tiny_policy():
    report = json.loads((RESULT / "tiny_policy.json").read_text())
    assert report["recipe_version"] == RECIPE_VERSION
    assert report["recipe"] == json.loads(json.dumps(SFTRecipe().as_dict()))
    assert report["device"] == "cpu"
    pinned = re.search(r"^transformers==(\S+)$", (ROOT / "constraints" / "cpu.txt").read_text(), re.M).group(1)
    assert report["libraries"]["transformers"] == pinned
    # ... and of the shipped policy every machine gets (repro/data/tiny_fixture.py), not of a local build.
    shipped = json.loads((tiny_fixture.FOLDER / tiny_fixture.REPORT).read_text())
    assert {k: report[k] for k in ("final_loss", "sft_steps", "accuracy_after")} == \
        {k: shipped[k] for k in ("final_loss", "sft_steps", "accuracy_after")}


def test_a_stale_figure_is_caught(tmp_path):
    (tmp_path / "summary.tsv").write_text((RESULT / "summary.tsv").read_text().replace("first_score\t0.", "first_score\t0.9"))
    (tmp_path / "tiny_policy.json").write_text((RESULT / "tiny_policy.json").read_text())
    assert _script().readme_figures(tmp_path)[0] not in _flat(ROOT / "README.md")
