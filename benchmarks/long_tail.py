"""The long-tail workload: a random-weight model of a real shape whose responses end at EOS after long-tailed
lengths, then GRPO steps on it through the whole trainer (benchmarks/grpo_step.py, EOS honoured).

How the lengths get a tail: a random-weight model gives EOS about the same tiny probability as any other of its
152k tokens, so nothing would stop before the limit. Scaling EOS's output-embedding row by s gives EOS's logit s
times the spread of the others' (the input embedding is the same row where the embeddings are tied; prompts hold
EOS only as the chat template's turn end), so the per-step stop probability varies with the context: some
responses end early, some run to the limit. s is calibrated so the mean response length is --mean-len:
1. the engine samples 64 responses of the unscaled model with EOS ignored (the same distribution as the scaled
   model's conditioned on not stopping — scaling one logit leaves the others' ratios unchanged);
2. one HF forward over each gives, per position, EOS's logit a_t and the log-sum-exp of all others' c_t;
3. the stop probability at t under s is sigmoid(s a_t - c_t), so each response's survival curve, and the mean
   length and the share reaching the limit, follow for any s; s is found by bisection.
The run's own response-length metrics then report the distribution obtained.

  python benchmarks/long_tail.py --preset qwen2.5-1.5b --response-len 4096 --mean-len 1000 --out OUT.json \
      [--calibrate-only] [grpo_step.py options, e.g. --defaults --prompts 32 --n 8 --steps 3 --variants hybrid]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import grpo_step  # noqa: E402

CALIBRATION_ROWS = 64


def chat_prompts(data: Path, model_dir: Path, prompt_len: int, rows: int) -> list[list[int]]:
    """The first `rows` prompts of a verl-schema parquet, chat-rendered and tokenized, the last prompt_len tokens."""
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    table = pq.read_table(data).to_pylist()[:rows]
    texts = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in table]
    return [tok(t, add_special_tokens=False).input_ids[-prompt_len:] for t in texts]


@torch.no_grad()
def eos_logit_stats(model_dir: Path, prompts: list[list[int]], response_len: int, eos: int):
    """(a [rows, R], c [rows, R]): EOS's logit and the log-sum-exp of the other logits at every response position
    of responses sampled with EOS ignored."""
    from transformers import AutoModelForCausalLM

    from hybridrl.rollout.config import EngineConfig
    from hybridrl.rollout.engine import LLMEngine
    from hybridrl.rollout.sampling_params import SamplingParams

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
    longest = max(map(len, prompts)) + response_len + 1
    config = EngineConfig(dtype=torch.bfloat16, max_num_seqs=len(prompts), max_model_len=longest,
                          max_num_batched_tokens=max(8192, longest), gpu_memory_utilization=0.4,
                          eos_token_ids=(eos,))
    engine = LLMEngine(model.config, config, device="cuda")
    engine.wake_up(("weights",))
    engine.load_weights(model.state_dict().items())
    outs = engine.generate(prompts, SamplingParams(n=1, temperature=1.0, max_tokens=response_len, ignore_eos=True,
                                                   seed=0))
    engine.sleep()
    a_rows, c_rows = [], []
    for p, o in zip(prompts, outs):
        ids = torch.tensor([p + o.outputs[0].token_ids], device="cuda")
        logits = model(ids).logits[0, len(p) - 1:-1].float()  # the positions that predict the response
        a = logits[:, eos].clone()
        logits[:, eos] = float("-inf")
        a_rows.append(a.cpu())
        c_rows.append(torch.logsumexp(logits, -1).cpu())
        del logits
    del model
    torch.cuda.empty_cache()
    return torch.stack(a_rows).double(), torch.stack(c_rows).double()


def length_stats(a: torch.Tensor, c: torch.Tensor, s: float) -> dict:
    """Expected lengths under EOS scale s: per response, P(length >= t) = prod_{u<t} (1 - stop_u)."""
    stop = torch.sigmoid(s * a - c)
    survive = torch.cumprod(1 - stop, dim=1)
    alive_before = torch.cat([torch.ones_like(survive[:, :1]), survive[:, :-1]], 1)  # P(length >= t + 1)
    lengths = alive_before.sum(1)                   # E[length] per response (the limit R counts as R)
    at_limit = survive[:, -1]
    return {"eos_scale": s, "mean_len": float(lengths.mean()), "reach_limit_frac": float(at_limit.mean()),
            "per_row_mean_len_p10_p50_p90": [float(x) for x in lengths.quantile(torch.tensor(
                [0.1, 0.5, 0.9], dtype=lengths.dtype))]}


def calibrate(a, c, mean_len: float) -> dict:
    lo, hi = 0.0, 64.0  # the mean length falls as s grows (for a spread with positive mass above c)
    for _ in range(60):
        mid = (lo + hi) / 2
        if length_stats(a, c, mid)["mean_len"] > mean_len:
            lo = mid
        else:
            hi = mid
    return length_stats(a, c, (lo + hi) / 2)


def scale_eos_row(model_dir: Path, eos: int, s: float) -> list[str]:
    """Multiply row `eos` of the output embedding by s: `lm_head.weight`, or the input embedding where the config
    ties the two (then it is the same row). Whichever shard file holds it; the other embedding is left alone."""
    from safetensors.torch import load_file, save_file

    tied = json.loads((model_dir / "config.json").read_text()).get("tie_word_embeddings", False)
    name = "model.embed_tokens.weight" if tied else "lm_head.weight"
    changed = []
    for f in sorted(model_dir.glob("*.safetensors")):
        tensors = load_file(str(f))
        if name in tensors:
            tensors[name][eos] *= s
            changed.append(name)
            save_file(tensors, str(f), metadata={"format": "pt"})
    if changed != [name]:
        raise ValueError(f"{model_dir}: expected one shard holding {name}, found {len(changed)}")
    return changed


def calibrated_model(preset: str, prompt_len: int, response_len: int, mean_len: float, work: Path,
                     rows: int = CALIBRATION_ROWS, eos_scale: float | None = None):
    """(model dir, calibration record) of the long-tail model of `preset`, built and calibrated under `work` on the
    first call (GPU), read back afterwards. With `eos_scale` (a scale an earlier calibration of the same preset,
    seed and lengths found) the model is built with it and the sampling pass is skipped."""
    from transformers import AutoTokenizer

    from hybridrl.assets.tiny_model import write_size_preset

    model_dir = work / "models" / f"{preset}-eos{int(mean_len)}-r{response_len}"
    record = model_dir / "long_tail_calibration.json"
    t0 = time.time()
    if not record.exists():
        write_size_preset(model_dir, preset, weights=True)
        data = grpo_step.make_prompts(work / "data", model_dir, 256, prompt_len)
        eos = AutoTokenizer.from_pretrained(model_dir).eos_token_id
        prompts = chat_prompts(data, model_dir, prompt_len, rows)
        if eos_scale is None:
            stats_a, stats_c = eos_logit_stats(model_dir, prompts, response_len, eos)
            cal = calibrate(stats_a, stats_c, mean_len)
            cal.update(calibration_rows=rows, logit_spread={"eos_std": float(stats_a.std()),
                                                            "others_lse_mean": float(stats_c.mean())})
        else:
            cal = {"eos_scale": eos_scale, "given": True}
        cal["rows_changed"] = scale_eos_row(model_dir, eos, cal["eos_scale"])
        cal.update(eos_token_id=eos, seconds=time.time() - t0)
        record.write_text(json.dumps(cal, indent=1))
    cal = json.loads(record.read_text())
    print("[long_tail] calibration", json.dumps(cal), flush=True)
    return model_dir, cal


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="qwen2.5-1.5b")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--response-len", type=int, default=4096)
    p.add_argument("--mean-len", type=float, default=1000.0)
    p.add_argument("--workdir", default="/tmp/hybridrl_long_tail")
    p.add_argument("--calibrate-only", action="store_true")
    p.add_argument("--calibration-rows", type=int, default=CALIBRATION_ROWS,
                   help="responses sampled (EOS ignored) to calibrate the EOS scale; fewer at long limits and large "
                        "models, where each runs to the limit")
    p.add_argument("--eos-scale", type=float, default=None,
                   help="build the model with this EOS scale instead of calibrating: the eos_scale of a calibration "
                        "record of the same preset and lengths made by this tree's weight generator (the 7B / 16k "
                        "record reproduces its scale exactly; the 1.5B calibration.json predates the generator and "
                        "gives responses of ~60 tokens)")
    p.add_argument("--out", required=True)
    a, rest = p.parse_known_args(argv)
    work = Path(a.workdir)
    model_dir, cal = calibrated_model(a.preset, a.prompt_len, a.response_len, a.mean_len, work,
                                      a.calibration_rows, a.eos_scale)
    out = Path(a.out)
    if a.calibrate_only:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"calibration": cal}, indent=1))
        return
    result = grpo_step.main([f"--preset=dir:{model_dir}", f"--prompt-len={a.prompt_len}",
                             f"--response-len={a.response_len}", "--keep-eos", f"--workdir={work}",
                             f"--out={out}", *rest])
    result["calibration"] = cal
    result["command"] = "python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])])
    out.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
