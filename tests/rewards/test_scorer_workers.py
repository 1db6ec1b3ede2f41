"""Several scorer worker processes (reward_model.scorer_workers): the same scores, errors and timeouts as one, in
sample order, with the samples spread over the processes; a scorer hanging on every input still stops the run."""

import pickle
import textwrap

import pytest
from test_custom_and_manager import make_batch, tok  # noqa: F401  (tok is a fixture)

from hybridrl.rewards import RewardManager, load_custom_reward_function, score_worker
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


class _Pipe:
    """A worker's end of the pipe whose driver has gone after `calls` requests: recv raises `error` then."""

    def __init__(self, calls, error, send_error=None):
        self.calls, self.error, self.send_error, self.sent = list(calls), error, send_error, []

    def recv(self):
        if not self.calls:
            raise self.error
        return self.calls.pop(0)

    def send(self, msg):
        if self.send_error is not None and msg[0] != "ready":
            raise self.send_error
        self.sent.append(msg)


@pytest.mark.parametrize("error", [EOFError(), ConnectionResetError(104, "Connection reset by peer"),
                                   BrokenPipeError()])
def test_a_worker_leaves_quietly_when_the_driver_has_gone(error):
    """Killing the driver resets the pipe (ConnectionResetError, not EOFError): the worker returns instead of
    printing a traceback for every scorer process of the run."""
    pipe = _Pipe([(("abc",), {}, 5.0)], error)
    score_worker._worker_main(pipe, pickle.dumps(len))
    assert pipe.sent == [("ready", None), ("ok", 3)]
    gone = _Pipe([(("abc",), {}, 5.0)], EOFError(), send_error=BrokenPipeError())   # gone while the call ran
    score_worker._worker_main(gone, pickle.dumps(len))
    assert gone.sent == [("ready", None)]


def test_a_result_that_cannot_be_sent_back_is_an_error_and_the_worker_goes_on(tmp_path):
    path = tmp_path / "unsendable.py"
    path.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    return (lambda: 1) if solution_str == 'lambda' else 2.0\n")
    worker = score_worker.ScorerProcess(load_custom_reward_function(path))
    try:
        kwargs = {"data_source": "d", "ground_truth": "1"}
        status, value = worker.call((), {**kwargs, "solution_str": "lambda"}, 30.0)
        assert status == "error" and "could not be sent back" in value, value
        assert worker.call((), {**kwargs, "solution_str": "x"}, 30.0) == ("ok", 2.0)
        assert worker.restarts == 0
    finally:
        worker.close()
