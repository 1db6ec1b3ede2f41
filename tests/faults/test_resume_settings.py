"""Resuming with changed settings: each changed key is refused, ignored or takes effect (and the optimizer
settings really do), and a checkpoint file that fails to load is named."""

import json
import logging
import shutil

import pytest
import torch
from fault_inject import largest_file, tiny_trained_actor, truncate

from hybridrl.config.loader import load_config
from hybridrl.trainer.resume_check import (
    CONFIG_FILE,
    MODEL_FILES,
    ResumeConfigError,
    check_resume_config,
    classify_changes,
    save_resolved_config,
)
from hybridrl.training.checkpoint import CheckpointLoadError, load_checkpoint, save_checkpoint

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # DCP in one process, as meant


def config(*overrides):
    return load_config(overrides=["actor_rollout_ref.rollout.n=2", *overrides])


def saved(*overrides):
    return config(*overrides).to_dict()


def verdicts(changes):
    return {line.split(":")[0]: verdict for verdict, lines in changes.items() for line in lines}


def test_each_changed_key_gets_its_verdict():
    old = saved("actor_rollout_ref.model.path=/models/a", "trainer.seed=1", "trainer.total_training_steps=10")
    new = config("actor_rollout_ref.model.path=/models/b", "trainer.seed=2", "trainer.total_training_steps=20",
                 "actor_rollout_ref.actor.optim.lr=3e-6", "data.seed=7", "trainer.logger=[console]",
                 "trainer.resume_mode=resume_path")
    assert verdicts(classify_changes(old, new)) == {
        "actor_rollout_ref.model.path": "refused", "data.seed": "refused", "trainer.seed": "takes effect",
        "trainer.total_training_steps": "takes effect", "actor_rollout_ref.actor.optim.lr": "takes effect",
        "trainer.logger": "takes effect"}  # resume_mode is how one resumes, never a change


@pytest.mark.parametrize("before, after, verdict", [
    ("grpo", "rloo", "takes effect"), ("grpo", "gae", "refused"), ("gae", "reinforce_plus_plus", "refused")])
def test_estimator_change_is_refused_only_when_it_adds_or_drops_the_critic(before, after, verdict):
    changes = classify_changes(saved(f"algorithm.adv_estimator={before}"), config(f"algorithm.adv_estimator={after}"))
    assert verdicts(changes) == {"algorithm.adv_estimator": verdict}


def test_kl_coef_is_ignored_only_when_the_controller_state_is_restored():
    on = "algorithm.use_kl_in_reward=true"
    assert verdicts(classify_changes(saved(on), config(on, "algorithm.kl_ctrl.kl_coef=0.5"))) == {
        "algorithm.kl_ctrl.kl_coef": "ignored"}
    assert verdicts(classify_changes(saved(), config("algorithm.kl_ctrl.kl_coef=0.5"))) == {
        "algorithm.kl_ctrl.kl_coef": "takes effect"}


def test_the_same_path_written_differently_is_no_change(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    old = saved("actor_rollout_ref.model.path=~/models/tiny")
    assert classify_changes(old, config(f"actor_rollout_ref.model.path={tmp_path}/models/tiny")) == {
        "refused": [], "ignored": [], "takes effect": []}


def test_refusal_names_every_conflicting_key_with_both_values(tmp_path, caplog):
    (tmp_path / CONFIG_FILE).write_text(json.dumps(saved("actor_rollout_ref.model.path=/models/a")))
    with pytest.raises(ResumeConfigError) as err:
        check_resume_config(tmp_path, config("actor_rollout_ref.model.path=/models/b", "data.shuffle=false"))
    msg = str(err.value)
    assert "actor_rollout_ref.model.path: '/models/a' in the checkpoint, '/models/b' now" in msg
    assert "data.shuffle: True in the checkpoint, False now" in msg
    # a new batch size is not refused (verl resumes too): the prompts go on at the saved sample
    with caplog.at_level(logging.WARNING, logger="hybridrl.resume"):
        check_resume_config(tmp_path, config("actor_rollout_ref.model.path=/models/a", "data.train_batch_size=128",
                                             "actor_rollout_ref.actor.ppo_mini_batch_size=128"))
    assert "data.train_batch_size: 256 in the checkpoint, 128 now" in caplog.text
    with caplog.at_level(logging.WARNING, logger="hybridrl.resume"):
        check_resume_config(tmp_path, config("actor_rollout_ref.model.path=/models/a", "trainer.save_freq=5"))
    assert "trainer.save_freq: -1 in the checkpoint, 5 now" in caplog.text and "take effect" in caplog.text


def _model_dir(path, seed):
    """A model-like directory: a config and a weights file whose bytes depend on `seed` (same names and sizes)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text('{"hidden_size": 8}')
    (path / "model.safetensors").write_bytes(torch.randn(3 << 18, generator=torch.Generator().manual_seed(seed))
                                             .numpy().tobytes())
    return path


def test_a_moved_model_resumes_and_another_model_at_the_new_path_is_refused(tmp_path, caplog):
    old_dir = _model_dir(tmp_path / "models/a", seed=0)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    save_resolved_config(ckpt, config(f"actor_rollout_ref.model.path={old_dir}"))
    assert "actor_rollout_ref.model.path" in json.loads((ckpt / MODEL_FILES).read_text())
    moved = tmp_path / "elsewhere/a"
    shutil.copytree(old_dir, moved)
    shutil.rmtree(old_dir)
    with caplog.at_level(logging.WARNING, logger="hybridrl.resume"):
        changes = check_resume_config(ckpt, config(f"actor_rollout_ref.model.path={moved}"))
    assert verdicts(changes) == {"actor_rollout_ref.model.path": "takes effect"}
    assert "the same files, moved" in caplog.text
    other = _model_dir(tmp_path / "other/a", seed=1)   # same file names and sizes, other weights
    with pytest.raises(ResumeConfigError, match="actor_rollout_ref.model.path"):
        check_resume_config(ckpt, config(f"actor_rollout_ref.model.path={other}"))
    (moved / "model.safetensors").write_bytes(b"\0" + (moved / "model.safetensors").read_bytes()[1:])
    with pytest.raises(ResumeConfigError, match="actor_rollout_ref.model.path"):   # one byte changed in a sample
        check_resume_config(ckpt, config(f"actor_rollout_ref.model.path={moved}"))


def test_checkpoint_without_saved_config_is_said_to_be_unchecked(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="hybridrl.resume"):
        assert check_resume_config(tmp_path, config()) == {}
    assert "cannot be checked" in caplog.text


def test_new_lr_is_applied_over_the_loaded_optimizer_keeping_its_state(tmp_path):
    model, optimizer, scheduler = tiny_trained_actor(lr=1e-3)
    save_checkpoint(tmp_path / "actor", model, optimizer, scheduler)
    saved_moment = next(iter(optimizer.state.values()))["exp_avg"].clone()
    model2, optimizer2, scheduler2 = tiny_trained_actor(lr=5e-3, seed=1)
    optimizer2.param_groups[0]["weight_decay"] = 0.2  # as if optim.weight_decay changed too
    load_checkpoint(tmp_path / "actor", model2, optimizer2, scheduler2)
    group = optimizer2.param_groups[0]
    assert scheduler2.base_lrs == [5e-3] and group["initial_lr"] == 5e-3 and group["weight_decay"] == 0.2
    assert group["lr"] == pytest.approx(5e-3 * scheduler2.lr_lambdas[0](scheduler2.last_epoch), rel=1e-12)
    assert scheduler2.get_last_lr() == [group["lr"]]
    assert torch.equal(next(iter(optimizer2.state.values()))["exp_avg"], saved_moment)  # the state still loads
    scheduler2.step()  # and the schedule continues from the new base lr
    assert group["lr"] == pytest.approx(5e-3 * scheduler2.lr_lambdas[0](scheduler2.last_epoch), rel=1e-12)


def test_unchanged_settings_load_the_saved_lr_exactly(tmp_path):
    model, optimizer, scheduler = tiny_trained_actor(lr=1e-3)
    save_checkpoint(tmp_path / "actor", model, optimizer, scheduler)
    model2, optimizer2, scheduler2 = tiny_trained_actor(lr=1e-3, seed=1)
    load_checkpoint(tmp_path / "actor", model2, optimizer2, scheduler2)
    assert optimizer2.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]


@pytest.mark.parametrize("part, what", [("model", "model"), ("optim", "optimizer")])
def test_truncated_shard_loaded_directly_names_it(tmp_path, part, what):
    model, optimizer, scheduler = tiny_trained_actor(lr=1e-3)
    save_checkpoint(tmp_path / "actor", model, optimizer, scheduler)
    truncate(largest_file(tmp_path / "actor", part))
    with pytest.raises(CheckpointLoadError, match=rf"cannot load the {what} from {tmp_path / 'actor' / part} \("):
        load_checkpoint(tmp_path / "actor", model, optimizer, scheduler)


class _Recorder:
    def __init__(self):
        self.steps: list[tuple[int, dict]] = []

    def log(self, data, step):
        self.steps.append((step, dict(data)))

    def resumed(self, step):
        self.resumed_at = step


@pytest.mark.parametrize("resume", [True, False], ids=["resumed", "fresh"])
def test_logged_steps_never_go_back_after_a_resume(tmp_path, resume):
    """The start-up record (dataset counts) goes with step 0 of a fresh run, and into the first new step of a
    resumed one: before, a resumed run logged a bare step 0 after its saved steps."""
    from fault_inject import make_trainer, trained_run

    run = tmp_path / "run"
    if resume:
        trained_run(run, steps=(1, 2))
    trainer = make_trainer(run, "trainer.total_training_steps=4")
    trainer.tracker, trainer.startup_metrics = _Recorder(), {"data/filtered_prompts": 0.0}
    trainer.train_step = lambda batch, batches: {"actor/pg_loss": 0.0}
    trainer.fit()
    steps = [s for s, _ in trainer.tracker.steps]
    assert steps == ([3, 4] if resume else [0, 1, 2, 3, 4])
    assert getattr(trainer.tracker, "resumed_at", None) == (2 if resume else None)   # the file log is cut there
    assert "data/filtered_prompts" in trainer.tracker.steps[0][1]
    assert all("data/filtered_prompts" not in d for _, d in trainer.tracker.steps[1:])


def test_a_run_resumed_past_its_last_step_says_so(tmp_path, capsys):
    from fault_inject import make_trainer, trained_run

    run = tmp_path / "run"
    trained_run(run, steps=(1, 2))
    trainer = make_trainer(run, "trainer.total_training_steps=2")
    trainer.tracker = _Recorder()
    trainer.train_step = lambda batch, batches: pytest.fail("nothing is left to train")
    trainer.fit()
    assert "nothing to train: the run resumed at step 2, already at or past its last step 2" in capsys.readouterr().out
