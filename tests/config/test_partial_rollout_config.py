"""Partial rollouts' keys: what validation refuses and warns about, and what the run plan decides from them."""

import pytest
import transformers

from hybridrl.config.errors import ConfigError
from hybridrl.config.loader import load_config
from hybridrl.plan import DeviceSpec, make_plan
from hybridrl.plan.partial_rollout import rollout_correction

PR, RC = "actor_rollout_ref.rollout.partial_rollout", "algorithm.rollout_correction"
ON = [f"{PR}.enable=true", f"{PR}.max_new_tokens_per_step=256"]
CPU = DeviceSpec("cpu", "cpu", None)
HF = transformers.Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, vocab_size=256)


@pytest.mark.parametrize("overrides,message", [
    ([f"{PR}.enable=true"], rf"'{PR}.max_new_tokens_per_step' = None: partial rollouts need a positive"),
    ([f"{PR}.enable=true", f"{PR}.max_new_tokens_per_step=0"], r"max_new_tokens_per_step' = 0"),
    ([*ON, f"{PR}.max_staleness=0"], rf"'{PR}.max_staleness' = 0 must be >= 1"),
    ([*ON, "actor_rollout_ref.rollout.name=hf"], r"does not go with 'actor_rollout_ref.rollout.name' = hf"),
    ([*ON, "algorithm.adv_estimator=remax"], r"does not go with 'algorithm.adv_estimator' = remax"),
    ([*ON, "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc"],
     r"does not go with 'algorithm.filter_groups.enable' = True"),
    ([*ON, "actor_rollout_ref.rollout.multi_turn.enable=true",
      "actor_rollout_ref.rollout.multi_turn.tool_config_path=x.yaml"],
     r"does not go with 'actor_rollout_ref.rollout.multi_turn.enable' = True"),
])
def test_bad_partial_rollout_settings_are_refused_naming_key_and_rule(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=overrides)


def test_warnings_for_budgets_that_carry_nothing_or_can_never_finish():
    warnings = load_config(overrides=[*ON, "data.max_response_length=256"]).validate()
    assert any("no sample is ever carried" in w for w in warnings)
    warnings = load_config(overrides=[*ON, "data.max_response_length=4096", f"{PR}.max_staleness=2"]).validate()
    assert any("longer than 768 tokens" in w and "always dropped" in w for w in warnings)
    assert not any("partial_rollout" in w for w in load_config(overrides=ON).validate())


def test_the_plan_turns_token_is_on_and_sizes_the_trained_groups():
    assert make_plan(load_config(overrides=[]), HF, CPU).rollout.partial is None
    plan = make_plan(load_config(overrides=ON), HF, CPU)
    p = plan.rollout.partial
    assert (p.tokens_per_step, p.max_staleness, p.max_groups, p.rollout_is) == (256, 4, 256, "token")
    assert p.group_multiple == 1  # 8 samples a group over 8 ranks
    assert any(c.startswith(f"{RC}.rollout_is = token (partial rollouts") for c in plan.choices)
    assert "partial rollouts  <= 256 new tokens a sample per step" in str(plan)
    cfg = load_config(overrides=ON)
    assert rollout_correction(cfg.algorithm.rollout_correction, p).rollout_is == "token"
    assert rollout_correction(cfg.algorithm.rollout_correction, None).rollout_is is None
    # PPO, one sample a group, a critic over 8 ranks: groups in multiples of 8; a set IS level is kept
    ppo = make_plan(load_config(overrides=[*ON, "algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.n=1",
                                           f"{RC}.rollout_is=sequence"]), HF, CPU).rollout.partial
    assert ppo.group_multiple == 8 and ppo.rollout_is == "sequence"


def test_bypass_ppo_clip_weighs_carried_tokens_by_its_clipped_ratio_not_by_is():
    clip = make_plan(load_config(overrides=[*ON, f"{RC}.bypass_mode=true"]), HF, CPU)
    assert clip.rollout.partial.rollout_is is None and "the bypass mode's clipped ratio" in str(clip)
    assert any("carried tokens are weighed by the clipped ratio" in c for c in clip.choices)
    assert clip.actor.old_log_prob_pass is False
    reinforce = make_plan(load_config(overrides=[*ON, f"{RC}.bypass_mode=true", f"{RC}.loss_type=reinforce"]), HF, CPU)
    assert reinforce.rollout.partial.rollout_is == "token"   # REINFORCE's weights, as without bypass


def test_kv_of_a_call_counts_its_continuations():
    plan = make_plan(load_config(overrides=[*ON, "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                                            "trainer.n_gpus_per_node=1"]), HF, CPU)
    fresh = plan.rollout.kv_cache.blocks_for(2, 8)
    assert fresh < plan.rollout.kv_cache.blocks_for(2, 8, continuations=3) <= plan.rollout.kv_cache.blocks


def test_carried_samples_run_beside_the_fresh_ones():
    """A step's call holds its fresh samples and those carried from earlier steps: the engine's concurrency and KV
    are planned for every cohort still in flight (a sample ends within ceil(response / budget) calls, a group is
    dropped after max_staleness steps), so carried samples do not decode in waves after the fresh ones."""
    base = ["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8", "trainer.n_gpus_per_node=1",
            "data.max_response_length=1024", "data.max_prompt_length=64"]
    off = make_plan(load_config(overrides=base), HF, CPU).rollout.kv_cache
    assert off.max_num_seqs == 64                                   # 8 prompts x 8
    plan = make_plan(load_config(overrides=[*base, *ON]), HF, CPU)   # 1024 / 256 = 4 cohorts (staleness 4)
    kv = plan.rollout.kv_cache
    assert kv.max_num_seqs == 4 * 64 and kv.blocks_for(8, 8, continuations=3 * 64) <= kv.blocks
    assert kv.blocks_for(8, 8, continuations=3 * 64) > off.blocks
    assert any("up to 256 sequences at once (64 fresh and up to 192 carried" in c for c in plan.choices)
    stale = make_plan(load_config(overrides=[*base, *ON, f"{PR}.max_staleness=1"]), HF, CPU).rollout.kv_cache
    assert stale.max_num_seqs == 2 * 64                            # groups are dropped after one step
    capped = make_plan(load_config(overrides=[*base, *ON, "actor_rollout_ref.rollout.max_num_seqs=100"]), HF, CPU)
    assert capped.rollout.kv_cache.max_num_seqs == 100
    assert any("max_num_seqs = 100 makes the rest wait their turn" in c for c in capped.choices)
