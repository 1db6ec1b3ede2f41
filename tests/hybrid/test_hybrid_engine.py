"""The 3D-HybridEngine on 2 gloo ranks with TP=2: FSDP shards are resharded into the TP engine every rollout.

Checks (issue 7): greedy outputs after resharding equal the unsharded actor's (HF generate on the full model);
after an actor update the next rollout uses the new weights (outputs change and equal HF generate on the updated
full weights); the engine sleeps between rollouts and the bytes received per rank are those of the TP slice.
"""

import socket
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from gloo_ranks import end_process_group
from typed_sections import FP32_MASTERS, model_source

PROMPTS = [[5, 17, 33, 2, 9], [44, 3, 12], [7, 7, 7, 7, 7, 7, 7]]
NEW_TOKENS = 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(worker, rank, world, port, arg, q) -> None:
    """Runs one rank's worker, then leaves with os._exit once its results are flushed: exit 0 when the worker
    returned, 1 when it raised. The interpreter's own teardown is skipped on purpose: with gloo's threads still
    alive it can abort a process that finished its work ("terminate called without an active exception")."""
    import os
    import traceback

    code = 1
    try:
        worker(rank, world, port, arg, q)
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        q.close()
        q.join_thread()
        os._exit(code)


def run_two_ranks(worker, arg, timeout_s: float = 120) -> list:
    """worker(rank, 2, port, arg, queue) on 2 spawned processes; their queued results sorted by rank (each rank's
    result waited for at most `timeout_s`)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(worker, r, 2, port, arg, q)) for r in range(2)]
    for p in procs:
        p.start()
    results = sorted((q.get(timeout=timeout_s) for _ in procs), key=lambda r: r[0])
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


def make_model_dir(path: Path) -> Path:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=96, max_position_embeddings=128,
                                   tie_word_embeddings=False, eos_token_id=None)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.save_pretrained(path)
    return path


def hf_greedy(model, prompts):
    out = []
    for p in prompts:
        ids = torch.tensor([p])
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
        out.append(gen[0, len(p):].tolist())
    return out


def actor_update(module, optimizer, hybrid) -> None:
    """One actor update: push the log-prob of arbitrary tokens up, with a step large enough to change greedy paths."""
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    loss = -torch.log_softmax(module(input_ids=ids).logits.float(), -1)[0, :-1].gather(1, ids[0, 1:, None]).mean()
    loss.backward()
    optimizer.step()
    hybrid.after_update()


def _worker(rank, world, port, model_dir, q):
    import transformers
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from hybridrl.hybrid.engine import HybridEngine
    from hybridrl.hybrid.meshes import build_rollout_mesh
    from hybridrl.rollout.config import EngineConfig
    from hybridrl.rollout.engine import LLMEngine
    from hybridrl.rollout.sampling_params import SamplingParams
    from hybridrl.training.fsdp import build_fsdp_model, build_training_mesh

    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        mesh = build_training_mesh(world, -1, "cpu")
        module = build_fsdp_model(model_source(model_dir), FP32_MASTERS, mesh, torch.device("cpu"))
        optimizer = torch.optim.SGD(module.parameters(), lr=5.0)
        rollout_mesh = build_rollout_mesh("cpu", world, world)
        hf_config = transformers.AutoConfig.from_pretrained(model_dir)
        config = EngineConfig(dtype=torch.float32, max_model_len=32, max_num_batched_tokens=64, num_kv_blocks=32,
                              block_size=4)
        engine = LLMEngine(hf_config, config, tp_group=rollout_mesh.get_group("infer_tp"), device="cpu")
        hybrid = HybridEngine(module, optimizer, engine, device=torch.device("cpu"), dtype=torch.float32)
        greedy = SamplingParams(n=1, temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)

        def rollout():
            metrics = {}
            with hybrid.rollout(metrics) as e:
                outs = e.generate(PROMPTS, greedy)
            return [o.outputs[0].token_ids for o in outs], metrics

        def full_model():
            state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True))
            ref = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
            ref.load_state_dict(state)
            return ref.eval()

        before, metrics = rollout()
        want_before = hf_greedy(full_model(), PROMPTS)
        awake_after_sleep = engine.runner.weights_awake

        actor_update(module, optimizer, hybrid)

        after, _ = rollout()
        want_after = hf_greedy(full_model(), PROMPTS)
        q.put((rank, before, want_before, after, want_after, metrics, awake_after_sleep, None))
    except Exception:  # report instead of hanging the parent
        import traceback

        q.put((rank, None, None, None, None, None, None, traceback.format_exc()))
    finally:
        end_process_group()


def test_hybrid_engine_reshards_and_follows_updates():
    with tempfile.TemporaryDirectory() as tmp:
        results = run_two_ranks(_worker, make_model_dir(Path(tmp) / "model"), timeout_s=240)
    for rank, before, want_before, after, want_after, metrics, awake, err in results:
        assert err is None, f"rank {rank}:\n{err}"
        assert before == want_before, f"rank {rank}: engine after resharding differs from the unsharded actor"
        assert after == want_after, f"rank {rank}: next rollout does not use the updated weights"
        assert after != before, "the update did not change the greedy outputs; the test would prove nothing"
        assert not awake, "the hybrid engine must sleep the rollout engine (free its weights) after the rollout"
        assert metrics["reshard/bytes_received_gb"] > 0 and metrics["timing_s/reshard"] > 0
        parts = {k: v for k, v in metrics.items() if k.startswith("timing_s/switch_to_rollout/")}
        assert set(parts) == {f"timing_s/switch_to_rollout/{p}" for p in
                              ("release_training_cache", "wake_weights", "reshard", "wake_kv")}
        assert 0 < sum(parts.values()) <= metrics["timing_s/switch_to_rollout"]
        assert {"timing_s/switch_to_train/sleep", "timing_s/switch_to_train/release_engine_cache"} <= set(metrics)
    # both TP ranks of the single group must produce identical tokens
    assert results[0][1] == results[1][1] and results[0][3] == results[1][3]


def test_optimizer_reload_before_the_update_is_timed():
    """The state offloaded for the rollout comes back at the update's start, timed in the update's metrics."""
    from hybridrl.hybrid.engine import HybridEngine

    param = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.AdamW([param])
    param.grad = torch.ones(4)
    opt.step()
    hybrid = object.__new__(HybridEngine)   # only what before_update reads
    hybrid.optimizer, hybrid.device, hybrid._optimizer_on_cpu = opt, torch.device("cpu"), True
    metrics = {}
    hybrid.before_update(metrics)
    assert set(metrics) == {"timing_s/switch_to_train/load_optimizer"} and metrics[
        "timing_s/switch_to_train/load_optimizer"] >= 0
    assert not hybrid._optimizer_on_cpu
    hybrid.before_update(metrics := {})   # nothing offloaded: nothing to time
    assert metrics == {}
