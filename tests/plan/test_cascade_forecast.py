"""The cascade decode forecast of `hybridrl config check` (plan/cascade.py): the engine's own rule
(rollout/shared_prefix.cascade_pays) applied to the step's longest prompts on the planned GPU, with the reasons it
can never run."""

import pytest

from hybridrl.assets.tiny_model import SIZE_PRESETS, make_config
from hybridrl.config import load_config
from hybridrl.plan import DeviceSpec, make_plan
from hybridrl.plan.memory import GiB
from hybridrl.rollout.shared_prefix import MIN_L2_FRACTION

Q15 = make_config(**SIZE_PRESETS["qwen2.5-1.5b"])   # 2 K/V heads x 128 dims: 1,024 bytes a token and layer in bf16
H100 = DeviceSpec("cuda", "NVIDIA H100 80GB HBM3", int(79.2 * GiB), None)
BASE = ["data.max_response_length=1024", "data.train_batch_size=32", "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=32", "trainer.n_gpus_per_node=1"]


def forecast(*keys, device=H100, model=Q15):
    return make_plan(load_config(overrides=[*BASE, *keys]), model, device).rollout.cascade


@pytest.mark.parametrize("prompt,engages", [(256, False), (1024, False), (2048, True), (4096, True)])
def test_the_rule_at_the_longest_prompts_against_the_gpus_l2(prompt, engages):
    f = forecast(f"data.max_prompt_length={prompt}")
    assert (f.prompts, f.shared_tokens, f.parts) == (32, prompt, 32)   # 8 samples a group: one part each
    assert f.prefix_bytes == 32 * prompt * 1024 and f.l2_bytes == 50 << 20
    assert f.engages is engages is (f.prefix_bytes >= MIN_L2_FRACTION * f.l2_bytes)
    assert str(f).startswith("cascade decode  32 prompts x")
    assert ("on from the first decode step" in str(f)) is engages


def test_only_full_blocks_are_shared_and_sequences_at_once_bound_the_groups():
    f = forecast("data.max_prompt_length=1000", "actor_rollout_ref.rollout.max_num_seqs=64")
    assert f.shared_tokens == 992 and f.prompts == 8 and f.prefix_bytes == 8 * 992 * 1024


def test_large_groups_are_cut_into_parts_that_each_read_the_prefix():
    f = forecast("data.max_prompt_length=2048", "actor_rollout_ref.rollout.n=32", "data.train_batch_size=8",
                 "actor_rollout_ref.actor.ppo_mini_batch_size=8")
    assert f.prompts == 8 and f.parts == 8 * 4   # 12 q heads / 2 kv heads: 10 rows a part, so 32 samples -> 4 parts


def test_an_unknown_gpu_gets_the_bytes_and_the_rule_not_a_verdict():
    f = forecast("data.max_prompt_length=2048", device=DeviceSpec("cuda", "a 79 GiB GPU", int(79 * GiB), None))
    assert f.l2_bytes is None and f.engages is None and "an L2 not known here" in str(f)


@pytest.mark.parametrize("keys,device,reason", [
    ((), DeviceSpec("cpu", "cpu", None), "no GPU"),
    (("actor_rollout_ref.rollout.n=1", "actor_rollout_ref.actor.ppo_mini_batch_size=32"), H100, "n = 1"),
    (("actor_rollout_ref.rollout.enable_prefix_sharing=false",), H100, "enable_prefix_sharing' is false"),
    (("data.max_prompt_length=40",), H100, "share fewer than 64 in full blocks")])
def test_why_it_never_runs_is_said(keys, device, reason):
    cpu = ("trainer.device=cpu",) if device.type == "cpu" else ()
    f = forecast("data.max_prompt_length=2048", *keys, *cpu, device=device)
    assert f.off is not None and reason in f.off and f.engages is False
    assert str(f).startswith("cascade decode  off: ")


def test_the_switch_that_turns_it_off_is_honoured(monkeypatch):
    monkeypatch.setenv("HYBRIDRL_CASCADE", "0")
    assert "HYBRIDRL_CASCADE=0" in forecast("data.max_prompt_length=2048").off
