"""RolloutStream: finished groups come out while the rollout still runs; a failed rollout raises in the taker."""

import threading

import pytest
import torch

from hybridrl.rollout.sampling_params import CompletionOutput, RequestOutput
from hybridrl.workers.rollout_stream import RolloutStream


def group(rid: int, n: int = 2) -> RequestOutput:
    return RequestOutput(rid, [1], [CompletionOutput(j, [5], [-0.1], "stop") for j in range(n)])


def test_groups_come_out_before_the_rollout_ends():
    release = threading.Event()

    def run(on_group_done):
        on_group_done(group(0))
        on_group_done(group(1))
        assert release.wait(10)      # the tail: held until the taker has the first groups
        on_group_done(group(2))
        return ["all"], {"timing_s/gen_engine": 1.0}

    stream = RolloutStream(run, torch.device("cpu"))
    stream.start()
    first, done = stream.take(min_samples=4, timeout_s=10)
    assert [o.request_id for o in first] == [0, 1] and not done and not stream.ended
    release.set()
    rest, done = stream.take(min_samples=100, timeout_s=10)   # fewer than asked: returned once the rollout ends
    assert [o.request_id for o in rest] == [2] and done
    assert stream.outputs == ["all"] and stream.metrics == {"timing_s/gen_engine": 1.0}
    assert stream.take(min_samples=1) == ([], True)          # asked again after the end: nothing more
    assert stream.samples_taken == 6


def test_a_failed_rollout_raises_in_the_taker():
    def run(on_group_done):
        on_group_done(group(0))
        raise RuntimeError("engine broke")

    stream = RolloutStream(run, torch.device("cpu"))
    stream.start()
    with pytest.raises(RuntimeError, match="streamed rollout failed") as e:
        stream.take(min_samples=100, timeout_s=10)
    assert "engine broke" in str(e.value.__cause__)


def test_take_times_out_and_the_switch_interval_comes_back():
    import sys

    before = sys.getswitchinterval()
    release = threading.Event()
    stream = RolloutStream(lambda on_group_done: (release.wait(10), {}), torch.device("cpu"))
    stream.start()
    assert sys.getswitchinterval() < before      # the decode loop's host work is not held up for long slices
    with pytest.raises(TimeoutError):
        stream.take(min_samples=1, timeout_s=0.1)
    release.set()
    assert stream.take(min_samples=1, timeout_s=10) == ([], True)
    assert sys.getswitchinterval() == before


def test_groups_wait_for_the_rollouts_tail():
    """With in_tail, finished groups are held until the rollout reaches its tail, which can begin without a group
    finishing (the stream looks again on its own)."""
    tail, release = threading.Event(), threading.Event()

    def run(on_group_done):
        on_group_done(group(0))
        assert release.wait(10)
        return [], {}

    stream = RolloutStream(run, torch.device("cpu"), in_tail=tail.is_set)
    stream.start()
    with pytest.raises(TimeoutError):
        stream.take(min_samples=1, timeout_s=0.2)     # one group done, but not in the tail yet
    threading.Timer(0.1, tail.set).start()
    got, done = stream.take(min_samples=1, timeout_s=10)
    assert [o.request_id for o in got] == [0] and not done
    release.set()
    assert stream.take(min_samples=1, timeout_s=10) == ([], True)
