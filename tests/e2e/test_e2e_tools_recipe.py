"""examples/smollm2_tools end to end on CPU with the tiny model: the recipe's chat template renders tools, tool calls
and tool messages the way the multi-turn agent parses and appends them; its SFT data (make_sft_data.py) trains
only the assistant's tokens; one multi-turn GRPO step from the SFT model reports the tool metrics, validation
included."""

import importlib.util
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoTokenizer

import hybridrl.trainer.ppo_trainer as ppo_trainer
from hybridrl.config.loader import load_config
from hybridrl.data.tasks import make_dataset
from hybridrl.rollout.multi_turn import MultiTurnSettings, ToolAgent
from hybridrl.rollout.tool_parser import parse_hermes
from hybridrl.tools.registry import load_tool_config
from hybridrl.trainer.launch import run_ppo
from hybridrl.trainer.sft_trainer import collate, load_sft_config, read_rows, run_sft, tokenize_examples

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "examples" / "smollm2_tools"
TEMPLATE = RECIPE / "chat_template.jinja"
TOOLS = ROOT / "examples" / "multiturn_calculator" / "tool_config.yaml"  # the recipe's tool config (run.sh)
# SmolLM2-135M-Instruct's own chat template (its tokenizer_config.json): what the recipe's renders without tools
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


@pytest.fixture(scope="module")
def recipe(tmp_path_factory, tiny_model_dir):
    """The recipe's data (bignum 6-9 digits, as run.sh makes it, fewer rows) and SFT conversations."""
    root = tmp_path_factory.mktemp("tools_recipe")
    make_dataset("bignum", root / "data", n_train=8, n_test=2, seed=0, min_digits=6, max_digits=9)
    spec = importlib.util.spec_from_file_location("smollm2_tools_make_sft_data", RECIPE / "make_sft_data.py")
    make_sft = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_sft)
    sft_file = make_sft.main(["--data", str(root / "data" / "train.parquet"), "--tools", str(TOOLS),
                              "--out", str(root / "sft.parquet"), "--rows", "4"])
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = TEMPLATE.read_text()
    return SimpleNamespace(root=root, sft_file=sft_file, tok=tok,
                           rows=pq.read_table(root / "data" / "train.parquet").to_pylist())


def test_template_renders_tools_calls_and_answers_as_the_agent_parses_and_appends_them(recipe, tmp_path):
    tok, row = recipe.tok, recipe.rows[0]
    expr, product = row["extra_info"]["expression"], row["reward_model"]["ground_truth"]
    tools = [t.schema for t in load_tool_config(TOOLS).values()]
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expr}}}
    convo = [*row["prompt"], {"role": "assistant", "content": "", "tool_calls": [call]},
             {"role": "tool", "content": product}, {"role": "assistant", "content": f"#### {product}"}]
    text = tok.apply_chat_template(convo, tools=tools, tokenize=False)
    system, user = row["prompt"][0]["content"], row["prompt"][1]["content"]
    call_text = f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{expr}"}}}}\n</tool_call>'
    assert text == (f"<|im_start|>system\n{system}\n\n# Tools\n\nYou may call one or more functions to assist with "
                    "the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n"
                    f"<tools>\n{json.dumps(tools[0])}\n</tools>\n\nFor each function call, return a json object with "
                    "function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
                    f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n{call_text}<|im_end|>\n"
                    f"<|im_start|>user\n<tool_response>\n{product}\n</tool_response><|im_end|>\n"
                    f"<|im_start|>assistant\n#### {product}<|im_end|>\n")
    # the agent's parser finds the call in the assistant text the template wrote
    assert [(c.name, c.arguments, c.error) for c in parse_hermes(call_text)] == [("calculator", {"expression": expr},
                                                                                 None)]
    # without tools: SmolLM2's own rendering, default system prompt included
    smol = AutoTokenizer.from_pretrained(tok.name_or_path)
    smol.chat_template = SMOLLM2_TEMPLATE
    for messages in (row["prompt"], row["prompt"][1:], convo[:2] + [{"role": "assistant", "content": "hi"}]):
        for gen in (True, False):
            assert (tok.apply_chat_template(messages, add_generation_prompt=gen, tokenize=False) ==
                    smol.apply_chat_template(messages, add_generation_prompt=gen, tokenize=False))

    # the agent, given the model's call (the turn ends at </tool_call>), runs the calculator and appends exactly
    # the ids between the call and the answer in the recipe's SFT data: rollout and SFT see the same sequence
    agent = ToolAgent(tok, load_tool_config(TOOLS), MultiTurnSettings(), eos_token_ids=[tok.eos_token_id])
    try:
        sft = tokenize_examples(read_rows(str(recipe.sft_file), _sft_cfg(recipe, tmp_path).data), tok, 4096,
                                "error")[0][0]
        prompt, response, mask = sft
        turn1 = tok.encode(call_text, add_special_tokens=False)
        seq = SimpleNamespace(token_ids=prompt + turn1, turn_start=len(prompt), agent_state=None, request_id=0)
        assert agent.ends_turn(seq)
        appended = agent.on_turn_end(seq, budget=1000).result(timeout=30).token_ids
        turn2 = tok.encode(f"#### {product}", add_special_tokens=False) + [tok.eos_token_id]
        assert response == turn1 + appended + turn2
        assert seq.agent_state.tool_calls == 1 and seq.agent_state.tool_errors == 0
    finally:
        agent.close()


def _sft_cfg(recipe, tmp_path, steps: int = 3):
    """run.sh's SFT keys (multi-turn rows, the recipe's template) at test size; fp32 and no packing: fast on CPU."""
    return load_sft_config(overrides=[
        f"data.train_files={recipe.sft_file}", "data.multiturn.enable=true", f"model.custom_chat_template={TEMPLATE}",
        f"model.partial_pretrain={recipe.tok.name_or_path}", "data.max_length=1024", "data.train_batch_size=4",
        "data.micro_batch_size_per_gpu=2", "optim.lr=1e-2", "optim.lr_scheduler=constant",
        "optim.warmup_steps_ratio=0", f"trainer.total_training_steps={steps}", "trainer.device=cpu",
        "trainer.log_freq=0", "model.use_remove_padding=false", "model.fsdp_config.mixed_precision.param_dtype=fp32",
        f"trainer.default_local_dir={tmp_path / 'sft'}"])


def test_sft_data_trains_only_the_assistant_tokens(recipe, tmp_path):
    tok = recipe.tok
    examples, truncated = tokenize_examples(read_rows(str(recipe.sft_file), _sft_cfg(recipe, tmp_path).data), tok,
                                            4096, "error")
    assert len(examples) == 4 and truncated == 0
    for (prompt, response, mask), row in zip(examples, recipe.rows):
        expr, product = row["extra_info"]["expression"], row["reward_model"]["ground_truth"]
        assert prompt == tok.encode(tok.apply_chat_template(
            row["prompt"], tools=[t.schema for t in load_tool_config(TOOLS).values()], add_generation_prompt=True,
            tokenize=False), add_special_tokens=False)  # the RL dataset's prompt
        # by hand: the call and its eos trained, the tool turn (the calculator's real answer) not, the answer trained
        pieces = [(f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{expr}"}}}}\n</tool_call>'
                   "<|im_end|>", 1),
                  (f"\n<|im_start|>user\n<tool_response>\n{product}\n</tool_response><|im_end|>\n"
                   "<|im_start|>assistant\n", 0),
                  (f"#### {product}<|im_end|>", 1)]
        ids = [tok.encode(text, add_special_tokens=False) for text, _ in pieces]
        assert response == sum(ids, [])
        assert mask == sum(([flag] * len(piece) for piece, (_, flag) in zip(ids, pieces)), [])
    batch = collate(examples, tok.pad_token_id)
    R = batch.batch["responses"].shape[1]
    for i, (_, response, mask) in enumerate(examples):  # the loss mask is the examples' mask, padding excluded
        assert batch.batch["response_mask"][i].tolist() == mask + [0] * (R - len(mask))
        assert batch.batch["attention_mask"][i, -R:].sum() == len(response)


@pytest.fixture(scope="module")
def sft_model(recipe, tmp_path_factory):
    result = run_sft(_sft_cfg(recipe, tmp_path_factory.mktemp("sft_run"), steps=3))
    return result


def test_sft_stage_trains_and_writes_the_model_with_the_template(sft_model):
    assert sft_model["training/global_step"] == 3 and sft_model["data/dropped_rows"] == 0
    assert sft_model["train/loss"] < sft_model["train/loss_first"]
    saved = AutoTokenizer.from_pretrained(sft_model["hf_model_dir"])
    assert saved.chat_template == TEMPLATE.read_text()


def test_grpo_from_the_sft_model_reports_tool_use(ray_local, recipe, sft_model, tmp_path, monkeypatch):
    seen = []

    def recording(batch, reward_fn, reward_model=None):
        R = batch.batch["responses"].shape[1]
        seen.append((list(batch.non_tensor_batch["multi_turn_stats"]), batch.batch["attention_mask"][:, -R:],
                     batch.batch["response_mask"]))
        return compute_reward(batch, reward_fn, reward_model)

    compute_reward = ppo_trainer.compute_reward
    monkeypatch.setattr(ppo_trainer, "compute_reward", recording)
    data, mt = recipe.root / "data", "actor_rollout_ref.rollout.multi_turn"
    cfg = load_config(overrides=[
        f"actor_rollout_ref.model.path={sft_model['hf_model_dir']}", f"actor_rollout_ref.model.custom_chat_template={TEMPLATE}",
        f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'test.parquet'}",
        "data.max_prompt_length=768", "data.max_response_length=40", "data.train_batch_size=2",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_kl_loss=false",
        f"{mt}.enable=true", f"{mt}.tool_config_path={TOOLS}", f"{mt}.max_assistant_turns=3",
        "trainer.n_gpus_per_node=1", "trainer.device=cpu", "trainer.logger=[console]",
        "trainer.val_before_train=true", "trainer.test_freq=-1", "trainer.total_training_steps=1",
        f"trainer.default_local_dir={tmp_path / 'run'}"])
    history = run_ppo(cfg)["history"]
    val, step = history[0], history[-1]
    assert len(seen) == 2  # validation (2 prompts x 1), then the step (2 prompts x 2)
    for metrics, prefix, (stats, attended, response_mask) in ((val, "val-aux/", seen[0]), (step, "", seen[1])):
        calls = [s["tool_calls"] for s in stats]
        assert metrics[f"{prefix}multi_turn/tool_use_rate"] == pytest.approx(sum(c > 0 for c in calls) / len(calls))
        assert metrics[f"{prefix}tool_call_counts/mean"] == pytest.approx(sum(calls) / len(calls))
        assert metrics[f"{prefix}num_turns/mean"] == pytest.approx(sum(s["num_turns"] for s in stats) / len(stats))
        for s, att, m in zip(stats, attended, response_mask):  # tool tokens (masked) only after a tool call
            assert s["tool_calls"] > 0 or not (att.bool() & ~m.bool()).any()
    assert "val-core/bignum/acc/mean@1" in val and math.isfinite(step["actor/pg_loss"])
    assert step["multi_turn/masked_tokens"] >= 0 and torch.isfinite(torch.tensor(step["critic/score/mean"]))
