"""The PPO/GRPO fit loop on the driver (single controller), in verl's phase order:

  gen → reward (reward model, then rule/custom) → old_log_prob → ref → values → adv → update_critic → update_actor → testing → save

The algorithm lives here, on the driver; workers only run SPMD compute (generation, log-probs, updates). Every
phase is timed as `timing_s/{phase}` and its metrics use verl's names, so a verl dashboard reads our runs.
With `algorithm.filter_groups` (DAPO's dynamic sampling) gen → reward repeats over further generation batches
until enough prompt groups with signal are collected (with KL in the reward, old_log_prob → ref too, per batch,
as verl). `algorithm.rollout_correction` weighs (and optionally rejects) tokens by the rollout-vs-trainer
probability ratio in adv, from the old log-probs, or inside the update when there is no old-log-prob pass.
With partial rollouts (trainer/partial_rollout.py) gen continues the groups in flight and the step trains the
groups it completed — none in a step that completed none, which then only generates. With the early update
(trainer/early_update.py) reward → ref → adv → update_actor run on each part of the rollout's finished groups while
the rest still generate, and the optimizer steps after the last part.
"""

from __future__ import annotations

import itertools
import json
import logging
import sys
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from hybridrl.algorithms import agg_loss, apply_kl_penalty, compute_advantage, get_kl_controller
from hybridrl.algorithms.advantages import pf_ppo_resample
from hybridrl.algorithms.bypass_mode import BypassLoss
from hybridrl.algorithms.rollout_correction import apply_rollout_correction
from hybridrl.config.sections import PPOConfig
from hybridrl.data.rl_dataset import collate_fn
from hybridrl.plan.partial_rollout import rollout_correction
from hybridrl.protocol import DataProto
from hybridrl.rewards.error_guard import RewardErrorGuard
from hybridrl.rewards.token_level import ground_truths
from hybridrl.seeding import derive_seed, shuffle_seed, step_sampling_seed, validation_sampling_seed
from hybridrl.trainer.dynamic_sampling import GroupCollector, merge_reward_metrics, sample_metric
from hybridrl.trainer.early_update import early_update_step
from hybridrl.trainer.generation_dump import dump_generations
from hybridrl.trainer.metrics import (
    StepWorkerMetrics,
    compute_data_metrics,
    compute_floor_metrics,
    compute_throughout_metrics,
    compute_timing_metrics,
    compute_variance_proxy_metrics,
    flatten_validation_metrics,
    multi_turn_stats_metrics,
    process_validation_metrics,
)
from hybridrl.trainer.partial_rollout import STATE_FILE as PARTIAL_STATE_FILE
from hybridrl.trainer.partial_rollout import PartialRolloutBuffer
from hybridrl.trainer.resume_check import check_resumable, check_resume_config, save_resolved_config
from hybridrl.trainer.reward_phase import RM_COUNTS, PendingReward, compute_reward, compute_rm_scores
from hybridrl.trainer.rollout_batch import (
    assign_uids,
    attach_rollout,
    generation_inputs,
    own_log_prob_metrics,
    rollout_probs_diff,
)
from hybridrl.trainer.timer import marked_timer
from hybridrl.trainer.tracking import make_progress_bar

logger = logging.getLogger("hybridrl.trainer")

def need_critic(config: PPOConfig) -> bool:
    return config.algorithm.adv_estimator == "gae"


REWARD_EXTRAS = "reward_extra_info"   # non-tensor key: per sample, the dict of what the scorer reported beside its score


def _columns(rows) -> dict[str, list]:
    """Per-sample dicts as columns (None where a sample lacks a key), as verl's rollout dump writes them."""
    keys = dict.fromkeys(k for row in rows for k in row)
    return {k: [row.get(k) for row in rows] for k in keys}


def need_reference(config: PPOConfig) -> bool:
    return config.actor_rollout_ref.actor.use_kl_loss or config.algorithm.use_kl_in_reward


def balance_batch(batch: DataProto, world_size: int, group_size: int = 1) -> dict:
    """Reorder rows so each DP rank gets about the same number of tokens (greedy longest-first into the lightest
    partition), keeping each partition's rows contiguous as the dispatch splits them. group_size > 1: whole
    groups of that many adjacent rows (a prompt's samples, which shared-prompt forwards need together) move as
    one, in their order; a batch whose groups do not divide evenly over the ranks is left as it is."""
    lengths = batch.batch["attention_mask"].sum(-1).tolist()
    n = len(lengths)
    if world_size <= 1 or n % (world_size * group_size):
        return {}
    units = [sum(lengths[i:i + group_size]) for i in range(0, n, group_size)]
    per = len(units) // world_size
    before = [sum(lengths[r * n // world_size:(r + 1) * n // world_size]) for r in range(world_size)]
    order = sorted(range(len(units)), key=lambda i: -units[i])
    parts: list[list[int]] = [[] for _ in range(world_size)]
    loads = [0] * world_size
    for i in order:
        k = min((k for k in range(world_size) if len(parts[k]) < per), key=lambda k: loads[k])
        parts[k].append(i)
        loads[k] += units[i]
    batch.reorder(torch.tensor([u * group_size + j for p in parts for u in p for j in range(group_size)]))
    return {"training/seqlen_balance_max_over_min": max(loads) / max(1, min(loads)),
            # verl's names: each rank's tokens in the dispatch's split before and after balancing
            "global_seqlen/min": min(before), "global_seqlen/max": max(before),
            "global_seqlen/minmax_diff": max(before) - min(before), "global_seqlen/mean": sum(before) / world_size,
            "global_seqlen/balanced_min": min(loads), "global_seqlen/balanced_max": max(loads)}


class RayPPOTrainer:
    def __init__(self, config: PPOConfig, tokenizer, actor_rollout_wg, critic_wg, reward_fn, val_reward_fn,
                 train_loader, val_dataset, tracker, ckpt_manager, n_gpus: int, memory_timeline=None, plan=None,
                 reward_model=None, startup_metrics: dict | None = None):
        self.config = config
        # logged with the first record: at step 0, or merged into the first step after the resumed one, so a
        # logger never sees a step at or below one it already has (wandb drops such points)
        self.startup_metrics = dict(startup_metrics or {})
        self.tokenizer = tokenizer
        self.actor_rollout_wg, self.critic_wg = actor_rollout_wg, critic_wg
        self.reward_model = reward_model  # RewardModelWorker group or JudgeRewardModel (reward_model.enable), or None
        self.reward_fn, self.val_reward_fn = reward_fn, val_reward_fn
        self.train_loader, self.val_dataset = train_loader, val_dataset
        self.tracker, self.ckpt = tracker, ckpt_manager
        self.n_gpus = n_gpus
        self.memory_timeline = memory_timeline
        self.plan = plan  # logged next to the measured memory: predicted peak per phase (GPU runs)
        self.use_critic = need_critic(config)
        self.use_reference = need_reference(config)
        self.kl_ctrl = get_kl_controller(config.algorithm.kl_ctrl) if config.algorithm.use_kl_in_reward else None
        self.global_steps = 0
        self.total_training_steps = self._total_steps()
        self.history: list[dict] = []
        rm = config.reward_model
        self.reward_guard = RewardErrorGuard(rm.max_error_fraction, rm.error_window_steps)
        partial = plan.rollout.partial if plan is not None else None
        # partial rollouts (the plan's): the groups in flight across steps, and the IS level their update uses
        self.partial = PartialRolloutBuffer(partial, config.actor_rollout_ref.rollout.n) if partial else None
        self.rollout_correction = rollout_correction(config.algorithm.rollout_correction, partial)
        # reward_model.launch_reward_fn_async: the step's scoring, running beside the next passes (PendingReward)
        self._pending_reward: PendingReward | None = None

    def _total_steps(self) -> int:
        t = self.config.trainer
        steps = len(self.train_loader) * t.total_epochs
        if t.total_training_steps is not None:
            steps = t.total_training_steps
        return steps

    def _meta(self) -> dict:
        return {"eos_token_id": self.tokenizer.eos_token_id, "pad_token_id": self.tokenizer.pad_token_id}

    # ------------------------------------------------------------------ validation
    def validate(self) -> dict:
        cfg = self.config
        val = self.val_dataset
        bs = int(cfg.data.val_batch_size or len(val))
        n = cfg.actor_rollout_ref.rollout.val_kwargs.n
        scores, rewards, sources, uids, inputs, outputs, gts = [], [], [], [], [], [], []
        extra: dict[str, list] = {}  # numeric extra info a scorer returned (e.g. {"score", "len"}), as verl reports it
        failed = {"errors": 0, "timeouts": 0, "missing_ground_truths": 0}  # scored 0: reported, never hidden
        rm_counts: dict[str, float] = {}
        turn_stats: list[dict] = []  # multi-turn: each sample's tool-use counts
        for start in range(0, len(val), bs):
            batch = collate_fn([val[i] for i in range(start, min(len(val), start + bs))])
            assign_uids(batch)
            gen = generation_inputs(batch)
            gen.meta_info = {**self._meta(), "validate": True, "seed": validation_sampling_seed(
                cfg.trainer.seed, cfg.actor_rollout_ref.rollout.seed, start // bs)}
            out = self.actor_rollout_wg.generate_sequences(gen)
            out.meta_info.pop("metrics", None)
            batch = attach_rollout(batch, out, n)
            result, rm_metrics, _ = compute_reward(batch, self.val_reward_fn, self.reward_model)
            for key in RM_COUNTS:
                if key in rm_metrics:
                    rm_counts[key] = rm_counts.get(key, 0.0) + rm_metrics[key]
            rewards.extend(result["reward_tensor"].sum(-1).tolist())
            scores.extend(result["scores"])  # the scorer's, without the overlong penalty: acc is accuracy
            for key in failed:
                failed[key] += int(result.get("metrics", {}).get(f"reward/{key}", 0))
            for key, values in result.get("reward_extra_info", {}).items():
                extra.setdefault(key, []).extend(values)
            turn_stats.extend(batch.non_tensor_batch.get("multi_turn_stats", []))
            sources.extend(batch.non_tensor_batch.get("data_source", np.array(["unknown"] * len(batch))).tolist())
            uids.extend(batch.non_tensor_batch["uid"].tolist())
            inputs.extend(self.tokenizer.batch_decode(batch.batch["prompts"], skip_special_tokens=True))
            outputs.extend(self.tokenizer.batch_decode(batch.batch["responses"], skip_special_tokens=True))
            gts.extend(ground_truths(batch.non_tensor_batch, len(batch)))
        if cfg.trainer.validation_data_dir:
            dump_generations(cfg.trainer.validation_data_dir, self.global_steps, inputs, outputs, gts, rewards,
                             {"uid": uids, **{k: v for k, v in extra.items() if len(v) == len(inputs)}})
        # `acc`: the scorer's own "acc" where it gave one for every sample (verl's core variable; e.g. a rule score
        # reported next to a reward model's score), else the score itself
        def per_sample(values) -> bool:  # one number for every sample: reportable as a validation variable
            return values is not None and len(values) == len(scores) and all(
                isinstance(v, (int, float)) for v in values)

        own_acc = extra.pop("acc", None)
        infos = {"acc": [float(v) for v in own_acc] if per_sample(own_acc) else scores, "reward": rewards}
        for key, values in extra.items():
            if key not in infos and per_sample(values):
                infos[key] = values
        metrics = flatten_validation_metrics(process_validation_metrics(sources, uids, infos))
        metrics.update({f"val-aux/reward/{key}": float(v) for key, v in failed.items()})
        metrics.update({f"val-aux/{key}": v for key, v in rm_counts.items()})
        if turn_stats:
            metrics.update({f"val-aux/{key}": v for key, v in multi_turn_stats_metrics(turn_stats).items()})
        k = cfg.trainer.log_val_generations
        if k > 0:
            self.tracker.log_generations(list(zip(inputs[:k], outputs[:k], scores[:k])), self.global_steps)
        return metrics

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self):
        """Save this step's checkpoint; a failed save removes its temporary directory and raises
        CheckpointSaveError naming the cause (checkpoint_manager.CheckpointManager.abort)."""
        step = self.global_steps

        def write(tmp: Path) -> None:
            self.actor_rollout_wg.save_checkpoint(str(tmp / "actor"))
            if self.use_critic:
                self.critic_wg.save_checkpoint(str(tmp / "critic"))
            state = {"global_step": step, "dataloader": self.train_loader.state_dict(),
                     "kl_coef": self.kl_ctrl.value if self.kl_ctrl else None,
                     "reward_errors": self.reward_guard.state_dict()}
            (tmp / "trainer_state.json").write_text(json.dumps(state))
            if self.partial is not None:  # the groups in flight: a resumed run continues them
                torch.save(self.partial.state_dict(), tmp / PARTIAL_STATE_FILE)
            save_resolved_config(tmp, self.config)  # compared with the config of a run that resumes from it

        self.ckpt.save(step, write)

    def load_checkpoint(self) -> int:
        t = self.config.trainer
        path = self.ckpt.resolve_resume(t.resume_mode, t.resume_from_path)
        if path is None:
            return 0
        path = Path(path)
        check_resumable(path, ["actor", "critic"] if self.use_critic else ["actor"])
        check_resume_config(path, self.config)  # refuses settings that conflict with the checkpoint, lists the rest
        state = json.loads((path / "trainer_state.json").read_text())
        self.actor_rollout_wg.load_checkpoint(str(path / "actor"))
        if self.use_critic:
            self.critic_wg.load_checkpoint(str(path / "critic"))
        self.train_loader.load_state_dict(state["dataloader"])
        if self.kl_ctrl is not None and state.get("kl_coef") is not None:
            self.kl_ctrl.value = state["kl_coef"]
        self.reward_guard.load_state_dict(state.get("reward_errors", {}))
        self.global_steps = int(state["global_step"])
        print(f"[hybridrl] resumed from {path} at step {self.global_steps}")
        if self.tracker is not None:
            self.tracker.resumed(self.global_steps)
        self._load_partial_rollouts(path / PARTIAL_STATE_FILE)
        return self.global_steps

    def _load_partial_rollouts(self, file: Path) -> None:
        """The checkpoint's groups in flight; with partial rollouts now off they are dropped, counted in the first
        step's partial/dropped_on_resume and said at once."""
        if not file.is_file():
            return
        state = torch.load(file, map_location="cpu", weights_only=False)  # this run's own file (as the RNG states)
        if self.partial is not None:
            self.partial.load_state_dict(state)
            return
        dropped = len(state["groups"])
        self.startup_metrics["partial/dropped_on_resume"] = float(dropped)
        print(f"[hybridrl] partial rollouts are off: the checkpoint's {dropped} carried prompt groups are dropped")

    # ------------------------------------------------------------------ one step
    def _rollout_and_score(self, batch: DataProto, gen_index: int, balance: bool, metrics: dict, timing: dict,
                           absorb) -> tuple[DataProto, dict]:
        """One generation batch: rollout (and remax's greedy baseline), scores and token_level_rewards. With KL in
        the reward the old and reference log-probs come first (dynamic sampling's seq_final_reward needs the
        penalised rewards before it filters, as in verl). Returns (batch, the reward manager's result); with partial
        rollouts the batch is the groups completed by this step, (None, {}) when none is."""
        cfg = self.config
        n = cfg.actor_rollout_ref.rollout.n
        assign_uids(batch)
        gen = generation_inputs(batch)
        # a fresh sampling seed each step (and generation batch), derived from the step so a resumed run samples
        # what the original did
        seed = step_sampling_seed(cfg.trainer.seed, cfg.actor_rollout_ref.rollout.seed, self.global_steps)
        gen.meta_info = {**self._meta(), "seed": seed if gen_index == 0 else derive_seed(seed, gen_index)}
        if self.partial is not None:
            batch = self._partial_rollout(batch, gen.meta_info, metrics, timing, absorb)
            if batch is None:
                return None, {}
        else:
            with marked_timer("gen", timing):
                out = self.actor_rollout_wg.generate_sequences(gen)
                absorb(out)
            if cfg.algorithm.adv_estimator == "remax":
                with marked_timer("gen_max", timing):
                    gen.meta_info.update({"do_sample": False, "n": 1})
                    base = self.actor_rollout_wg.generate_sequences(gen)
                    base.meta_info.pop("metrics", None)
                    base_batch = batch.select(batch_keys=[], non_tensor_batch_keys=list(batch.non_tensor_batch))
                    base_batch.union(base)
                    baseline = compute_reward(base_batch, self.reward_fn, self.reward_model)[0]["reward_tensor"]
                    batch.batch["reward_baselines"] = baseline.sum(-1)
            batch = attach_rollout(batch, out, n)
        if balance:
            self._balance(batch, metrics)
        if cfg.reward_model.launch_reward_fn_async:   # the config allows it where nothing reads the scores sooner
            self._pending_reward = self._score(batch, metrics, timing, absorb, asynchronous=True)
            return batch, {}
        result = self._score(batch, metrics, timing, absorb)
        if cfg.algorithm.use_kl_in_reward:
            batch = self._old_and_ref_log_probs(batch, timing, absorb)
            with marked_timer("adv", timing):
                batch, kl_metrics = apply_kl_penalty(batch, self.kl_ctrl, cfg.algorithm.kl_penalty,
                                                     policy_key=("rollout_log_probs" if self.rollout_correction.bypass_mode
                                                                 else "old_log_probs"))
                metrics.update(kl_metrics)
        else:
            batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
        return batch, result

    def _score(self, batch: DataProto, metrics: dict, timing: dict, absorb, asynchronous: bool = False):
        """The reward phase: `token_level_scores` in the batch, the reward manager's result returned; reward-model
        counts add up over calls (generation batches of dynamic sampling, parts of an early update). `asynchronous`:
        the reward model scores here, the reward function starts in a thread and its PendingReward is returned
        (`_await_reward` applies it)."""
        with marked_timer("reward", timing):
            if asynchronous:
                rm_metrics, rm_worker = compute_rm_scores(batch, self.reward_model)
                result = PendingReward(self.reward_fn, batch)
            else:
                result, rm_metrics, rm_worker = compute_reward(batch, self.reward_fn, self.reward_model)
                self._apply_scores(batch, result)
            absorb(DataProto(meta_info={"metrics": rm_worker}))
            for key, value in rm_metrics.items():
                metrics[key] = metrics.get(key, 0.0) + value if key in RM_COUNTS else value
        return result

    def _apply_scores(self, batch: DataProto, result: dict) -> None:
        batch.batch["token_level_scores"] = result["reward_tensor"]
        if self.config.trainer.rollout_data_dir:   # the scorer's per-sample extras, for the rollout dumps
            extras = result.get("reward_extra_info") or {}
            batch.non_tensor_batch[REWARD_EXTRAS] = np.array([{k: v[i] for k, v in extras.items()}
                                                              for i in range(len(batch))], dtype=object)

    def _await_reward(self, batch: DataProto, metrics: dict, timing: dict) -> None:
        """The asynchronous reward function's scores into the batch (as rewards: no KL in the reward beside it), its
        metrics, and the reward-failure guard before any update. `timing_s/reward` adds the seconds it scored,
        `timing_s/reward_wait` is what the step waited for it after the passes it ran beside."""
        pending, self._pending_reward = self._pending_reward, None
        result, scored, waited = pending.result()
        timing["reward"] = timing.get("reward", 0.0) + scored
        timing["reward_wait"] = waited
        self._apply_scores(batch, result)
        batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
        self._check_rewards([result.get("metrics", {})], metrics)

    def _check_rewards(self, reward_metrics: list[dict], metrics: dict) -> None:
        """The step's reward counts, summed over its scoring calls, and the reward-failure guard: failed samples were
        scored 0; past the configured share the run stops before any update uses them."""
        metrics.update(merge_reward_metrics(reward_metrics))
        metrics["reward/failed_fraction"] = self.reward_guard.check(self.global_steps, metrics)

    def _partial_rollout(self, batch: DataProto, meta: dict, metrics: dict, timing: dict, absorb) -> DataProto | None:
        """Partial rollouts: the new prompts join the groups in flight, every unfinished sample generates up to the
        step's token budget, and the complete groups this step trains on come back (None: none is complete)."""
        self.partial.add_prompts(batch, self.global_steps)
        requests = self.partial.requests()
        requests.meta_info = meta
        with marked_timer("gen", timing):
            out = self.actor_rollout_wg.continue_sequences(requests)
            absorb(out)
        self.partial.absorb(out, self.global_steps)
        response_length = self.config.actor_rollout_ref.rollout.response_length
        trained, partial_metrics = self.partial.take(self.global_steps, response_length, int(meta["pad_token_id"] or 0))
        metrics.update(partial_metrics)
        return trained

    def _balance(self, batch: DataProto, metrics: dict) -> None:
        # balanced over the actor's data-parallel ranks (Ulysses SP groups share their rows): the plan's train_dp
        group = self.config.actor_rollout_ref.rollout.n if self.plan.actor.share_prompts else 1
        metrics.update(balance_batch(batch, self.plan.layout.train_dp, group))

    def _old_and_ref_log_probs(self, batch: DataProto, timing: dict, absorb) -> DataProto:
        # else the update's own log-probs (the plan), or the rollout's in bypass mode
        if not self.rollout_correction.bypass_mode and (self.plan is None or self.plan.actor.old_log_prob_pass):
            with marked_timer("old_log_prob", timing):
                old = self.actor_rollout_wg.compute_log_prob(batch)
                absorb(old)
                batch.union(old)  # with the entropys, reported once the step's batch is final
        if self.use_reference:
            with marked_timer("ref", timing):
                ref = self.actor_rollout_wg.compute_ref_log_prob(batch)
                absorb(ref)
                batch.union(ref)
        return batch

    def _collect_batch(self, batch: DataProto, more_batches, metrics: dict, timing: dict, absorb) -> DataProto | None:
        """The step's scored batch: one generation batch, or with algorithm.filter_groups as many as it takes to
        collect train_batch_size prompt groups with signal (trainer/dynamic_sampling.py); with partial rollouts the
        groups completed by this step (None when none is). Reward counts are summed over every scored sample, and
        the reward-failure guard sees them before any update."""
        cfg = self.config
        fg = cfg.algorithm.filter_groups
        collector = None
        if fg.enable:
            collector = GroupCollector(cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n,
                                       int(fg.max_num_gen_batches))
        balance = cfg.trainer.balance_batch
        reward_metrics: list[dict] = []
        for gen_index in itertools.count():
            # balancing reorders rows: with filtering it waits for the trimmed batch (groups must stay adjacent)
            part, result = self._rollout_and_score(batch, gen_index, balance and collector is None, metrics,
                                                   timing, absorb)
            if part is None:  # partial rollouts: no group is complete yet, nothing to train this step
                return None
            reward_metrics.append(result.get("metrics", {}))
            if collector is None:
                break
            if collector.add(part, sample_metric(part, fg.metric, result)):
                part, fg_metrics = collector.batch()
                metrics.update(fg_metrics)
                if balance:
                    self._balance(part, metrics)
                break
            batch = next(more_batches, None)
            if batch is None:
                raise RuntimeError("algorithm.filter_groups needs another generation batch but none was given")
        if self._pending_reward is None:   # else _await_reward checks them once the scores are in
            self._check_rewards(reward_metrics, metrics)
        return part

    def _train_on(self, batch: DataProto, metrics: dict, timing: dict, absorb) -> DataProto:
        """The step's phases after the rollout and rewards: old and reference log-probs, values, advantages (with
        the rollout correction), the critic's and the actor's updates. Returns the batch as trained on."""
        cfg = self.config
        rc = self.rollout_correction
        batch.meta_info["global_token_num"] = batch.batch["attention_mask"].sum(-1).tolist()
        batch.meta_info["shuffle_seed"] = shuffle_seed(cfg.trainer.seed, self.global_steps)
        if not cfg.algorithm.use_kl_in_reward:
            batch = self._old_and_ref_log_probs(batch, timing, absorb)
        entropys = batch.batch.pop("entropys", None)
        if entropys is not None:
            actor = cfg.actor_rollout_ref.actor   # aggregated as the actor's loss is, as verl logs it
            metrics["actor/entropy"] = agg_loss(entropys, batch.batch["response_mask"], actor.loss_agg_mode,
                                                loss_scale_factor=actor.loss_scale_factor).item()
        if self.use_critic:
            with marked_timer("values", timing):
                values = self.critic_wg.compute_values(batch)
                absorb(values)
                batch.union(values)
        if self._pending_reward is not None:   # scored beside the passes above
            self._await_reward(batch, metrics, timing)
        batch = self._advantages(batch, metrics, timing)
        if self.use_critic:
            with marked_timer("update_critic", timing):
                absorb(self.critic_wg.update_critic(batch))
        if self.global_steps >= cfg.trainer.critic_warmup:
            with marked_timer("update_actor", timing):
                out = self.actor_rollout_wg.update_actor(batch)
                absorb(out)
            if "old_log_probs" in out.batch:
                # no old-log-prob pass: the update's own log-probs give the same metrics over the whole batch
                batch.batch["old_log_probs"] = out.batch["old_log_probs"]
                metrics.update(own_log_prob_metrics(batch, out.batch["old_log_probs"], rc))
        return batch

    def _advantages(self, batch: DataProto, metrics: dict, timing: dict) -> DataProto:
        """The adv phase: the rollout correction (from the old log-probs, or handed to the actor without them),
        then the estimator's advantages and returns."""
        algo, rc = self.config.algorithm, self.rollout_correction
        with marked_timer("adv", timing):
            if rc.bypass_mode:   # the actor takes the rollout's log-probs as the old ones and corrects per micro-batch
                batch.meta_info["bypass"] = asdict(BypassLoss.of(rc))
            elif "old_log_probs" in batch.batch and "rollout_log_probs" in batch.batch:
                metrics.update(rollout_probs_diff(batch))
                # IS weights and rejection (verl's decoupled mode) change the batch before the advantages
                metrics.update(apply_rollout_correction(batch, rc))
            elif rc.rollout_is is not None:  # no old-log-prob pass: the actor weighs with its own log-probs
                batch.meta_info["rollout_is"] = {"level": rc.rollout_is, "threshold": float(rc.rollout_is_threshold)}
            batch = compute_advantage(batch, algo.adv_estimator, gamma=algo.gamma, lam=algo.lam,
                                      num_repeat=self.config.actor_rollout_ref.rollout.n,
                                      norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo)
            if algo.use_pf_ppo and algo.adv_estimator == "gae":   # PF-PPO: the batch redrawn by score (verl's)
                draw = torch.Generator().manual_seed(derive_seed("pf_ppo", self.config.trainer.seed,
                                                                 self.global_steps))
                batch, pf_metrics = pf_ppo_resample(batch, algo.pf_ppo.reweight_method, algo.pf_ppo.weight_pow, draw)
                metrics.update(pf_metrics)
            return batch

    def train_step(self, batch: DataProto, more_batches: Iterator[DataProto] | None = None) -> dict:
        """One PPO/GRPO step on `batch`; dynamic sampling draws further generation batches from `more_batches`."""
        metrics: dict = {}
        timing: dict = {}
        worker_metrics = StepWorkerMetrics()
        absorb = worker_metrics.absorb
        with marked_timer("step", timing):
            if self.plan is not None and self.plan.actor.early_update:   # the update starts during the rollout
                batch = early_update_step(self, batch, metrics, timing, absorb)
            else:
                batch = self._collect_batch(batch, more_batches or iter(()), metrics, timing, absorb)
                if batch is not None:  # None: partial rollouts with no group complete yet
                    batch = self._train_on(batch, metrics, timing, absorb)
        worker_metrics.fold(metrics, timing)
        # rows the dispatch repeated to make batches divisible (computed on, then dropped): counted, never silent
        padded = sum(getattr(self.actor_rollout_wg, "padded_rows", {}).values())
        for wg in (self.critic_wg, self.reward_model):
            padded += sum(getattr(wg, "padded_rows", {}).values())
        metrics["training/padded_rows_total"] = float(padded)
        if self.plan is not None and any(k.startswith("memory/") for k in metrics):
            metrics.update(self.plan.predicted_peak_gb())  # next to memory/{phase}/peak_allocated_gb
        if batch is None:  # nothing trained (partial rollouts): the timings alone
            metrics.update({f"timing_s/{name}": float(sec) for name, sec in timing.items()})
            return metrics
        if self.config.trainer.rollout_data_dir:
            self._dump_rollout(batch)
        metrics.update(compute_data_metrics(batch, use_critic=self.use_critic))
        metrics.update(compute_timing_metrics(batch, timing))
        metrics.update(compute_throughout_metrics(batch, timing, self.n_gpus))
        metrics.update(compute_floor_metrics(batch, timing, metrics, self.plan, self.n_gpus,
                                             self.config.actor_rollout_ref.actor.ppo_epochs))
        metrics.update(compute_variance_proxy_metrics(batch, metrics.get("actor/grad_norm")))
        return metrics

    def _dump_rollout(self, batch: DataProto) -> None:
        """The step's trained samples to trainer.rollout_data_dir/{step}.jsonl (generation_dump.py)."""
        decode = self.tokenizer.batch_decode
        dump_generations(self.config.trainer.rollout_data_dir, self.global_steps,
                         decode(batch.batch["prompts"], skip_special_tokens=True),
                         decode(batch.batch["responses"], skip_special_tokens=True),
                         ground_truths(batch.non_tensor_batch, len(batch)),
                         batch.batch["token_level_scores"].sum(-1).tolist(),
                         {"uid": batch.non_tensor_batch["uid"].tolist(), **_columns(batch.non_tensor_batch.get(
                             REWARD_EXTRAS, ()))})

    # ------------------------------------------------------------------ loop
    def _generation_batches(self) -> Iterator[DataProto]:
        """The loader's batches across epoch boundaries: a step may draw several (dynamic sampling), and one pass
        over the data may end in the middle of a step."""
        while True:
            yield from self.train_loader

    def fit(self) -> list[dict]:
        cfg = self.config.trainer
        self.load_checkpoint()
        pending = dict(self.startup_metrics)
        if cfg.val_only:   # evaluate the loaded weights and stop
            val = self.validate()
            self.tracker.log({**pending, **val}, step=self.global_steps)
            self.history.append({"training/global_step": self.global_steps, **val})
            return self.history
        if self.global_steps == 0:
            if cfg.val_before_train and self.val_dataset is not None:
                val = self.validate()
                pending.update(val)
                self.history.append({"training/global_step": 0, **val})
            if pending:
                self.tracker.log(pending, step=0)
            pending = {}
        if self.global_steps >= self.total_training_steps:
            print(f"[hybridrl] nothing to train: the run resumed at step {self.global_steps}, already at or past its "
                  f"last step {self.total_training_steps} (trainer.total_training_steps / total_epochs); raise it to "
                  "train on", flush=True)
        # a step bar on interactive terminals only: in log files the console logger's one line per step says it all
        bar = make_progress_bar(self.total_training_steps, min(self.global_steps, self.total_training_steps),
                                disable=not sys.stderr.isatty())
        batches = self._generation_batches()
        while self.global_steps < self.total_training_steps:
            batch = next(batches)
            self.global_steps += 1
            metrics = {**pending, **self.train_step(batch, batches)}
            pending = {}
            last = self.global_steps == self.total_training_steps
            if self.val_dataset is not None and cfg.test_freq > 0 and (self.global_steps % cfg.test_freq == 0 or last):
                timing: dict = {}
                with marked_timer("testing", timing):
                    metrics.update(self.validate())
                metrics["timing_s/testing"] = timing["testing"]
            metrics["training/global_step"] = self.global_steps
            metrics["training/epoch"] = getattr(self.train_loader, "epoch", 0)
            if cfg.save_freq > 0 and (self.global_steps % cfg.save_freq == 0 or last):
                timing = {}
                try:
                    with marked_timer("save_checkpoint", timing):
                        self.save_checkpoint()
                except BaseException:   # the step trained: its metrics are logged before the save's error stops the run
                    self.tracker.log(metrics, step=self.global_steps)
                    raise
                metrics["timing_s/save_checkpoint"] = timing["save_checkpoint"]
            self.tracker.log(metrics, step=self.global_steps)
            if self.memory_timeline is not None:
                self.memory_timeline.record_metrics(self.global_steps, metrics)
            self.history.append(metrics)
            bar.update(1)
        bar.close()
        return self.history
