"""examples/smollm2_reward_model end to end on CPU with the tiny policy: train_rm.py samples the policy, labels the
answers by the a + b rule, trains a reward model and writes its held-out evaluation; then one GRPO step through Ray
is rewarded by that reward model through the recipe's reward.py (score passed through, rule reported)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification

import hybridrl.trainer.ppo_trainer as ppo_trainer
from hybridrl.config.loader import load_config
from hybridrl.trainer.launch import run_ppo

RECIPE = Path(__file__).resolve().parents[2] / "examples" / "smollm2_reward_model"


@pytest.fixture(scope="module")
def trained_rm(tmp_path_factory, tiny_model_dir, smollm2_add_task):
    root = tmp_path_factory.mktemp("rm_recipe")
    smollm2_add_task.main(["--out", str(root / "data"), "--train", "16", "--test", "4"])
    cmd = [sys.executable, str(RECIPE / "train_rm.py"), "--policy", str(tiny_model_dir), "--data", str(root / "data"),
           "--out", str(root / "rm"), "--prompts", "16", "--samples", "2", "--synthetic", "1", "--max-tokens", "12",
           "--epochs", "3", "--batch", "8", "--lr", "1e-3", "--heldout", "0.25", "--device", "cpu"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return root


def test_train_rm_learns_and_reports_held_out_metrics(trained_rm):
    report = json.loads((trained_rm / "rm" / "rm_eval.json").read_text())
    # 12 training questions x (2 policy answers + 1 right + 1 near-miss copy), 8 per batch, 3 epochs
    assert report["questions"] == {"train": 12, "heldout": 4} and report["train_examples"] == 48
    assert len(report["losses"]) == 3 * 6 and report["train_positives"] >= 12  # the 12 synthetic right answers
    assert report["loss_last"] < report["loss_first"] - 0.1
    held = report["heldout"]
    assert held["n"] == 16 and held["positives"] >= 4
    assert 0 <= held["accuracy"] <= 1 and 0 <= held["auc"] <= 1
    own = report["heldout_policy_samples"]
    assert own["n"] == 8 and 0 <= own["accuracy"] <= 1 and (own["auc"] is None) == (own["positives"] in (0, 8))
    model = AutoModelForSequenceClassification.from_pretrained(trained_rm / "rm")
    assert model.config.num_labels == 1 and model.config.pad_token_id is not None


def test_grpo_step_is_rewarded_by_the_trained_reward_model(ray_local, tiny_model_dir, trained_rm, tmp_path,
                                                           monkeypatch):
    seen = []

    def recording(batch, reward_fn, reward_model=None):
        out = compute_reward(batch, reward_fn, reward_model)
        seen.append((batch.batch["input_ids"], batch.batch["attention_mask"], batch.batch["response_mask"],
                     batch.batch["rm_scores"], out[0]["reward_tensor"], out[0]["reward_extra_info"]))
        return out

    compute_reward = ppo_trainer.compute_reward
    monkeypatch.setattr(ppo_trainer, "compute_reward", recording)
    data = trained_rm / "data"
    cfg = load_config(overrides=[
        f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files={data / 'train.parquet'}",
        f"data.val_files={data / 'test.parquet'}", "data.max_prompt_length=64", "data.max_response_length=12",
        "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_kl_loss=false",
        "reward_model.enable=true", "reward_model.style=model", f"reward_model.model.path={trained_rm / 'rm'}",
        f"custom_reward_function.path={RECIPE / 'reward.py'}", "trainer.n_gpus_per_node=1", "trainer.device=cpu",
        "trainer.val_before_train=true", "trainer.test_freq=-1", "trainer.total_training_steps=1",
        f"trainer.default_local_dir={tmp_path / 'run'}"])
    history = run_ppo(cfg)["history"]
    val, step = history[0], history[-1]
    assert len(seen) == 2  # validation (4 prompts x 1), then the step (4 prompts x 4)
    rm = AutoModelForSequenceClassification.from_pretrained(trained_rm / "rm", dtype=torch.float32).eval()
    rm.config.pad_token_id = None  # batch of one: HF reads the last token, as the worker does
    for ids, attn, resp_mask, rm_scores, reward, extra in seen:
        assert torch.equal(reward, rm_scores)  # the reward is the reward model's score, on the same token
        last = resp_mask.shape[1] - 1 - resp_mask.flip(-1).float().argmax(-1)
        for i in range(len(ids)):
            assert (rm_scores[i] != 0).sum() <= 1
            with torch.no_grad():
                want = rm(input_ids=ids[i][attn[i].bool()][None]).logits[0, 0].item()
            assert rm_scores[i, last[i]].item() == pytest.approx(want, abs=1e-4)
        assert set(extra["acc"]) <= {0.0, 1.0} and len(extra["acc"]) == len(ids)
    train_scores = seen[1][3].sum(-1)
    assert step["critic/score/mean"] == pytest.approx(train_scores.mean().item(), abs=1e-5)
    assert step["reward_model/score/mean"] == pytest.approx(train_scores.mean().item(), abs=1e-5)
    assert math.isfinite(step["actor/pg_loss"]) and step["reward/errors"] == 0
    # validation: the rule accuracy is the core metric, the reward model's score the reward
    val_rule = seen[0][5]["acc"]
    assert val["val-core/smollm2_add/acc/mean@1"] == pytest.approx(sum(val_rule) / 4)
    assert val["val-aux/smollm2_add/reward/mean@1"] == pytest.approx(seen[0][3].sum(-1).mean().item(), abs=1e-5)
