"""Keys whose other values hybridrl does not implement are refused at load, naming the key, the value and the
rule; verl's rollout engine names load with a WARNING saying the native engine runs instead."""

import logging

import pytest

from hybridrl.config.errors import ConfigError
from hybridrl.config.loader import load_config
from hybridrl.config.tokenizer_files import same_tokenizer

GAE = "algorithm.adv_estimator=gae"


def refusal(*overrides) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(overrides=list(overrides))
    return str(e.value)


def test_dataloader_workers_are_accepted_saying_none_run():
    """verl's default of 8 loader processes loads with a warning (no process runs); a negative count is refused."""
    from hybridrl.config.loader import load_config

    assert any("'data.dataloader_num_workers' = 8: no loader process runs" in w
               for w in load_config(overrides=["data.dataloader_num_workers=8"]).validate())
    assert "'data.dataloader_num_workers' = -1 must be >= 0" in refusal("data.dataloader_num_workers=-1")


def test_critic_retention_must_follow_the_actor():
    message = refusal("trainer.max_actor_ckpt_to_keep=3", "trainer.max_critic_ckpt_to_keep=1")
    assert "'trainer.max_critic_ckpt_to_keep' = 1 differs from 'trainer.max_actor_ckpt_to_keep' = 3" in message
    load_config(overrides=["trainer.max_actor_ckpt_to_keep=3", "trainer.max_critic_ckpt_to_keep=3"])
    load_config(overrides=["trainer.max_actor_ckpt_to_keep=3"])  # null = the actor's


def test_checkpoint_contents_must_hold_the_weights_and_only_known_parts():
    assert "must include 'model' (the sharded weights a run resumes from) or 'hf_model'" in refusal(
        "actor_rollout_ref.actor.checkpoint.contents=[optimizer,extra]")
    export = load_config(overrides=["actor_rollout_ref.actor.checkpoint.save_contents=[hf_model]"])
    assert any("has 'hf_model' but not 'model'" in w and "no run can resume from" in w for w in export.validate())
    message = refusal("actor_rollout_ref.actor.checkpoint.contents=[model,weights]")
    assert "'actor_rollout_ref.actor.checkpoint.contents' = 'weights' is not one of" in message
    load_config(overrides=["actor_rollout_ref.actor.checkpoint.contents=[model,hf_model]"])


def test_critic_tokenizer_must_be_the_actors(tmp_path):
    a, b, c = (tmp_path / n for n in "abc")
    for d, text in ((a, "{}"), (b, "{}"), (c, '{"other": 1}')):
        d.mkdir()
        (d / "tokenizer.json").write_text(text)
    model = f"actor_rollout_ref.model.path={a}"
    message = refusal(GAE, model, f"critic.model.tokenizer_path={c}")
    assert f"'critic.model.tokenizer_path' = '{c}' is not the actor's tokenizer '{a}'" in message
    load_config(overrides=[GAE, model, f"critic.model.tokenizer_path={b}"])  # identical files
    load_config(overrides=[GAE, model, f"data.tokenizer={b}"])  # critic default = model.path, same files as b
    load_config(overrides=[model, f"critic.model.tokenizer_path={c}"])  # grpo: no critic, key unused
    assert same_tokenizer(str(a), f"{a}/") and not same_tokenizer(str(a), str(tmp_path / "missing"))


def test_policy_loss_ratios_are_range_checked():
    message = refusal("actor_rollout_ref.actor.policy_loss.clip_cov_ratio=0",
                      "actor_rollout_ref.actor.policy_loss.clip_cov_lb=6")
    assert "'actor_rollout_ref.actor.policy_loss.clip_cov_ratio' = 0 must be in (0, 1]" in message
    assert "'actor_rollout_ref.actor.policy_loss.clip_cov_lb' = 6 must be <" in message


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_verl_engine_names_run_the_native_engine_with_a_warning(engine, caplog):
    with caplog.at_level(logging.WARNING, logger="hybridrl.config"):
        cfg = load_config(overrides=[f"actor_rollout_ref.rollout.name={engine}"])
    assert cfg.actor_rollout_ref.rollout.name == "native"
    warning = [r for r in caplog.records if r.levelno == logging.WARNING and engine in r.getMessage()]
    assert warning and "no vLLM or SGLang backend" in warning[0].getMessage()
