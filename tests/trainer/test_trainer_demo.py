"""The embedded demo's recipe (the demo itself runs only in benchmarks/demo_seeds.py, never in CI)."""

from hybridrl.config.loader import load_config
from hybridrl.trainer import demo
from hybridrl.trainer.sft_trainer import load_sft_config


def test_the_seed_reaches_data_model_sft_and_grpo(tmp_path, monkeypatch):
    cfg = load_config(overrides=demo.demo_overrides(tmp_path, tmp_path / "sft", seed=3))
    assert cfg.trainer.seed == 3 and cfg.data.seed == 3
    sft = load_sft_config(overrides=demo.sft_overrides(tmp_path / "m", tmp_path / "d", tmp_path / "o", seed=3))
    assert sft.trainer.seed == 3
    monkeypatch.setenv(demo.SEED_ENV, "5")
    assert demo.demo_seed() == 5


def test_grpo_updates_on_policy_and_validates_greedily(tmp_path):
    cfg = load_config(overrides=demo.demo_overrides(tmp_path, tmp_path / "sft"))
    actor, rollout = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    assert actor.ppo_mini_batch_size == cfg.data.train_batch_size  # one update a step: no old-log-prob pass
    assert rollout.val_kwargs.do_sample is False and rollout.val_kwargs.n == 1
    assert cfg.trainer.total_training_steps % cfg.trainer.test_freq == 0  # the last step is validated


def test_prepare_rebuilds_when_the_seed_changes(tmp_path, monkeypatch):
    built = []
    monkeypatch.setattr("hybridrl.data.tasks.make_dataset", lambda *a, **k: built.append(("data", k["seed"])))
    monkeypatch.setattr("hybridrl.assets.tiny_model.build_tiny_model",
                        lambda out, **k: built.append(("model", k["seed"])))
    demo.prepare(tmp_path, seed=1)
    demo.prepare(tmp_path, seed=1)  # cached
    demo.prepare(tmp_path, seed=2)
    assert built == [("data", 1), ("model", 1), ("data", 2), ("model", 2)]
