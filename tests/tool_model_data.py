"""The conversation the tool model of tests/conftest.py (`tool_model_dir`) learns, shared by the multi-turn tests
(imported by name: tests/ is on sys.path through its conftest)."""

TOOL_CALL_ARGS = {"expression": "6*7"}
TOOL_MODEL_PROMPTS = (4, 0)  # the first 4 train rows of `hybridrl data make bignum --seed 0`


def bignum_prompts(n: int, seed: int) -> list[list[dict]]:
    """Chat messages of `n` bignum task prompts (system + user)."""
    from hybridrl.data.tasks import TASKS

    return [row["prompt"] for row in TASKS["bignum"].generate(n, 0, seed=seed)["train"]]


def tool_conversation(tokenizer, messages: list[dict], tools):
    """(prompt ids, turn-1 ids, appended ids, turn-2 ids) of the conversation the tool model learns: a calculator
    call for 6*7, the tool's answer 42, then '#### 42'. Checked to tokenize as the whole conversation does."""
    call = {"function": {"name": "calculator", "arguments": TOOL_CALL_ARGS}}
    convo = messages + [{"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "content": "42"},
                        {"role": "assistant", "content": "#### 42"}]
    prompt = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    full = tokenizer.apply_chat_template(convo, tools=tools, tokenize=False).removesuffix("\n")
    turn1_end = full.index("</tool_call>", len(prompt)) + len("</tool_call>")
    turn2_start = full.rindex("<|im_start|>assistant\n") + len("<|im_start|>assistant\n")
    parts = [full[:len(prompt)], full[len(prompt):turn1_end], full[turn1_end:turn2_start], full[turn2_start:]]
    ids = [tokenizer.encode(p, add_special_tokens=False) for p in parts]
    assert sum(ids, []) == tokenizer.encode(full, add_special_tokens=False)
    return ids
