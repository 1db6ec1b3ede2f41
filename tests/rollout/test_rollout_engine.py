"""Native engine vs HF on tiny random models (fp32, CPU), dense and mixture-of-experts."""

import time

import pytest
import torch
import transformers
from rollout_helpers import hf_greedy, hf_logprobs, make_engine, tiny_config, tiny_hf_model

from hybridrl.rollout.config import EngineConfig
from hybridrl.rollout.engine import LLMEngine
from hybridrl.rollout.hf_backend import HFRolloutEngine
from hybridrl.rollout.sampling_params import SamplingParams

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], [10] * 11]
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


@pytest.mark.parametrize("kind,overrides", [("qwen2", {}), ("llama", {}), ("mistral", {}), ("qwen3", {}),
                                            ("qwen3", {"tie_word_embeddings": True}),
                                            ("qwen3_moe", {}), ("qwen3_moe", {"norm_topk_prob": False}),
                                            ("mixtral", {})])
def test_greedy_equals_hf_generate_and_logprobs_match_hf_forward(kind, overrides):
    model = tiny_hf_model(kind, **overrides)
    engine = make_engine(model)
    outs = engine.generate(PROMPTS, GREEDY)
    for prompt, out in zip(PROMPTS, outs):
        ref = hf_greedy(model, prompt, 10)
        assert out.outputs[0].token_ids == ref
        assert out.outputs[0].finish_reason == "length"
        torch.testing.assert_close(torch.tensor(out.outputs[0].logprobs), hf_logprobs(model, prompt, ref),
                                   atol=1e-4, rtol=0)
    assert len({t for o in outs for t in o.outputs[0].token_ids}) > 3  # not a degenerate constant output


def test_sampled_logprobs_match_hf_at_temperature_and_sharing_is_invisible():
    model = tiny_hf_model("qwen2")
    params = SamplingParams(n=3, temperature=0.7, top_p=0.9, max_tokens=8, ignore_eos=True, seed=5)
    shared = make_engine(model).generate(PROMPTS, params)
    unshared_engine = make_engine(model, enable_prefix_sharing=False)
    unshared = unshared_engine.generate(PROMPTS, params)
    for prompt, a, b in zip(PROMPTS, shared, unshared):
        assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
        for c in a.outputs:
            torch.testing.assert_close(torch.tensor(c.logprobs), hf_logprobs(model, prompt, c.token_ids, 0.7),
                                       atol=1e-4, rtol=0)
    again = make_engine(model).generate(PROMPTS, params)
    assert [c.token_ids for o in again for c in o.outputs] == [c.token_ids for o in shared for c in o.outputs]
    other = make_engine(model).generate(PROMPTS, SamplingParams(**{**params.__dict__, "seed": 6}))
    assert [c.token_ids for o in other for c in o.outputs] != [c.token_ids for o in shared for c in o.outputs]


def test_prefix_sharing_saves_blocks_and_preemption_keeps_greedy_outputs():
    model = tiny_hf_model("llama")
    params = SamplingParams(n=4, temperature=0, max_tokens=12, ignore_eos=True)
    roomy = make_engine(model)
    ref = roomy.generate(PROMPTS, params)
    assert roomy.stats["kv_blocks_peak"] < roomy.stats["kv_blocks_peak_unshared"]
    assert roomy.stats["num_preemptions"] == 0
    tight = make_engine(model, num_kv_blocks=12)
    got = tight.generate(PROMPTS, params)
    assert tight.stats["num_preemptions"] > 0
    assert [c.token_ids for o in got for c in o.outputs] == [c.token_ids for o in ref for c in o.outputs]
    for a, b in zip(got, ref):
        for ca, cb in zip(a.outputs, b.outputs):
            torch.testing.assert_close(torch.tensor(ca.logprobs), torch.tensor(cb.logprobs), atol=1e-4, rtol=0)


def test_weight_reload_changes_outputs_and_sleep_wake_cycle():
    a, b = tiny_hf_model("qwen2", seed=0), tiny_hf_model("qwen2", seed=1)
    engine = make_engine(a)
    out_a = engine.generate(PROMPTS, GREEDY)
    engine.sleep()
    engine.wake_up(("weights",))
    engine.load_weights(b.state_dict().items())
    engine.wake_up(("kv_cache",))
    out_b = engine.generate(PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in out_b] == [hf_greedy(b, p, 10) for p in PROMPTS]
    assert [o.outputs[0].token_ids for o in out_b] != [o.outputs[0].token_ids for o in out_a]
    engine.load_weights(a.state_dict().items())  # update without sleeping
    assert [o.outputs[0].token_ids for o in engine.generate(PROMPTS, GREEDY)] == [
        o.outputs[0].token_ids for o in out_a]


def test_a_wake_sizes_the_kv_cache_for_its_call():
    model = tiny_hf_model("qwen2")
    engine = make_engine(model)
    assert engine.stats["num_kv_blocks"] == 256  # the config's
    engine.sleep()
    engine.wake_up(("weights",))
    engine.load_weights(model.state_dict().items())
    engine.wake_up(("kv_cache",), num_kv_blocks=20)
    out = engine.generate(PROMPTS, GREEDY)
    assert engine.stats["num_kv_blocks"] == 20 and engine.config.num_kv_blocks == 256
    assert [o.outputs[0].token_ids for o in out] == [hf_greedy(model, p, 10) for p in PROMPTS]


def test_missing_weights_and_bad_inputs_raise():
    model = tiny_hf_model("qwen3")
    engine = LLMEngine(model.config, EngineConfig(dtype=torch.float32, num_kv_blocks=64, max_model_len=64,
                                                  max_num_batched_tokens=64), device="cpu")
    engine.wake_up(("weights",))
    engine.load_weights((k, v) for k, v in model.state_dict().items() if "k_proj" not in k)
    with pytest.raises(ValueError, match="never loaded.*qkv_proj.weight\\[k\\]"):
        engine.generate([[1, 2]], GREEDY)
    engine.load_weights(model.state_dict().items())
    with pytest.raises(ValueError, match="prompt 0 has 64 tokens"):
        engine.generate([[1] * 64], GREEDY)
    with pytest.raises(ValueError, match="unknown weight name 'model.foo.weight'"):
        engine.load_weights([("model.foo.weight", torch.zeros(1))])
    with pytest.raises(ValueError, match="max_num_batched_tokens=8"):
        EngineConfig(max_model_len=64, max_num_batched_tokens=8)
    with pytest.raises(ValueError, match="top_p=0"):
        SamplingParams(top_p=0)


def test_unsupported_architecture_points_to_hf_backend():
    cfg = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64)
    with pytest.raises(ValueError, match="model_type 'gpt2'.*rollout.name=hf"):
        LLMEngine(cfg, EngineConfig(num_kv_blocks=8), device="cpu")
    with pytest.raises(ValueError, match=r"mistral: sliding_window=100 is narrower than the run's sequences \(256 "):
        LLMEngine(tiny_config("mistral", sliding_window=100), EngineConfig(num_kv_blocks=8), device="cpu")
    LLMEngine(tiny_config("mistral", sliding_window=256), EngineConfig(num_kv_blocks=8), device="cpu")  # never binds
    with pytest.raises(ValueError, match="rope type 'yarn'.*rollout.name=hf"):
        LLMEngine(tiny_config("qwen2", rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}),
                  EngineConfig(num_kv_blocks=8), device="cpu")


def test_stop_tokens_and_eos_finish_with_stop():
    model = tiny_hf_model("qwen2")
    free = make_engine(model).generate(PROMPTS[:1], GREEDY)[0].outputs[0].token_ids
    stop = free[3]
    first = free.index(stop)
    out = make_engine(model).generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=10,
                                                                  stop_token_ids=[stop]))[0].outputs[0]
    assert out.token_ids == free[: first + 1] and out.finish_reason == "stop"
    eos_out = make_engine(model, eos_token_ids=(stop,)).generate(PROMPTS[:1], SamplingParams(temperature=0,
                                                                                         max_tokens=10))
    assert eos_out[0].outputs[0].token_ids == free[: first + 1]


def test_hf_backend_matches_native_greedy():
    model = tiny_hf_model("qwen2")
    native = make_engine(model).generate(PROMPTS, SamplingParams(n=2, temperature=0, max_tokens=6, ignore_eos=True))
    engine = HFRolloutEngine(model, pad_token_id=0)
    hf = engine.generate(PROMPTS, SamplingParams(n=2, temperature=0, max_tokens=6, ignore_eos=True))
    for a, b in zip(native, hf):
        assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
        for ca, cb in zip(a.outputs, b.outputs):
            torch.testing.assert_close(torch.tensor(ca.logprobs), torch.tensor(cb.logprobs), atol=1e-4, rtol=0)
    assert engine.stats["generated_tokens"] == 3 * 2 * 6
    engine.generate(PROMPTS[:1], SamplingParams(n=1, temperature=0, max_tokens=4, ignore_eos=True))
    assert engine.stats["generated_tokens"] == 4   # the last call's, as the native engine's stats (per step)


def test_kv_budget_charges_only_the_engine_to_gpu_memory_utilization():
    """vLLM's per-instance meaning: a hybrid worker's resident training state does not count against the ceiling
    (7B on one H200 with fp32 masters and AdamW state on the GPU: 101.5 GiB in use before the KV wakes), but the
    KV must fit in what is free; the activation reserve comes off either bound."""
    from hybridrl.rollout.model_runner import kv_budget_bytes

    G = 2**30
    total, weights, reserve = int(139.8 * G), int(14.2 * G), 4 * G
    hybrid_7b = kv_budget_bytes(0.5, total, total - int(101.5 * G), weights, reserve)
    assert hybrid_7b == int(139.8 * G - 101.5 * G) - reserve          # bounded by what is free
    empty_gpu = kv_budget_bytes(0.5, total, total, weights, reserve)
    assert empty_gpu == int(0.5 * total) - weights - reserve           # bounded by the engine's share
    assert kv_budget_bytes(0.1, total, total, weights, reserve) < 0    # weights alone exceed the share


def test_stats_describe_each_call_and_the_tail():
    """Counters restart with every generate call (a step's rollout metrics are that step's), and the tail clock
    sees the sequences finishing: with one long straggler most of the decode time has few sequences running."""
    from hybridrl.rollout.engine import TAIL_FRACTION, _TailClock

    engine = make_engine(tiny_hf_model("qwen2"))
    params = SamplingParams(n=2, temperature=0, max_tokens=12, ignore_eos=True)
    engine.generate([[1, 2, 3], [4, 5]], params)
    first = dict(engine.stats)
    engine.generate([[1, 2, 3], [4, 5]], params)
    assert engine.stats["num_decode_steps"] == first["num_decode_steps"] == 11
    assert engine.stats["generated_tokens"] == first["generated_tokens"] == 4 * 12
    assert engine.stats["running_seqs_mean"] == pytest.approx(4.0)   # all four run to the end together
    assert engine.stats["tail_time_frac"] == 0.0
    assert "decode_floor_s" not in engine.stats                     # no floor off the GPU

    class Batch:  # a decode step of `running` sequences with 100-token contexts
        def __init__(self, running):
            self.is_prefill, self.seqs = False, [[0] * 100] * running

    clock = _TailClock(20, step_floor_s=lambda context: context * 1e-6)
    clock.start -= 0.06  # the call's wall time: the six 10 ms steps below
    for running in (20, 20, 1, 1, 1, 1):
        clock.step(Batch(running), time.perf_counter() - 0.01, kv_tokens=100 * running)  # each step took 10 ms
    stats = clock.stats()
    assert 1 < 20 * TAIL_FRACTION
    assert stats["tail_time_frac"] == pytest.approx(4 / 6, rel=0.1)
    assert stats["running_seqs_mean"] == pytest.approx(44 / 6)
    assert stats["decode_floor_s"] == pytest.approx((2 * 20 + 4) * 100 * 1e-6)


def test_triton_decode_kernels_only_take_head_dims_they_tile():
    """The Triton RoPE/store and paged-decode kernels tile head_dim whole: a model whose head_dim is not a power of
    two (the tiny Mistral's 24) decodes through the torch paths instead of failing at its first decode step."""
    from hybridrl.models import fused
    from hybridrl.models.decoder import TPDecoderForCausalLM

    assert [d for d in (16, 24, 64, 80, 96, 128, 256) if fused.head_dim_fits(d)] == [16, 64, 128, 256]
    assert not TPDecoderForCausalLM(tiny_config("mistral")).fused_fits
    assert TPDecoderForCausalLM(tiny_config("qwen3")).fused_fits
