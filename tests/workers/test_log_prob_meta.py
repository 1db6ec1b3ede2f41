"""The log-prob pass settings a worker hands the actor: rows or token budget and unshard choices from the run plan
(old log-probs: the rollout's, reference: the ref's; a pass without rows is token-budgeted), the temperature from
the rollout in both."""

from types import SimpleNamespace

from hybridrl.config.loader import load_config
from hybridrl.plan.sizing import MicroBatching
from hybridrl.protocol import DataProto
from hybridrl.workers.actor_rollout_ref import ActorRolloutRefWorker


def _meta(overrides, section):
    cfg = load_config(overrides=["actor_rollout_ref.rollout.n=2", *overrides])
    plan = SimpleNamespace(actor=SimpleNamespace(
        old_log_prob=MicroBatching(rows=5, unshard_once=True), ref_log_prob=MicroBatching(max_tokens=4096)))
    fake = SimpleNamespace(config=cfg, plan=plan)
    return ActorRolloutRefWorker._log_prob_meta(fake, DataProto(), section).meta_info


def test_log_prob_meta_reads_the_plan():
    ref_keys = ["actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true",
                "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=4096",
                "actor_rollout_ref.rollout.temperature=0.7"]
    old = _meta(ref_keys, "rollout")
    ref = _meta(ref_keys, "ref")
    assert (old["micro_batch_size"], old["use_dynamic_bsz"], old["max_token_len"], old["unshard_once"]) == \
        (5, False, None, True)
    assert (ref["micro_batch_size"], ref["use_dynamic_bsz"], ref["max_token_len"], ref["unshard_once"]) == \
        (None, True, 4096, False)
    assert old["temperature"] == ref["temperature"] == 0.7
