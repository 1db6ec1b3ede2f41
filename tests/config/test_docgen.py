"""docs/config.md is the docgen output, and every default key is documented."""

from pathlib import Path

from hybridrl.config.docgen import _fields, render_all, scan_yaml
from hybridrl.config.loader import CONFIG_DIR
from hybridrl.config.sections import ROOTS

REPO = Path(__file__).resolve().parents[2]


def test_committed_reference_matches_generated():
    committed = (REPO / "docs" / "config.md").read_text()
    assert committed == render_all(), "docs/config.md is stale: run python -m hybridrl.config.docgen > docs/config.md"


def test_every_key_has_a_meaning():
    for root in ROOTS.values():
        assert [key for key, _, meaning in _fields(root) if not meaning.strip()] == []
    _, written = scan_yaml((CONFIG_DIR / "ppo_trainer.yaml").read_text())
    assert written["actor_rollout_ref.rollout.prompt_length"] == "${data.max_prompt_length}"


def test_scan_reads_the_header_and_the_values_as_written():
    header, written = scan_yaml("# head\n\na:\n  # above b\n  b: 1\n  c: 'x # y'  # inline c\n")
    assert header == "head"
    assert written == {"a": "", "a.b": "1", "a.c": "'x # y'"}


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    assert "python -m pytest -q" in readme and "python -m pytest -q" in ci
    assert "pip install torch==2.13.0" in readme and "pip install torch==2.13.0" in ci
    assert "set -euo pipefail" in ci
