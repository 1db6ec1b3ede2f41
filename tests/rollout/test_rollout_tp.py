"""TP=2 on two gloo ranks equals TP=1: seeded samples and log-probs, with full and pre-sliced weights (the qwen3 run
with async scheduling on the TP ranks, against the synchronous TP=1 engine)."""

import json
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from gloo_ranks import end_process_group
from rollout_helpers import make_engine, tiny_hf_model

from hybridrl.rollout.config import EngineConfig
from hybridrl.rollout.engine import LLMEngine
from hybridrl.rollout.sampling_params import SamplingParams

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12, 13]]
PARAMS = SamplingParams(n=2, temperature=0.8, max_tokens=8, ignore_eos=True, seed=3)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


KINDS = ("qwen2", "qwen3")


def _worker(rank, port, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    group = dist.new_group([0, 1])
    for kind in KINDS:
        _run_one(rank, group, out_dir, kind)
    end_process_group()


def _run_one(rank, group, out_dir, kind):
    model = tiny_hf_model(kind, vocab_size=255)
    config = EngineConfig(dtype=torch.float32, block_size=4, num_kv_blocks=64, max_model_len=64,
                          max_num_batched_tokens=64, enforce_eager=True, async_scheduling=kind == "qwen3")
    engine = LLMEngine(model.config, config, tp_group=group, device="cpu")
    engine.wake_up(("weights",))
    sliced = 0
    for name, full in model.state_dict().items():  # send only this rank's slice, as a resharder would
        spec = engine.weight_shard_spec(name, full.shape)
        if spec is not None:
            dim, start, length = spec
            full = full.narrow(dim, start, length).clone()
            sliced += 1
        engine.load_weights([(name, full)])
    outs = engine.generate(PROMPTS, PARAMS)
    assert (engine.stats["num_lookahead_steps"] > 0) == engine.config.async_scheduling
    result = {"sliced": sliced, "tokens": [c.token_ids for o in outs for c in o.outputs],
              "logprobs": [c.logprobs for o in outs for c in o.outputs]}
    with open(os.path.join(out_dir, f"{kind}_rank{rank}.json"), "w") as f:
        json.dump(result, f)


@pytest.mark.slow
def test_tp2_equals_tp1(tmp_path):
    mp.spawn(_worker, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    for kind in KINDS:
        _check(tmp_path, kind)


def _check(tmp_path, kind):
    model = tiny_hf_model(kind, vocab_size=255)
    ref = make_engine(model, max_model_len=64, max_num_batched_tokens=64).generate(PROMPTS, PARAMS)
    ref_tokens = [c.token_ids for o in ref for c in o.outputs]
    ref_lp = torch.tensor([c.logprobs for o in ref for c in o.outputs])
    for rank in range(2):
        got = json.loads((tmp_path / f"{kind}_rank{rank}.json").read_text())
        assert got["sliced"] > 10  # qkv/o/gate_up/down/embed/lm_head arrived pre-sliced
        assert got["tokens"] == ref_tokens
        torch.testing.assert_close(torch.tensor(got["logprobs"]), ref_lp, atol=1e-4, rtol=0)
