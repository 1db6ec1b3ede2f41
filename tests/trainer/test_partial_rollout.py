"""Partial rollouts on the driver: groups train only when complete, staleness drops and counts, the buffer survives a
checkpoint, and the requests / completions round trip through the real engine (no Ray)."""

import numpy as np
import pytest
import torch

from hybridrl.plan.partial_rollout import PartialRolloutPlan
from hybridrl.protocol import DataProto
from hybridrl.rollout.sampling_params import BUDGET
from hybridrl.rollout.to_dataproto import CARRIED_KEYS, completions_to_dataproto, sample_requests
from hybridrl.trainer.partial_rollout import PartialRolloutBuffer

P, R, PAD = 4, 16, 0


def plan(budget=4, staleness=2, max_groups=4, multiple=1):
    return PartialRolloutPlan(tokens_per_step=budget, max_staleness=staleness, max_groups=max_groups,
                              group_multiple=multiple, rollout_is="token", rollout_is_threshold=2.0)


def prompt_batch(uids, first_token=10):
    """Left-padded prompt rows as the dataset gives them, with a per-prompt field the reward would read."""
    k = len(uids)
    ids = torch.zeros(k, P, dtype=torch.long)
    mask = torch.zeros(k, P, dtype=torch.long)
    ids[:, 1:] = torch.arange(first_token, first_token + k)[:, None]
    mask[:, 1:] = 1
    raw = [[int(first_token + i)] * 3 for i in range(k)]
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(0)},
                               {"uid": list(uids), "raw_prompt_ids": raw, "ground_truth": [f"gt-{u}" for u in uids]})


def fake_generate(requests: DataProto, budget: int, targets: dict, step: int) -> DataProto:
    """A sample's first token is its target length (targets[uid][j] for the j-th fresh sample of uid); each step
    adds up to `budget` tokens with log-prob -1 - step and stops at the target with 'stop'."""
    ids, lps = (requests.non_tensor_batch[k] for k in CARRIED_KEYS)
    seen: dict = {}
    out_ids, out_lps, reasons = [], [], []
    for uid, carried, carried_lp in zip(requests.non_tensor_batch["uid"], ids, lps):
        tokens = list(carried)
        if not tokens:
            j = seen[uid] = seen.get(uid, -1) + 1
            tokens = [targets[uid][j]]
        target = tokens[0]
        new = min(budget - (len(tokens) - len(carried)), target - len(tokens))
        tokens += [3] * new
        out_ids.append(tokens)
        out_lps.append(list(carried_lp) + [-1.0 - step] * (len(tokens) - len(carried)))
        reasons.append("stop" if len(tokens) == target else BUDGET)
    return DataProto.from_dict(non_tensors={"token_ids": out_ids, "log_probs": out_lps, "finish_reason": reasons})


def run_step(buf, step, new_uids, targets, budget=4):
    if new_uids:
        buf.add_prompts(prompt_batch(new_uids, first_token=10 + 10 * step), step)
    buf.absorb(fake_generate(buf.requests(), budget, targets, step), step)
    return buf.take(step, R, PAD)


def test_groups_train_only_when_complete_and_stale_groups_are_dropped_and_counted():
    # a: both samples done in step 1; b: one done at once, one needs 3 steps (age 2 at step 3: trained);
    # c: one sample needs 4 steps, so it would be 3 steps old at step 4 > max_staleness 2: dropped after step 3
    targets = {"a": [3, 2], "b": [3, 9], "c": [13, 1]}
    buf = PartialRolloutBuffer(plan(budget=4, staleness=2), n=2)
    batch, m = run_step(buf, 1, ["a", "b", "c"], targets)
    assert batch.non_tensor_batch["uid"].tolist() == ["a", "a"]
    assert m["partial/trained_groups"] == 1 and m["partial/carried_groups"] == 2
    assert m["partial/carried_samples"] == 2 and m["partial/budget_stopped_samples"] == 2
    assert m["partial/continued_samples"] == 0 and m["partial/off_policy_token_frac"] == 0.0
    assert batch.batch["responses"].shape == (2, R) and batch.batch["response_mask"].sum().item() == 5
    assert batch.non_tensor_batch["ground_truth"].tolist() == ["gt-a", "gt-a"]  # the prompt's fields travel along

    batch, m = run_step(buf, 2, [], targets)
    assert batch is None and m["partial/trained_groups"] == 0 and m["partial/continued_samples"] == 2
    assert m["partial/carried_groups"] == 2 and m["partial/dropped_stale"] == 0

    batch, m = run_step(buf, 3, [], targets)
    assert batch.non_tensor_batch["uid"].tolist() == ["b", "b"]
    b = batch.batch
    assert b["response_mask"].sum(-1).tolist() == [3, 9]
    # the carried sample keeps the log-probs of the steps that sampled its tokens (-1 - call index)
    assert b["rollout_log_probs"][1, :9].tolist() == [-2.0] * 4 + [-3.0] * 4 + [-4.0]
    assert b["rollout_log_probs"][0, :3].tolist() == [-2.0] * 3
    # staleness over the 12 trained tokens: 3 + 4 from step 1 (2 old), 4 from step 2 (1), 1 from step 3 (0)
    assert m["partial/mean_staleness"] == pytest.approx((7 * 2 + 4 * 1) / 12)
    assert m["partial/max_staleness"] == 2 and m["partial/off_policy_token_frac"] == pytest.approx(11 / 12)
    assert m["partial/dropped_stale"] == 1 and m["partial/carried_groups"] == 0 and m["partial/carried_samples"] == 0
    assert buf.groups == []


def test_a_step_trains_at_most_max_groups_in_multiples_and_the_rest_wait_oldest_first():
    targets = {u: [1, 1] for u in "abcde"}
    buf = PartialRolloutBuffer(plan(max_groups=4, multiple=2, staleness=3), n=2)
    batch, m = run_step(buf, 1, list("abc"), targets)  # 3 complete: 2 train (a multiple of 2), c waits
    assert list(dict.fromkeys(batch.non_tensor_batch["uid"])) == ["a", "b"] and m["partial/carried_groups"] == 1
    batch, m = run_step(buf, 2, list("de"), targets)
    assert list(dict.fromkeys(batch.non_tensor_batch["uid"])) == ["c", "d"]  # oldest first; 3 complete -> 2
    assert m["partial/carried_groups"] == 1 and m["partial/mean_staleness"] == pytest.approx(0.5)


def test_requests_put_fresh_groups_together_and_carried_samples_alone():
    targets = {"a": [9, 1], "b": [2, 2]}
    buf = PartialRolloutBuffer(plan(budget=4), n=2)
    run_step(buf, 1, ["a"], targets)   # a: one sample carried (4 of 9), one finished waiting
    buf.add_prompts(prompt_batch(["b"], first_token=50), 2)
    req = buf.requests()
    assert req.non_tensor_batch["uid"].tolist() == ["a", "b", "b"]
    prompts = [list(map(int, p)) for p in req.non_tensor_batch["raw_prompt_ids"]]
    fresh, conts, first_rows = sample_requests(prompts, req, n=2)
    assert fresh == [[50, 50, 50]] and first_rows == [1, 0]
    assert [(c.prompt_token_ids, c.token_ids) for c in conts] == [([20, 20, 20], [9, 3, 3, 3])]
    # a group the dispatch cut in two: its fresh rows become empty continuations
    fresh, conts, first_rows = sample_requests(prompts[:2], req.slice(0, 2), n=2)
    assert fresh == [] and [c.token_ids for c in conts] == [[9, 3, 3, 3], []] and first_rows == [0, 1]


def test_buffer_round_trips_through_a_checkpoint_file(tmp_path):
    targets = {"a": [9, 1], "b": [6, 7]}
    buf = PartialRolloutBuffer(plan(budget=4), n=2)
    run_step(buf, 1, ["a", "b"], targets)
    torch.save(buf.state_dict(), tmp_path / "partial_rollout.pt")
    again = PartialRolloutBuffer(plan(budget=4), n=2)
    again.load_state_dict(torch.load(tmp_path / "partial_rollout.pt", weights_only=False))
    assert [(g.first_step, g.samples) for g in again.groups] == [(g.first_step, g.samples) for g in buf.groups]
    for a, b in zip(again.groups, buf.groups):
        assert a.prompt.batch.keys() == b.prompt.batch.keys()
        assert all(torch.equal(a.prompt.batch[k], b.prompt.batch[k]) for k in a.prompt.batch)
        assert {k: v.tolist() for k, v in a.prompt.non_tensor_batch.items()} == \
               {k: v.tolist() for k, v in b.prompt.non_tensor_batch.items()}
    # both continue identically
    batch_a, m_a = run_step(again, 2, [], targets)
    batch_b, m_b = run_step(buf, 2, [], targets)
    assert m_a == m_b and torch.equal(batch_a.batch["responses"], batch_b.batch["responses"])
    with pytest.raises(ValueError, match="rollout.n = 3"):
        PartialRolloutBuffer(plan(), n=3).load_state_dict(torch.load(tmp_path / "partial_rollout.pt",
                                                                     weights_only=False))


def test_requests_and_completions_through_the_engine():
    """The worker's path without Ray: sample rows -> engine requests -> completions in row order -> the buffer."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "rollout"))
    from rollout_helpers import make_engine, tiny_hf_model

    from hybridrl.rollout.sampling_params import SamplingParams

    engine = make_engine(tiny_hf_model("qwen2"))
    params = SamplingParams(n=2, temperature=0, max_tokens=R, ignore_eos=True, token_budget=6)
    buf = PartialRolloutBuffer(plan(budget=6, staleness=3), n=2)
    buf.add_prompts(prompt_batch(["a", "b"]), 1)
    for step in (1, 2, 3):
        req = buf.requests()
        prompts = [list(map(int, p)) for p in req.non_tensor_batch["raw_prompt_ids"]]
        fresh, conts, first_rows = sample_requests(prompts, req, params.n)
        assert len(fresh) == (2 if step == 1 else 0) and len(conts) == (0 if step == 1 else 4)
        outs = engine.generate(fresh, params, continuations=conts)
        buf.absorb(completions_to_dataproto(outs, first_rows, len(req)), step)
        batch, m = buf.take(step, R, PAD)
        assert (batch is None) == (step < 3)
    assert m["partial/trained_groups"] == 2 and np.isclose(m["partial/off_policy_token_frac"], 12 / 16)
    # greedy and unchanged weights: the same responses as one uninterrupted call
    whole = engine.generate([[10] * 3, [11] * 3], SamplingParams(n=2, temperature=0, max_tokens=R, ignore_eos=True))
    assert batch.batch["responses"].tolist() == [c.token_ids for o in whole for c in o.outputs]


def test_resuming_with_partial_rollouts_off_drops_the_saved_groups_and_counts_them(tmp_path, capsys):
    from types import SimpleNamespace

    from hybridrl.trainer.ppo_trainer import RayPPOTrainer

    buf = PartialRolloutBuffer(plan(budget=4), n=2)
    run_step(buf, 1, ["a", "b"], {"a": [9, 1], "b": [6, 7]})
    torch.save(buf.state_dict(), tmp_path / "partial_rollout.pt")
    off = SimpleNamespace(partial=None, startup_metrics={})
    RayPPOTrainer._load_partial_rollouts(off, tmp_path / "partial_rollout.pt")
    assert off.startup_metrics == {"partial/dropped_on_resume": 2.0}
    assert "the checkpoint's 2 carried prompt groups are dropped" in capsys.readouterr().out
    on = SimpleNamespace(partial=PartialRolloutBuffer(plan(budget=4), n=2), startup_metrics={})
    RayPPOTrainer._load_partial_rollouts(on, tmp_path / "partial_rollout.pt")
    assert len(on.partial.groups) == 2 and on.startup_metrics == {}
    RayPPOTrainer._load_partial_rollouts(on, tmp_path / "absent.pt")  # a checkpoint saved without partial rollouts
    assert len(on.partial.groups) == 2
