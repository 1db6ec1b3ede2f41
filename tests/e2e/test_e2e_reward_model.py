"""Model-based rewards end to end on 2 Ray CPU workers (gloo): one GRPO step with a sequence-classification reward
model (its own chat template: each chat re-rendered; FSDP-sharded over both ranks; micro-batches of 3), its score
combined with the arith rule by a custom function; and one step with the policy as judge."""

import json
import math
import shutil

import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from hybridrl.config.loader import load_config
from hybridrl.trainer.launch import run_ppo

pytestmark = pytest.mark.slow

RECORDER = '''
import json
from hybridrl.rewards import default_compute_score

def compute_score(data_source, solution_str, ground_truth, extra_info=None, rm_score=None):
    rule = default_compute_score(data_source, solution_str, ground_truth, extra_info)
    with open({log!r}, "a") as f:
        f.write(json.dumps({{"split": extra_info["split"], "index": int(extra_info["index"]), "response": solution_str,
                            "rm_score": rm_score, "rule": rule}}) + "\\n")
    return rule + rm_score
'''
RM_TEMPLATE = "{% for m in messages %}## {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}## done"


@pytest.fixture(scope="module")
def arith_dir(tmp_path_factory):
    from hybridrl.data.tasks import make_dataset

    out = tmp_path_factory.mktemp("arith")
    make_dataset("arith", out, n_train=16, n_test=4, seed=0, digits=1, operands=3, ops="+")
    return out


def overrides(model_dir, data_dir, run_dir, *extra):
    return [f"actor_rollout_ref.model.path={model_dir}", f"data.train_files={data_dir / 'train.parquet'}",
            f"data.val_files={data_dir / 'test.parquet'}", "data.max_prompt_length=64", "data.max_response_length=12",
            "data.train_batch_size=4", "data.return_raw_chat=true", "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.rollout.max_num_seqs=64", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "actor_rollout_ref.actor.optim.lr=1e-4",
            "trainer.n_gpus_per_node=2", "trainer.device=cpu", "trainer.test_freq=-1", "trainer.total_training_steps=1",
            f"trainer.default_local_dir={run_dir}", "reward_model.enable=true", *extra]


def test_grpo_step_rewarded_by_a_reward_model_with_its_own_template(ray_local, tiny_model_dir, tiny_reward_model_dir,
                                                                    arith_dir, tmp_path):
    rm_dir = tmp_path / "rm"
    shutil.copytree(tiny_reward_model_dir, rm_dir)
    (rm_dir / "chat_template.jinja").write_text(RM_TEMPLATE)
    log = tmp_path / "scores.jsonl"
    scorer = tmp_path / "combine.py"
    scorer.write_text(RECORDER.format(log=str(log)))
    cfg = load_config(overrides=overrides(
        tiny_model_dir, arith_dir, tmp_path / "run", f"reward_model.model.path={rm_dir}",
        f"reward_model.model.input_tokenizer={tiny_model_dir}",
        # token-budgeted forwards (the GPU default) across the two ranks: inputs of <= 76 tokens, <= 160 a forward
        "reward_model.use_dynamic_bsz=true", "reward_model.forward_max_token_len_per_gpu=160",
        f"custom_reward_function.path={scorer}", "trainer.val_before_train=true"))
    history = run_ppo(cfg)["history"]
    val, step = history[0], history[-1]
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"]
    assert len(train) == 16 and len([r for r in rows if r["split"] == "test"]) == 4

    # the worker's score = HF's forward on the chat re-rendered with the reward model's own template
    rows_of = pq.read_table(arith_dir / "train.parquet").to_pylist()
    chat_of = {int(r["extra_info"]["index"]): r["prompt"] for r in rows_of}
    rm_tok = AutoTokenizer.from_pretrained(rm_dir)
    rm = AutoModelForSequenceClassification.from_pretrained(rm_dir, dtype=torch.float32).eval()
    rm.config.pad_token_id = None  # batch of one: read the last token, as the worker does
    for r in train:
        text = rm_tok.apply_chat_template(chat_of[r["index"]] + [{"role": "assistant", "content": r["response"]}],
                                          tokenize=False)
        assert text.endswith("## done") and "<|im_start|>" not in text
        with torch.no_grad():
            want = rm(input_ids=torch.tensor([rm_tok.encode(text, add_special_tokens=False)])).logits[0, 0].item()
        assert r["rm_score"] == pytest.approx(want, abs=1e-5)
    # the token-level reward is the combined score (one non-zero token a sample), as the custom function returned
    combined = [r["rule"] + r["rm_score"] for r in train]
    assert step["critic/score/mean"] == pytest.approx(sum(combined) / 16, abs=1e-6)
    assert step["reward_model/score/mean"] == pytest.approx(sum(r["rm_score"] for r in train) / 16, abs=1e-6)
    assert step["reward_model/truncated"] == 0 and math.isfinite(step["actor/pg_loss"])
    assert "timing_s/reward" in step and step["reward/errors"] == 0
    assert "val-aux/arith/reward/mean@1" in val and val["val-aux/reward_model/truncated"] == 0


def test_grpo_step_with_the_policy_as_judge(ray_local, tiny_model_dir, arith_dir, tmp_path):
    """A random tiny policy never writes 'Score: N': every verdict fails, is scored 0 and counted."""
    cfg = load_config(overrides=overrides(tiny_model_dir, arith_dir, tmp_path / "judge", "reward_model.style=judge",
                                          "reward_model.judge.max_tokens=8", "reward_model.max_error_fraction=null",
                                          "trainer.val_before_train=false", "data.max_prompt_length=192"))
    step = run_ppo(cfg)["history"][-1]
    assert step["reward_model/judge_failures"] == 16 and step["reward_model/judge_overlong"] == 0
    assert step["critic/score/mean"] == 0.0 and step["reward/failed_fraction"] == 1.0
