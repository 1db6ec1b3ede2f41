"""Several scorer worker processes (reward_model.scorer_workers): the same scores, errors and timeouts as one, in
sample order, with the samples spread over the processes; a scorer hanging on every input still stops the run."""

import textwrap

import pytest
from test_custom_and_manager import make_batch, tok  # noqa: F401  (tok is a fixture)

from hybridrl.rewards import RewardManager, load_custom_reward_function
from hybridrl.rewards.error_guard import RewardErrorLimitError

SCORER = textwrap.dedent('''
    import os
    import time

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        if "hang" in solution_str:
            time.sleep(60)
        if "boom" in solution_str:
            raise RuntimeError("boom")
        time.sleep(0.2)    # a sandboxed run's wait
        return {"score": float(len(solution_str) % 3), "pid": os.getpid()}
''')


@pytest.fixture
def scorer(tmp_path):
    path = tmp_path / "scorer.py"
    path.write_text(SCORER)
    return load_custom_reward_function(path)


def test_concurrent_scoring_equals_serial_scoring(tok, scorer):  # noqa: F811
    texts = ["a", "bb", "boom", "ccc", "hang", "dddd", "e", "ff", "ggg", "h"]
    batch = lambda: make_batch(tok, texts, ["1"] * len(texts))   # noqa: E731
    managers = [RewardManager(tok, compute_score=scorer, timeout_s=2.0, workers=w) for w in (1, 4)]
    try:
        (one, many) = (m(batch()) for m in managers)
    finally:
        for m in managers:
            m.close()
    assert one["reward_tensor"].equal(many["reward_tensor"]) and one["scores"] == many["scores"]
    for key in ("reward/errors", "reward/timeouts", "reward/samples"):
        assert one["metrics"][key] == many["metrics"][key]
    assert many["metrics"]["reward/timeouts"] == 1 and many["metrics"]["reward/errors"] == 1
    # one process (and its replacement after the timeout) against four at once, one of which waits out the hang
    pids = [{p for p in out["reward_extra_info"]["pid"] if p is not None} for out in (one, many)]
    assert len(pids[0]) <= 2 and len(pids[1]) >= 3


def test_a_scorer_hanging_on_every_input_stops_the_run_with_several_workers(tok, scorer):  # noqa: F811
    manager = RewardManager(tok, compute_score=scorer, timeout_s=0.3, workers=4)
    try:
        with pytest.raises(RewardErrorLimitError, match="scored none"):
            manager(make_batch(tok, ["hang"] * 24, ["1"] * 24))
    finally:
        manager.close()


def test_bad_worker_counts_are_refused(tok):  # noqa: F811
    with pytest.raises(ValueError, match=r"reward_model.scorer_workers=0: must be an integer >= 1"):
        RewardManager(tok, timeout_s=1.0, workers=0)
