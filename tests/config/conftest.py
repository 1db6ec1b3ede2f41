from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def seed_yaml() -> Path:
    return REPO / "examples" / "seed_6gpu.yaml"
