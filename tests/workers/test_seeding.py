"""trainer.seed and rollout.seed: one global seed per process, a sampling seed per step offset by the rollout dp
rank (the TP ranks of a group share it), a mini-batch shuffle seed per step; external_lib imported first."""

import functools
import random
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hybridrl.config.errors import ConfigError
from hybridrl.config.loader import load_config
from hybridrl.models.external_lib import ExternalLibError
from hybridrl.protocol import DataProto
from hybridrl.seeding import derive_seed, shuffle_seed, step_sampling_seed
from hybridrl.training.micro_batches import iter_mini_batches
from hybridrl.workers.actor_rollout_ref import ActorRolloutRefWorker
from hybridrl.workers.common import prepare_process, sampling_params_from


def draws():
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def test_prepare_process_seeds_every_rng_from_trainer_seed():
    prepare_process(load_config(overrides=["trainer.seed=7"]))
    first = draws()
    prepare_process(load_config(overrides=["trainer.seed=7"]))
    assert draws() == first
    prepare_process(load_config(overrides=["trainer.seed=8"]))
    assert draws() != first


def test_step_seed_depends_on_both_seeds_and_the_step():
    base = step_sampling_seed(1, 0, 5)
    assert base == step_sampling_seed(1, 0, 5)
    others = {step_sampling_seed(2, 0, 5), step_sampling_seed(1, 1, 5), step_sampling_seed(1, 0, 6),
              step_sampling_seed(5, 0, 1)}
    assert base not in others and len(others) == 4
    assert all(0 <= derive_seed(s, "x") < 2**31 for s in range(100))


def generate_seed(dp_rank: int, tp_rank: int, meta: dict) -> int:
    """The seed a rollout worker at (dp_rank, tp_rank) gives its engine, through the worker's own method."""
    cfg = load_config(overrides=["actor_rollout_ref.rollout.seed=3"])
    seen = {}

    class Engine:
        stats: dict = {}

        def generate(self, prompts, params):
            seen["seed"] = params.seed
            raise StopIteration  # stop before outputs are converted: the seed is all this test needs

    class Hybrid:
        def rollout(self, metrics, num_kv_blocks, beside_training=False):
            import contextlib
            return contextlib.nullcontext(Engine())

    fake = SimpleNamespace(config=cfg, hybrid=Hybrid(), plan=SimpleNamespace(rollout=SimpleNamespace(
                               kv_cache=SimpleNamespace(blocks_for=lambda prompts, n: 1))),
                           rollout_coords=SimpleNamespace(dp_rank=dp_rank, tp_rank=tp_rank), tool_agent=None)
    fake._generate = functools.partial(ActorRolloutRefWorker._generate, fake)
    prompts = DataProto.from_dict({"input_ids": torch.ones(1, 2, dtype=torch.long),
                                   "attention_mask": torch.ones(1, 2, dtype=torch.long)}, meta_info=dict(meta))
    with pytest.raises(StopIteration):
        ActorRolloutRefWorker.generate_sequences(fake, prompts)
    return seen["seed"]


def test_sampling_seed_is_offset_by_the_rollout_dp_rank_and_shared_within_a_tp_group():
    meta = {"seed": 1000}
    assert generate_seed(0, 0, meta) == 1000
    assert generate_seed(2, 0, meta) == generate_seed(2, 1, meta) == 1002
    assert generate_seed(1, 0, {}) == 3 + 1  # no driver seed (e.g. a direct call): rollout.seed + dp rank


def test_validation_uses_val_kwargs_and_the_offset_seed():
    rcfg = load_config().actor_rollout_ref.rollout
    params = sampling_params_from(rcfg, {"validate": True, "seed": 50}, dp_rank=3)
    assert params.seed == 53 and params.temperature == 0.0


def mini_batch_order(seed: int, shuffle: bool = True) -> list[int]:
    data = DataProto.from_dict({"row": torch.arange(16)}, meta_info={"shuffle_seed": seed})
    return [int(x) for mini in iter_mini_batches(data, mini_batch_rows=4, epochs=2, shuffle=shuffle)
            for x in mini.batch["row"]]


def test_mini_batch_shuffle_is_seeded_by_the_step():
    step1, step2 = mini_batch_order(shuffle_seed(1, 1)), mini_batch_order(shuffle_seed(1, 2))
    assert step1 == mini_batch_order(shuffle_seed(1, 1))  # replayed exactly (e.g. after a resume)
    assert step1 != step2 and sorted(step1) == sorted(step2) == sorted(list(range(16)) * 2)
    assert step1[:16] != step1[16:]  # each ppo epoch reshuffles
    assert mini_batch_order(shuffle_seed(1, 1), shuffle=False) == list(range(16)) * 2


def test_external_lib_is_imported_and_a_failure_names_the_key(tmp_path, monkeypatch):
    (tmp_path / "my_models_lib.py").write_text("import sys\nsys.modules[__name__].REGISTERED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    prepare_process(load_config(overrides=["actor_rollout_ref.model.external_lib=my_models_lib"]))
    assert sys.modules["my_models_lib"].REGISTERED
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.model\.external_lib='no_such_lib_xyz'"):
        load_config(overrides=["actor_rollout_ref.model.external_lib=no_such_lib_xyz"])  # refused when loaded
    cfg = load_config(overrides=["actor_rollout_ref.model.external_lib=my_models_lib"])
    cfg = cfg.with_value("actor_rollout_ref.model.external_lib", "no_such_lib_xyz")  # in a worker, should it be missing there
    with pytest.raises(ExternalLibError, match=r"actor_rollout_ref\.model\.external_lib='no_such_lib_xyz'"):
        prepare_process(cfg)


def test_losses_and_estimators_registered_by_external_lib_are_valid_config_values(tmp_path, monkeypatch):
    """verl users register their own policy loss / advantage estimator in external code; the config accepts the
    registered names once that code is imported (the loader imports external_lib first), and still refuses others."""
    (tmp_path / "my_algos.py").write_text(
        "from hybridrl.algorithms import register_adv_est, register_policy_loss\n"
        "@register_policy_loss('my_clip')\n"
        "def my_clip(*a, **k):\n    raise NotImplementedError\n"
        "@register_adv_est('my_adv')\n"
        "def my_adv(*a, **k):\n    raise NotImplementedError\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from hybridrl.algorithms import registry

    for name in ("POLICY_LOSS_REGISTRY", "ADV_ESTIMATOR_REGISTRY"):   # the registrations end with this test
        monkeypatch.setattr(registry, name, dict(getattr(registry, name)))
    keys = ["actor_rollout_ref.actor.policy_loss.loss_mode=my_clip", "algorithm.adv_estimator=my_adv"]
    with pytest.raises(ConfigError, match="'my_clip' is not one of"):
        load_config(overrides=keys)
    cfg = load_config(overrides=[*keys, "actor_rollout_ref.model.external_lib=my_algos"])
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "my_clip" and cfg.algorithm.adv_estimator == "my_adv"
    with pytest.raises(ConfigError, match="'nope' is not one of"):
        load_config(overrides=["actor_rollout_ref.actor.policy_loss.loss_mode=nope",
                               "actor_rollout_ref.model.external_lib=my_algos"])
