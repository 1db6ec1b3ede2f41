"""actor.checkpoint.contents reaches the actor's checkpoint save and load."""

from types import SimpleNamespace

import hybridrl.training.checkpoint as checkpoint
from hybridrl.config.loader import load_config
from hybridrl.workers.actor_rollout_ref import ActorRolloutRefWorker


def test_the_worker_saves_and_loads_what_checkpoint_contents_lists(monkeypatch):
    calls = {}
    monkeypatch.setattr(checkpoint, "save_checkpoint", lambda *a, **kw: calls.setdefault("save", kw["contents"]))
    monkeypatch.setattr(checkpoint, "load_checkpoint", lambda *a, **kw: calls.setdefault("load", kw["contents"]))
    cfg = load_config(overrides=["actor_rollout_ref.actor.checkpoint.contents=[model,hf_model]"])
    fake = SimpleNamespace(config=cfg, actor_module=SimpleNamespace(config=None), optimizer=None, scheduler=None,
                           hybrid=SimpleNamespace(after_update=lambda: None))
    fake._checkpoint_contents = lambda: ActorRolloutRefWorker._checkpoint_contents(fake)
    ActorRolloutRefWorker.save_checkpoint(fake, "/unused")
    ActorRolloutRefWorker.load_checkpoint(fake, "/unused")
    assert calls == {"save": ("model", "hf_model"), "load": ("model", "hf_model")}
