"""'trainer.gpu_memory_gb': the plan sizes every phase for a GPU of that many GiB (so several runs can share one), keeps
the GPU's name (its peaks), says so among its choices, refuses more than the GPU holds, and on a CPU has nothing to
cap."""

import pytest

from hybridrl.assets.tiny_model import SIZE_PRESETS, make_config
from hybridrl.config import ConfigError, load_config
from hybridrl.plan import DeviceSpec, make_plan
from hybridrl.plan.memory import GiB
from hybridrl.plan.sizing import SAFETY

Q15 = make_config(**SIZE_PRESETS["qwen2.5-1.5b"])
H100 = DeviceSpec("cuda", "NVIDIA H100 80GB HBM3", int(79.2 * GiB), None)
LONG = ["data.max_prompt_length=256", "data.max_response_length=4096", "data.train_batch_size=32",
        "actor_rollout_ref.rollout.n=8", "actor_rollout_ref.actor.ppo_mini_batch_size=32", "trainer.n_gpus_per_node=1"]


def plan(*keys, device=H100):
    return make_plan(load_config(overrides=[*LONG, *keys]), Q15, device)


def test_a_capped_plan_fits_every_phase_in_the_cap_and_says_so():
    whole, capped = plan(), plan("trainer.gpu_memory_gb=40")
    assert capped.device.total_bytes == 40 * GiB and capped.device.name == H100.name
    assert max(p.total for p in capped.predicted.values()) <= SAFETY * 40 * GiB
    assert max(p.total for p in whole.predicted.values()) > SAFETY * 40 * GiB   # the cap changed the plan
    assert capped.actor.optimizer_offload and not whole.actor.optimizer_offload   # how it fits here
    assert any(c.startswith("planned for 40 of the GPU's 79.2 GiB (trainer.gpu_memory_gb)") for c in capped.choices)
    assert "40.0 GiB per GPU" in str(capped)


def test_a_cap_over_the_gpu_is_refused_naming_the_key_and_the_gpu():
    with pytest.raises(ConfigError, match=r"'trainer.gpu_memory_gb' = 100 exceeds the GPU's 79.2 GiB \(NVIDIA H100"):
        plan("trainer.gpu_memory_gb=100")


def test_a_cap_must_be_positive_and_means_nothing_without_a_gpu():
    with pytest.raises(ConfigError, match=r"'trainer.gpu_memory_gb' must be > 0 or null, got -1"):
        plan("trainer.gpu_memory_gb=-1")
    cpu = plan("trainer.gpu_memory_gb=8", "trainer.device=cpu", device=DeviceSpec("cpu", "cpu", None))
    assert "trainer.gpu_memory_gb = 8 has nothing to cap: the run has no GPU" in cpu.choices
