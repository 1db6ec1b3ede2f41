"""trainer.rollout_data_dir / validation_data_dir files: one JSON line per sample as verl writes them, native JSON
values, written whole (a temporary file renamed into place), misaligned fields refused by name."""

import json

import numpy as np
import pytest
import torch

from hybridrl.rewards.token_level import ground_truths
from hybridrl.trainer.generation_dump import dump_generations


def test_lines_hold_the_samples_with_native_values_and_replace_a_previous_dump(tmp_path):
    extra = {"uid": np.array(["a", "a"]), "acc": [np.float32(1.0), np.float32(0.0)], "pred": ["4", None]}
    path = dump_generations(tmp_path / "d", 7, ["1+3=", "2+2="], ["4", "5"], [4, np.int64(4)],
                            torch.tensor([1.0, -0.5]).tolist(), extra)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert path.name == "7.jsonl" and rows == [
        {"input": "1+3=", "output": "4", "gts": 4, "score": 1.0, "step": 7, "uid": "a", "acc": 1.0, "pred": "4"},
        {"input": "2+2=", "output": "5", "gts": 4, "score": -0.5, "step": 7, "uid": "a", "acc": 0.0, "pred": None}]
    dump_generations(tmp_path / "d", 7, ["x"], ["y"], [None], [0.0])
    assert [json.loads(line)["input"] for line in path.read_text().splitlines()] == ["x"]
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["7.jsonl"]   # no temporary file left


def test_a_scorers_own_score_takes_the_column_as_in_verl(tmp_path):
    path = dump_generations(tmp_path, 1, ["p"], ["r"], [1], [-0.25], {"score": [1.0]})
    assert json.loads(path.read_text())["score"] == 1.0


def test_misaligned_fields_are_refused_naming_them(tmp_path):
    with pytest.raises(ValueError, match="'acc' has 1 values for 2 samples"):
        dump_generations(tmp_path, 1, ["a", "b"], ["c", "d"], [1, 2], [0.0, 0.0], {"acc": [1.0]})
    assert not list(tmp_path.iterdir())


def test_ground_truths_read_verls_reward_model_field():
    infos = np.array([{"ground_truth": "4", "style": "rule"}, {"style": "model"}], dtype=object)
    assert ground_truths({"reward_model": infos}, 2) == ["4", None]
    assert ground_truths({}, 3) == [None, None, None]
