"""One GRPO step on the real SmolLM2-135M-Instruct through the hybrid engine (FSDP actor on one gloo rank → resharded
into the native engine → sampled group rollout → last-integer reward → GRPO advantages → actor update), with the
example recipe's data and reward. Checks: the engine's sampling log-probs equal the actor's (the reshard delivered
the actor's weights), the update raises the log-prob of above-average samples, and the next rollout runs on the
updated weights."""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "smollm2_arith"
PROMPTS, N, MAX_TOKENS, TEMPERATURE = 2, 4, 32, 0.8


def _rollout(hybrid, dataset, prompts, seed):
    from hybridrl.rollout.sampling_params import SamplingParams
    from hybridrl.rollout.to_dataproto import outputs_to_dataproto

    params = SamplingParams(n=N, temperature=TEMPERATURE, max_tokens=MAX_TOKENS, seed=seed)
    with hybrid.rollout({}) as engine:
        outs = engine.generate(list(prompts.non_tensor_batch["raw_prompt_ids"]), params)
    data = outputs_to_dataproto(prompts, outs, response_length=MAX_TOKENS, pad_token_id=dataset.pad_token_id)
    data.meta_info.update(temperature=TEMPERATURE, micro_batch_size=PROMPTS * N)
    return data


def _scores(data, tokenizer, reward):
    mask = data.batch["response_mask"].bool()
    texts = [tokenizer.decode(r[m]) for r, m in zip(data.batch["responses"], mask)]
    truths = [rm["ground_truth"] for rm in data.non_tensor_batch["reward_model"]]
    scores = torch.tensor([reward("smollm2_add", t, g) for t, g in zip(texts, truths)])
    token_level = torch.zeros(mask.shape)
    token_level[torch.arange(len(scores)), mask.sum(1) - 1] = scores  # verl: the reward sits on the last token
    return scores, token_level


def _grpo_step(model_dir, data_dir, reward, q):
    import numpy as np
    import transformers

    from hybridrl.algorithms.advantages import compute_grpo_outcome_advantage
    from hybridrl.data.rl_dataset import RLHFDataset, collate_fn
    from hybridrl.hybrid.engine import HybridEngine
    from hybridrl.hybrid.meshes import build_rollout_mesh
    from hybridrl.rollout.engine import LLMEngine
    from hybridrl.training import DataParallelPPOActor
    from hybridrl.training.fsdp import build_fsdp_model, build_training_mesh

    torch.set_num_threads(2)
    dist.init_process_group("gloo", init_method=f"file://{data_dir}/store", rank=0, world_size=1)
    try:
        cpu = torch.device("cpu")
        tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        dataset = RLHFDataset(str(Path(data_dir) / "train.parquet"), tokenizer, {"max_prompt_length": 64})
        prompts = collate_fn([dataset[i] for i in range(PROMPTS)])
        prompts.non_tensor_batch["uid"] = np.array([str(i) for i in range(PROMPTS)], dtype=object)
        module = build_fsdp_model({"path": str(model_dir), "use_remove_padding": True}, {},
                                  build_training_mesh(1, -1, "cpu"), cpu)
        optimizer = torch.optim.AdamW(module.parameters(), lr=1e-5)
        engine = LLMEngine(transformers.AutoConfig.from_pretrained(model_dir),
                           tp_group=build_rollout_mesh("cpu", 1, 1).get_group("infer_tp"), device="cpu",
                           dtype=torch.float32, max_model_len=128, max_num_batched_tokens=512, num_kv_blocks=64,
                           block_size=16, eos_token_id=tokenizer.eos_token_id)
        hybrid = HybridEngine(module, optimizer, engine, device=cpu, dtype=torch.float32)
        actor = DataParallelPPOActor(dict(ppo_mini_batch_size=PROMPTS * N, ppo_micro_batch_size_per_gpu=PROMPTS * N,
                                          ppo_epochs=1, clip_ratio=0.2, loss_agg_mode="token-mean", grad_clip=1.0,
                                          entropy_coeff=0.0, use_kl_loss=False, use_dynamic_bsz=False),
                                     module, optimizer, use_remove_padding=True)

        data = _rollout(hybrid, dataset, prompts, seed=0)
        scores, token_level = _scores(data, tokenizer, reward)
        mask = data.batch["response_mask"].bool()
        old = actor.compute_log_prob(data)[0]
        rollout_gap = (old - data.batch["rollout_log_probs"])[mask].abs().max().item()
        adv, _ = compute_grpo_outcome_advantage(token_level, mask.float(), data.non_tensor_batch["uid"])
        data.batch.update(old_log_probs=old, advantages=adv)
        hybrid.before_update()
        update = actor.update_policy(data)
        hybrid.after_update()
        new = actor.compute_log_prob(data)[0]
        gain = (adv * (new - old))[mask].sum().item()  # > 0: likelier above-average samples, rarer below-average
        again = _rollout(hybrid, dataset, prompts, seed=1)
        again_gap = (actor.compute_log_prob(again)[0] - again.batch["rollout_log_probs"])[
            again.batch["response_mask"].bool()].abs().max().item()
        eos_ends = [int(r[m][-1]) == tokenizer.eos_token_id for r, m in zip(data.batch["responses"], mask)]
        q.put(dict(scores=scores.tolist(), rollout_gap=rollout_gap, gain=gain, again_gap=again_gap,
                   moved=(new - old)[mask].abs().max().item(), update=update, eos_ends=eos_ends, error=None))
    except Exception:  # report instead of hanging the parent
        import traceback

        q.put(dict(error=traceback.format_exc()))
    finally:
        dist.destroy_process_group()


def test_one_grpo_step_on_smollm2_through_the_hybrid_engine(smollm2_dir, smollm2_add_task, tmp_path):
    from hybridrl.rewards.custom import load_custom_reward_function

    task = smollm2_add_task  # one-digit sums: the model gets some right, some not
    task.write_task(task.TASK, tmp_path, 16, 0, seed=0, knobs={"low": 1, "high": 9})
    reward = load_custom_reward_function(EXAMPLE / "reward.py")  # as the recipe's custom_reward_function.path
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_grpo_step, args=(smollm2_dir, tmp_path, reward, q))
    proc.start()
    r = q.get(timeout=400)
    proc.join(timeout=60)
    assert r["error"] is None, r["error"]
    assert r["rollout_gap"] < 1e-3, "engine log-probs differ from the actor's: the reshard did not deliver its weights"
    groups = torch.tensor(r["scores"]).view(PROMPTS, N)
    assert ((groups.max(1).values - groups.min(1).values) > 0).any(), f"no group with mixed rewards: {groups}"
    assert all(torch.isfinite(torch.tensor(v)) for k, v in r["update"].items() if k.startswith("actor/"))
    assert r["moved"] > 0 and r["gain"] > 0, "the GRPO update did not favour the above-average samples"
    assert r["again_gap"] < 1e-3 < r["moved"] / 100, "the next rollout did not run on the updated weights"
    assert any(r["eos_ends"]), "no sampled answer ended at <|im_end|>"
