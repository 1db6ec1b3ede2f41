"""The actor worker takes its offloads from the run plan, never the config's 'auto': activation offload reaches the
actor's update, optimizer offload the hybrid engine (model building, the engine and the process group faked)."""

from types import SimpleNamespace

import pytest
import torch

import hybridrl.rollout.factory
import hybridrl.training.actor
import hybridrl.workers.actor_rollout_ref as worker_module
from hybridrl.assets.tiny_model import SIZE_PRESETS, make_config
from hybridrl.config.loader import load_config
from hybridrl.plan import DeviceSpec, make_plan
from hybridrl.plan.memory import GiB
from hybridrl.workers.actor_rollout_ref import ActorRolloutRefWorker

M, A, R = "actor_rollout_ref.model", "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
STEP = ["data.max_prompt_length=256", "data.train_batch_size=16", f"{R}.n=8", "trainer.n_gpus_per_node=1",
        f"{M}.use_liger=false"]


# 7B: at 16k responses the optimizer is offloaded; with two mini-batches (its state on the GPU for the second) the
# activations too; at 1k neither
@pytest.mark.parametrize("response, mini, activations, optimizer", [(16384, 8, True, True), (16384, 16, False, True),
                                                                   (1024, 16, False, False)])
def test_the_worker_hands_down_the_plans_offloads(monkeypatch, response, mini, activations, optimizer):
    config = load_config(overrides=[*STEP, f"data.max_response_length={response}", f"{A}.ppo_mini_batch_size={mini}"])
    assert config.actor_rollout_ref.model.enable_activation_offload == "auto"
    assert config.actor_rollout_ref.actor.fsdp_config.optimizer_offload == "auto"
    plan = make_plan(config, make_config(**SIZE_PRESETS["qwen2.5-7b"]), DeviceSpec("cuda", "H200", int(139.8 * GiB)))
    assert plan.actor.activation_offload is activations and plan.actor.optimizer_offload is optimizer

    got = {}
    monkeypatch.setattr(worker_module, "dist", SimpleNamespace(get_rank=lambda: 0))
    monkeypatch.setattr(worker_module, "format_mesh", lambda *a, **k: "")
    monkeypatch.setattr(worker_module, "build_fsdp_model", lambda *a, **k: ("module", "optimizer", "scheduler"))
    monkeypatch.setattr(hybridrl.training.actor, "DataParallelPPOActor",
                        lambda *a, **k: got.setdefault("actor", k))
    monkeypatch.setattr(hybridrl.rollout.factory, "build_rollout_engine", lambda *a, **k: SimpleNamespace())
    monkeypatch.setattr(worker_module, "HybridEngine", lambda *a, **k: got.setdefault("hybrid", k))
    fake = SimpleNamespace(config=config, plan=plan, _has_actor=True, _has_ref=False,
                           compute_device=torch.device("cpu"), set_dispatch_info=lambda *a: None,
                           setup_process=lambda *a, **k: SimpleNamespace(training=None, sp_group=None, rollout=None))
    fake._build_rollout = lambda mesh: ActorRolloutRefWorker._build_rollout(fake, mesh)
    ActorRolloutRefWorker.init_model(fake)
    assert got["actor"]["activation_offload"] is activations
    assert got["hybrid"]["optimizer_offload"] is optimizer
