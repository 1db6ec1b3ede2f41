"""The run plan with model-based rewards: the reward model's weights in the phases where they are on the GPU,
its micro-batch chosen or refused like the other passes, and the judge's KV need in the rollout phase."""

import pytest
from transformers import AutoConfig

from hybridrl.config import ConfigError, load_config
from hybridrl.plan import DeviceSpec, ModelShape, make_plan
from hybridrl.plan.memory import GiB

A, R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
H200 = DeviceSpec("cuda", "H200", int(139.8 * GiB))
STEP = ["data.train_batch_size=64", f"{R}.n=8", f"{A}.ppo_mini_batch_size=64", "data.max_prompt_length=256",
        "data.max_response_length=256", "trainer.n_gpus_per_node=1", "data.return_raw_chat=true"]
Q05 = AutoConfig.for_model("qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                           num_attention_heads=14, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)
Q7 = AutoConfig.for_model("qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                          num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def plan(tiny_model_dir, tiny_reward_model_dir):
    def make(extra=(), rm=Q7, device=H200):
        cfg = load_config(overrides=[*STEP, f"actor_rollout_ref.model.path={tiny_model_dir}", "reward_model.enable=true",
                                     f"reward_model.model.path={tiny_reward_model_dir}", *extra])
        return make_plan(cfg, Q05, device, rm_hf_config=rm)
    return make


def test_reward_model_weights_per_phase(plan):
    rm_params = ModelShape.from_hf_config(Q7).num_params - Q7.vocab_size * Q7.hidden_size  # no LM head
    offloaded = plan()
    assert offloaded.predicted["reward_model"].parts["reward model params"] == rm_params * 2  # bf16, 1 GPU
    assert all("reward model params" not in offloaded.predicted[p].parts for p in ("gen", "update_actor"))
    resident = plan(["reward_model.model.fsdp_config.param_offload=false"])
    for phase in ("gen", "update_actor", "reward_model"):
        assert resident.predicted[phase].parts["reward model params"] == rm_params * 2
    # on a GPU with the micro-batch left to the plan: forwards of 32768 tokens (the log-prob target), counted padded
    forward = offloaded.reward_model.forward
    assert (forward.rows, forward.max_tokens, offloaded.reward_model.max_length) == (None, 32768, 512)
    assert offloaded.predicted["reward_model"].parts["activations"] == 32768 * 2 * (4 * 3584 + 3 * 18944)
    assert ("reward model    micro-batches per GPU of at most 32768 tokens (inputs sorted by length, counted at "
            "each forward's longest), inputs up to 512 tokens") in str(offloaded)
    assert "reward_model.forward_max_token_len_per_gpu = 32768" in "\n".join(offloaded.choices)
    # fixed rows (verl's default without use_dynamic_bsz): 512 samples of 512 tokens, the target gives 64 a forward
    rows = plan(["reward_model.use_dynamic_bsz=false"])
    assert (rows.reward_model.forward.rows, rows.reward_model.forward.max_tokens) == (64, None)
    assert rows.predicted["reward_model"].parts["activations"] == 64 * 512 * 2 * (4 * 3584 + 3 * 18944)
    assert "reward model    micro-batch per GPU 64, inputs up to 512 tokens" in str(rows)


def test_reward_model_token_budget_kept_or_refused_naming_the_key(plan):
    assert plan(["reward_model.forward_max_token_len_per_gpu=4096"]).reward_model.forward.max_tokens == 4096
    with pytest.raises(ConfigError) as e:
        plan(["reward_model.forward_max_token_len_per_gpu=100000000"])
    assert "'reward_model.forward_max_token_len_per_gpu' = 100000000" in str(e.value)
    with pytest.raises(ConfigError) as e:   # below the longest input the reward model is given
        plan(["reward_model.forward_max_token_len_per_gpu=300", "reward_model.max_length=400"])
    assert "'reward_model.forward_max_token_len_per_gpu' = 300 must be 'auto' or an integer >= the longest " \
           "reward-model input, 400 tokens" in str(e.value)
    # a longer max_length raises the auto budget to hold one input
    assert plan(["reward_model.max_length=40000"]).reward_model.forward.max_tokens == 40000


def test_reward_model_micro_batch_kept_or_refused_naming_the_key(plan):
    # an explicit size keeps fixed rows (use_dynamic_bsz auto resolves off), as verl reads it
    assert plan(["reward_model.micro_batch_size_per_gpu=3"]).reward_model.forward.rows == 3
    with pytest.raises(ConfigError) as e:
        plan(["reward_model.micro_batch_size_per_gpu=512", "reward_model.max_length=8192"])
    assert "'reward_model.micro_batch_size_per_gpu' = 512" in str(e.value) and "reward_model" in str(e.value)


def test_judge_needs_one_unshared_sequence_per_sample_in_the_rollout(plan):
    judge = plan(["reward_model.style=judge"], rm=None)
    assert "reward_model" not in judge.predicted and judge.reward_model is None
    # 512 samples x 32 blocks (512 tokens / 16) each, against 64 shared prompts x 16 + 512 x 16 for the rollout
    assert judge.rollout.kv_cache.blocks == 512 * 32 and judge.rollout.kv_cache.blocks_for(512, 1) == 512 * 32
    block = 2 * 24 * 16 * 2 * 64 * 2
    assert judge.predicted["gen"].parts["kv cache"] == 512 * 32 * block
