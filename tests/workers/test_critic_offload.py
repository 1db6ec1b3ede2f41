"""The critic worker's optimizer offload: the state comes back at the update's first optimizer step (after the
backward), not before the forward, and goes back to the host after the update (offloads faked, recorded)."""

import torch

from hybridrl.protocol import DataProto
from hybridrl.workers.critic import CriticWorker


def test_the_critic_state_returns_at_the_optimizer_step_and_leaves_after_the_update(monkeypatch):
    events = []
    monkeypatch.setattr("hybridrl.training.offload.load_optimizer", lambda opt, dev: events.append("load optimizer"))
    monkeypatch.setattr("hybridrl.training.offload.offload_optimizer", lambda opt: events.append("offload optimizer"))

    class Critic:
        before_optimizer_step = None

        def update_critic(self, data):
            events.append("forward/backward")
            for _ in range(2):   # two mini-batches: the state comes back once
                self.before_optimizer_step()
                events.append("step")
            return {"critic/vf_loss": 0.0}

    worker = object.__new__(CriticWorker)
    worker.critic, worker.module, worker.optimizer = Critic(), None, "optimizer"
    worker.compute_device = torch.device("cpu")
    worker._param_offload, worker._optimizer_offload, worker._optimizer_on_cpu = False, True, True
    out = CriticWorker.update_critic(worker, DataProto({}))
    assert events == ["forward/backward", "load optimizer", "step", "step", "offload optimizer"]
    assert worker._optimizer_on_cpu and worker.critic.before_optimizer_step is None
    assert out.meta_info["metrics"]["critic/vf_loss"] == [0.0]
