import pickle
import textwrap

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from hybridrl.protocol import DataProto
from hybridrl.rewards import RewardManager, load_custom_reward_function

SCORER_FILE = textwrap.dedent('''
    import time

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        if "hang" in solution_str:
            while True:
                time.sleep(0.01)
        if "boom" in solution_str:
            raise RuntimeError("scorer exploded")
        if "text" in solution_str:
            return "not a number"
        hit = float(solution_str.strip().endswith(ground_truth))
        return {"score": hit, "acc": bool(hit), "length": len(solution_str)}

    def batch_score(data_sources, solution_strs, ground_truths, extra_infos):
        return [float(s.endswith(g)) for s, g in zip(solution_strs, ground_truths)]

    not_a_function = 3
''')


@pytest.fixture
def scorer_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(SCORER_FILE)
    return path


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def make_batch(tok, texts, truths, data_source="arith", resp_len=24):
    eos, pad = tok.convert_tokens_to_ids("<|im_end|>"), tok.pad_token_id
    responses = torch.full((len(texts), resp_len), pad)
    mask = torch.zeros(len(texts), resp_len, dtype=torch.long)
    for i, t in enumerate(texts):
        ids = (tok.encode(t, add_special_tokens=False) + [eos])[:resp_len]
        responses[i, :len(ids)] = torch.tensor(ids)
        mask[i, :len(ids)] = 1
    return DataProto.from_dict({"responses": responses, "response_mask": mask},
                               {"data_source": [data_source] * len(texts),
                                "reward_model": [{"style": "rule", "ground_truth": g} for g in truths],
                                "extra_info": [{"index": i} for i in range(len(texts))]})


VERL_STYLE = textwrap.dedent('''
    import asyncio

    def with_bonus(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0, scale=1.0):
        return scale * float(solution_str.endswith(ground_truth)) + bonus

    async def judged(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        await asyncio.sleep(0)
        return {"score": float(solution_str.endswith(ground_truth)), "kw": len(kwargs)}
''')


def test_verl_reward_kwargs_and_async_scorers(tmp_path, tok):
    """verl's get_custom_reward_fn: reward_kwargs join every call and win over the call's own; async functions are
    awaited. Both survive the pickling that takes the scorer into its worker process."""
    path = tmp_path / "verl_style.py"
    path.write_text(VERL_STYLE)
    fn = load_custom_reward_function(path, "with_bonus", {"bonus": 0.5})
    assert fn("x", "is 7", "7") == 1.5 and fn("x", "is 8", "7") == 0.5
    assert fn("x", "is 7", "7", bonus=9.0) == 1.5          # the configured value wins, as in verl
    assert pickle.loads(pickle.dumps(fn))("x", "is 7", "7", scale=2.0) == 2.5
    judged = load_custom_reward_function(path, "judged", {"a": 1})
    assert judged("x", "is 7", "7") == {"score": 1.0, "kw": 1}
    manager = RewardManager(tok, compute_score=pickle.loads(pickle.dumps(judged)), timeout_s=10.0)
    try:
        out = manager(make_batch(tok, ["it is 7", "it is 3"], ["7", "7"]))
    finally:
        manager.close()
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0]


def test_reward_kwargs_key_reaches_the_scorer(tmp_path):
    from hybridrl.config.loader import load_config
    from hybridrl.trainer.launch import build_reward_fns

    path = tmp_path / "verl_style.py"
    path.write_text(VERL_STYLE)
    cfg = load_config(overrides=[f"custom_reward_function.path={path}", "custom_reward_function.name=with_bonus",
                                 "+custom_reward_function.reward_kwargs.bonus=0.25"])
    assert cfg.custom_reward_function.reward_kwargs == {"bonus": 0.25}
    train, val = build_reward_fns(cfg, tokenizer=None)
    try:
        assert train.compute_score("x", "7", "7") == 1.25 and val.compute_score("x", "6", "7") == 0.25
    finally:
        train.close()
        val.close()


def test_load_custom_reward_function(scorer_file):
    fn = load_custom_reward_function(scorer_file, "compute_score")
    assert fn("x", "answer 7", "7")["score"] == 1.0
    again = pickle.loads(pickle.dumps(fn))  # travels to the worker process as (path, name)
    assert again("x", "answer 8", "7")["score"] == 0.0
    assert load_custom_reward_function(None) is None


def test_custom_reward_function_errors(scorer_file, tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.py"):
        load_custom_reward_function(tmp_path / "nope.py", "compute_score")
    with pytest.raises(ValueError, match="name='missing'"):
        load_custom_reward_function(scorer_file, "missing")
    with pytest.raises(ValueError, match="not callable"):
        load_custom_reward_function(scorer_file, "not_a_function")
    broken = tmp_path / "broken.py"
    broken.write_text("def compute_score(:\n")
    with pytest.raises(ValueError, match="importing it failed"):
        load_custom_reward_function(broken)


def test_manager_places_default_scores_on_last_valid_token(tok):
    data = make_batch(tok, ["12 + 3 = 15\n#### 15", "#### 14", "", "#### 15 then #### 16"], ["15"] * 4)
    out = RewardManager(tok, timeout_s=None)(data)
    reward, mask = out["reward_tensor"], data.batch["response_mask"]
    assert reward.shape == mask.shape
    last = mask.sum(-1) - 1
    assert reward[0, last[0]] == 1.0 and reward[0].sum() == 1.0
    assert reward[1].abs().sum() == 0 and reward[3].abs().sum() == 0
    assert reward[2, last[2]] == 0.0  # empty text (eos only) still scored, on its one valid token
    assert out["metrics"] == {"reward/errors": 0, "reward/timeouts": 0, "reward/empty_responses": 0,
                              "reward/missing_ground_truths": 0, "reward/samples": 4}


def test_manager_dict_scores_errors_and_timeouts_in_worker(tok, scorer_file):
    fn = load_custom_reward_function(scorer_file, "compute_score")
    manager = RewardManager(tok, compute_score=fn, timeout_s=2.0)
    try:
        texts = ["result 7", "hang forever", "boom", "text", "result 8", "result 7"]
        out = manager(make_batch(tok, texts, ["7"] * len(texts)))
        scores = out["reward_tensor"].sum(-1).tolist()
        assert scores == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]  # the run went on after the hang (worker replaced)
        assert out["metrics"]["reward/timeouts"] == 1 and out["metrics"]["reward/errors"] == 2
        assert out["reward_extra_info"]["acc"] == [True, None, None, None, False, True]
        assert out["reward_extra_info"]["length"][4] == len("result 8")
        assert manager._workers[0].restarts == 1
    finally:
        manager.close()


def test_manager_batch_mode_and_empty_response(tok, scorer_file):
    fn = load_custom_reward_function(scorer_file, "batch_score")
    data = make_batch(tok, ["a 7", "b 8"], ["7", "7"])
    data.batch["response_mask"][1] = 0  # an empty response: scored, placed at 0, counted
    out = RewardManager(tok, compute_score=fn, timeout_s=None, mode="batch")(data)
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0]
    assert out["metrics"]["reward/empty_responses"] == 1
    default = RewardManager(tok, timeout_s=None, mode="batch")(make_batch(tok, ["#### 7", "#### 8"], ["7", "7"]))
    assert default["reward_tensor"].sum(-1).tolist() == [1.0, 0.0]


def test_manager_bad_settings(tok):
    with pytest.raises(ValueError, match="reward_manager='prime'"):
        RewardManager(tok, mode="prime")
    with pytest.raises(ValueError, match="timeout_s"):
        RewardManager(tok, timeout_s=-1)
    with pytest.raises(ValueError, match="cannot be pickled"):
        RewardManager(tok, compute_score=lambda *a: 1.0, timeout_s=1.0)
    with pytest.raises(ValueError, match="no rule scorer"):  # unknown data_source is an error, not a 0
        RewardManager(tok, timeout_s=None)(make_batch(tok, ["#### 1"], ["1"], data_source="mystery"))


def test_a_score_beyond_float32_is_an_error_not_a_crash():
    assert RewardManager._as_score(1e30) == (1e30, {})
    with pytest.raises(ValueError, match="beyond float32's range"):
        RewardManager._as_score(1e39)
    with pytest.raises(ValueError, match="beyond float32's range"):
        RewardManager._as_score({"score": -1e39})


def test_multi_turn_responses_are_decoded_whole_as_verl_decodes_them(tok):
    """verl decodes every attended response token for the scorer (a tool's answer between the assistant's turns
    included); the score still lands on the last token the model wrote."""
    seen = []

    def scorer(data_source, solution_str, ground_truth, extra_info=None):
        seen.append(solution_str)
        return 1.0

    batch = make_batch(tok, ["call tool answer from tool final 42"], ["42"])
    ids = batch.batch["responses"][0].tolist()
    tool = tok.encode(" answer from tool", add_special_tokens=False)
    start = next(i for i in range(len(ids)) if ids[i:i + len(tool)] == tool)
    batch.batch["attention_mask"] = torch.cat([torch.ones(1, 4, dtype=torch.long),
                                               batch.batch["response_mask"].clone()], dim=1)
    batch.batch["response_mask"][0, start:start + len(tool)] = 0          # the tool's tokens: not the model's
    batch.batch["response_mask"][0, int(batch.batch["attention_mask"][0, 4:].sum()) - 1] = 0   # nor the last one
    out = RewardManager(tok, compute_score=scorer, timeout_s=None)(batch)
    assert seen == ["call tool answer from tool final 42"]
    last_model_token = int(batch.batch["response_mask"][0].nonzero()[-1])
    assert out["reward_tensor"][0].nonzero().flatten().tolist() == [last_model_token]


def test_multi_turn_scorers_get_verls_extra_info(tok):
    seen = []

    def scorer(data_source, solution_str, ground_truth, extra_info=None):
        seen.append(extra_info)
        return 0.0

    batch = make_batch(tok, ["a", "b"], ["1", "2"])
    batch.non_tensor_batch["multi_turn_stats"] = np.array(
        [{"num_turns": 4, "turn_scores": [0.5], "tool_rewards": [1.0], "tool_calls": 1}, {"num_turns": 2}],
        dtype=object)
    RewardManager(tok, compute_score=scorer, timeout_s=None)(batch)
    assert seen == [{"index": 0, "num_turns": 4, "turn_scores": [0.5], "tool_rewards": [1.0],
                     "rollout_reward_scores": {}},
                    {"index": 1, "num_turns": 2, "rollout_reward_scores": {}}]
    seen.clear()
    RewardManager(tok, compute_score=scorer, timeout_s=None)(make_batch(tok, ["a"], ["1"]))   # single turn
    assert seen == [{"index": 0, "num_turns": None, "rollout_reward_scores": {}}]   # verl's naive manager's keys


HANGING = textwrap.dedent('''
    import time

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        if "slow" in solution_str or "hang" in solution_str:
            time.sleep(60)
        return 1.0
''')


def test_a_scorer_hanging_on_every_input_stops_the_run_at_once(tmp_path, tok):
    """Timing out on each of thousands of samples would take hours for the same verdict; a scorer that is slow on a
    few samples only goes on (they count as timeouts)."""
    from hybridrl.rewards.error_guard import RewardErrorLimitError
    from hybridrl.rewards.reward_manager import HUNG_AFTER

    path = tmp_path / "hang.py"
    path.write_text(HANGING)
    manager = RewardManager(tok, compute_score=load_custom_reward_function(path), timeout_s=0.2)
    try:
        with pytest.raises(RewardErrorLimitError, match=rf"first {HUNG_AFTER} samples of 12 and scored none"):
            manager(make_batch(tok, ["hang"] * 12, ["1"] * 12))
        out = manager(make_batch(tok, ["slow", "slow", "ok 1"], ["1"] * 3))
        assert out["reward_tensor"].sum().item() == 1.0 and out["metrics"]["reward/timeouts"] == 2
    finally:
        manager.close()
