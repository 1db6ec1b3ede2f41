"""Speculative decoding on vs off: the same engine, prompts, sampling and seeds, one GRPO-shaped rollout
(prompts x n samples, EOS honoured) per run.

Models:
  --model DIR       any HF model directory (e.g. the converted SmolLM2 on examples/smollm2_arith's data, n=8)
  --long-tail       the long-tail random model of benchmarks/long_tail.py (--preset, --response-len, --mean-len;
                    built and calibrated under --workdir on first use, GPU)
  --tiny            a tiny random model (CPU smoke test)
Prompts: --prompts PARQUET (verl schema, chat-rendered with the model's tokenizer), else generated word prompts.
Per variant (off, then on; one untimed warm-up rollout, then --repeat times each, seed = the repeat index) it
reports generated tokens/s, wall time, decode steps, the tail's share of the time, and for speculation verify
steps, draft tokens, the acceptance rate and tokens emitted per drafted sequence-step; with --temperature 0 also
whether the outputs are token-identical. The threshold `max_running_seqs auto` is the run plan's
(resolve_speculative for this device).

  python benchmarks/spec_decode.py --long-tail --preset qwen2.5-1.5b --response-len 4096 --mean-len 1000 \\
      --num-prompts 32 --n 8 --workdir /tmp/hybridrl_long_tail --out OUT.json
  python benchmarks/spec_decode.py --model SMOLLM2_DIR --prompts DATA/train.parquet --num-prompts 64 --n 8 \\
      --max-tokens 256 --out OUT.json
  python benchmarks/spec_decode.py --tiny --num-prompts 4 --n 4 --max-tokens 32 --out /tmp/spec_tiny.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).parent))
import grpo_step  # noqa: E402
import long_tail  # noqa: E402

STAT_KEYS = ("num_decode_steps", "generated_tokens", "tail_time_frac", "running_seqs_mean", "decode_s",
             "decode_floor_s", "spec_verify_steps", "spec_draft_tokens", "spec_accepted_tokens",
             "spec_acceptance_rate", "spec_mean_acceptance_length", "spec_tokens_per_verify_step",
             "spec_discarded_tokens", "schedule_s", "decode_launch_s", "decode_wait_s", "num_lookahead_steps",
             "spec_probe_steps")


def model_and_prompts(a, work: Path) -> tuple[Path, list[list[int]]]:
    if a.long_tail:
        model_dir, _ = long_tail.calibrated_model(a.preset, a.prompt_len, a.response_len, a.mean_len,
                                                  work / "long_tail")
    elif a.tiny:
        from hybridrl.assets.tiny_model import build_tiny_model

        model_dir = work / "tiny"
        if not (model_dir / "config.json").exists():
            build_tiny_model(model_dir, layers=2, hidden=64)
    else:
        model_dir = Path(a.model)
    data = Path(a.prompts) if a.prompts else grpo_step.make_prompts(work / "data", model_dir, a.num_prompts,
                                                                    a.prompt_len)
    prompts = long_tail.chat_prompts(data, model_dir, a.prompt_len, a.num_prompts)
    if len(prompts) < a.num_prompts:
        raise ValueError(f"{data} has {len(prompts)} prompts, fewer than --num-prompts {a.num_prompts}")
    return model_dir, prompts


def engine_for(hf_model, prompts, a, device: str, speculative):
    from hybridrl.rollout.config import EngineConfig
    from hybridrl.rollout.engine import LLMEngine

    longest = max(map(len, prompts)) + a.max_tokens + 1
    gen = hf_model.generation_config
    eos = gen.eos_token_id if gen.eos_token_id is not None else hf_model.config.eos_token_id
    sizes = dict(gpu_memory_utilization=a.gpu_memory_utilization) if device == "cuda" else dict(
        num_kv_blocks=len(prompts) * a.n * (-(-longest // 16)) + 16)
    config = EngineConfig(dtype=hf_model.dtype, max_num_seqs=len(prompts) * a.n, max_model_len=longest,
                          max_num_batched_tokens=max(8192, longest), async_scheduling=device == "cuda",
                          eos_token_ids=tuple(eos) if isinstance(eos, list) else (eos,), speculative=speculative,
                          **sizes)
    engine = LLMEngine(hf_model.config, config, device=device)
    engine.wake_up(("weights",))
    engine.load_weights(hf_model.state_dict().items())
    engine.wake_up(("kv_cache",))
    return engine


def run(engine, prompts, a, seed: int, device: str) -> tuple[dict, list]:
    from hybridrl.rollout.sampling_params import SamplingParams

    params = SamplingParams(n=a.n, temperature=a.temperature, top_p=a.top_p, top_k=a.top_k,
                            max_tokens=a.max_tokens, seed=seed)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    outs = engine.generate(prompts, params)
    sync()
    wall = time.perf_counter() - t0
    lengths = [len(c.token_ids) for o in outs for c in o.outputs]
    rec = {"wall_s": wall, "tokens_per_s": sum(lengths) / wall, "mean_len": statistics.mean(lengths),
           "max_len": max(lengths), "at_limit_frac": sum(n == a.max_tokens for n in lengths) / len(lengths),
           **{k: engine.stats[k] for k in STAT_KEYS if k in engine.stats}}
    return rec, [c.token_ids for o in outs for c in o.outputs]


def summary(runs: list[dict]) -> dict:
    out = {}
    for key in runs[0]:
        vals = [r[key] for r in runs]
        out[key] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model")
    src.add_argument("--long-tail", action="store_true")
    src.add_argument("--tiny", action="store_true")
    p.add_argument("--preset", default="qwen2.5-1.5b")
    p.add_argument("--response-len", type=int, default=4096, help="--long-tail: the model's length limit")
    p.add_argument("--mean-len", type=float, default=1000.0)
    p.add_argument("--prompts", help="verl-schema parquet (default: generated word prompts)")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=None, help="default: --response-len")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--num-draft-tokens", type=int, default=4)
    p.add_argument("--min-match", type=int, default=2)
    p.add_argument("--max-match", type=int, default=4)
    p.add_argument("--max-running-seqs", default="auto")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--workdir", default="/tmp/hybridrl_spec_decode")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    a.max_tokens = a.max_tokens or a.response_len
    from transformers import AutoModelForCausalLM

    from hybridrl.config.sections.rollout import SpeculativeDecodingConfig
    from hybridrl.plan.rollout_plan import resolve_speculative
    from hybridrl.plan.run_plan import DeviceSpec, local_device

    device = "cuda" if torch.cuda.is_available() else "cpu"
    spec_device = (local_device(SimpleNamespace(trainer=SimpleNamespace(device=device))) if device == "cuda"
                   else DeviceSpec("cpu", "cpu", None))
    choices: list[str] = []
    section = {"enable": True, "num_draft_tokens": a.num_draft_tokens, "min_match": a.min_match,
               "max_match": a.max_match,
               "max_running_seqs": a.max_running_seqs if a.max_running_seqs == "auto" else int(a.max_running_seqs)}
    spec_on = resolve_speculative(SpeculativeDecodingConfig(**section), spec_device, choices)
    spec_off = resolve_speculative(SpeculativeDecodingConfig(**{**section, "enable": False}), spec_device, [])
    work = Path(a.workdir)
    model_dir, prompts = model_and_prompts(a, work)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    result = {"command": "python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])]), "model": str(model_dir),
              "device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
              "prompts": len(prompts), "n": a.n, "max_tokens": a.max_tokens, "temperature": a.temperature,
              "speculative": vars(spec_on), "choices": choices}
    outputs = {}
    for name, spec in (("off", spec_off), ("on", spec_on)):
        engine = engine_for(hf_model, prompts, a, device, spec)
        # one untimed rollout first: kernel compilation and CUDA graph capture would otherwise land in the first
        # variant's first run (on SmolLM2 a + b: 20k tokens/s against 47-64k warm), faking a speed-up for the second
        warmup, _ = run(engine, prompts, a, a.repeat, device)
        runs = []
        for seed in range(a.repeat):
            rec, outputs[name, seed] = run(engine, prompts, a, seed, device)
            print(f"[spec_decode] {name} seed {seed}: " + json.dumps(rec), flush=True)
            runs.append(rec)
        engine.sleep()
        del engine
        result[name] = {"warmup_wall_s": warmup["wall_s"], "runs": runs, "summary": summary(runs)}
    on, off = result["on"]["summary"], result["off"]["summary"]
    result["speedup_tokens_per_s"] = on["tokens_per_s"]["median"] / off["tokens_per_s"]["median"]
    result["decode_steps_ratio"] = on["num_decode_steps"]["median"] / off["num_decode_steps"]["median"]
    if a.temperature == 0:
        result["greedy_identical"] = all(outputs["on", s] == outputs["off", s] for s in range(a.repeat))
    print(f"[spec_decode] tokens/s on/off {result['speedup_tokens_per_s']:.3f}, decode steps on/off "
          f"{result['decode_steps_ratio']:.3f}, acceptance {on.get('spec_acceptance_rate', {}).get('median')}",
          flush=True)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str))
    return result


if __name__ == "__main__":
    main()
