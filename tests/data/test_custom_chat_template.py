"""actor_rollout_ref.model.custom_chat_template: the policy tokenizer every part of a run loads renders prompts and
tool messages with it (a string or a file), and a missing file or a broken template is refused naming the key."""

import pytest

from hybridrl.config import ConfigError, load_config
from hybridrl.models.tokenizer import policy_tokenizer
from hybridrl.workers.actor_rollout_ref import build_tool_agent

TEMPLATE = ("{% if tools %}[tools]{% for t in tools %}{{ t['function']['name'] }} {% endfor %}{% endif %}"
            "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}"
            "{% if m.get('tool_calls') %}<tool_call>{{ m['tool_calls'][0]['function']['name'] }}</tool_call>"
            "{% endif %}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}")
MSGS = [{"role": "user", "content": "hi"}]


def _config(tiny_model_dir, **extra):
    return load_config(overrides=[f"actor_rollout_ref.model.path={tiny_model_dir}",
                                  *(f"{k}={v}" for k, v in extra.items())])


def test_the_policy_tokenizer_takes_the_template_from_a_string_or_a_file(tiny_model_dir, tmp_path):
    own = policy_tokenizer(_config(tiny_model_dir)).apply_chat_template(MSGS, tokenize=False,
                                                                        add_generation_prompt=True)
    cfg = _config(tiny_model_dir).with_value("actor_rollout_ref.model.custom_chat_template", TEMPLATE)
    tok = policy_tokenizer(cfg)
    assert tok.apply_chat_template(MSGS, tokenize=False, add_generation_prompt=True) == "[user]hi[assistant]"
    assert own != "[user]hi[assistant]"
    (tmp_path / "t.jinja").write_text(TEMPLATE)
    from_file = _config(tiny_model_dir, **{"actor_rollout_ref.model.custom_chat_template": tmp_path / "t.jinja"})
    assert policy_tokenizer(from_file).chat_template == TEMPLATE


def test_the_tool_agent_renders_tool_turns_with_the_custom_template(tiny_model_dir, tmp_path):
    tools = tmp_path / "tools.yaml"
    tools.write_text("tools:\n  - class_name: hybridrl.tools.builtin.calculator\n    config: {type: native}\n")
    cfg = _config(tiny_model_dir, **{"actor_rollout_ref.rollout.multi_turn.enable": "true",
                                     "actor_rollout_ref.rollout.multi_turn.tool_config_path": tools})
    cfg = cfg.with_value("actor_rollout_ref.model.custom_chat_template", TEMPLATE)
    agent = build_tool_agent(cfg, eos_token_ids=(1,), max_running_seqs=4)
    assert agent.tokenizer.chat_template == TEMPLATE   # the tiny model's own template renders tools differently
    from hybridrl.rollout.multi_turn import message_ids

    ids = message_ids(agent.tokenizer, [{"role": "tool", "content": "42"}], tools=agent.schemas)
    assert agent.tokenizer.decode(ids).startswith("[tool]42")


@pytest.mark.parametrize("value,rule", [("no_such_template.jinja", "no such file"),
                                        ("{% for m in messages %}", "does not compile")])
def test_bad_templates_are_refused_naming_the_key(value, rule):
    with pytest.raises(ConfigError) as e:
        load_config(overrides=[f"actor_rollout_ref.model.custom_chat_template={value}"])
    assert "actor_rollout_ref.model.custom_chat_template" in str(e.value) and rule in str(e.value)


THINKING = ("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}[assistant]{% if enable_thinking is defined and not enable_thinking %}"
            "<think></think>{% endif %}{% endif %}")


def test_apply_chat_template_kwargs_reach_every_render_of_the_policy_tokenizer(tiny_model_dir, tmp_path):
    import pickle

    import pyarrow as pa
    import pyarrow.parquet as pq

    from hybridrl.data import RLHFDataset

    base = _config(tiny_model_dir).with_value("actor_rollout_ref.model.custom_chat_template", THINKING)
    off = load_config(overrides=[f"actor_rollout_ref.model.path={tiny_model_dir}",
                                 "+data.apply_chat_template_kwargs.enable_thinking=false"])
    off = off.with_value("actor_rollout_ref.model.custom_chat_template", THINKING)
    assert policy_tokenizer(base).apply_chat_template(MSGS, tokenize=False, add_generation_prompt=True) == \
        "[user]hi[assistant]"
    tok = policy_tokenizer(off)
    assert tok.apply_chat_template(MSGS, tokenize=False, add_generation_prompt=True) == \
        "[user]hi[assistant]<think></think>"
    # a call's own argument wins; the bound arguments survive pickling (the tokenizer travels to workers)
    assert tok.apply_chat_template(MSGS, tokenize=False, add_generation_prompt=True, enable_thinking=True) == \
        "[user]hi[assistant]"
    again = pickle.loads(pickle.dumps(tok))
    assert again.apply_chat_template(MSGS, tokenize=False, add_generation_prompt=True).endswith("<think></think>")
    rows = [{"data_source": "x", "prompt": MSGS, "reward_model": {"ground_truth": "1"}}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    ids = RLHFDataset(str(tmp_path / "d.parquet"), tok, {"max_prompt_length": 64})[0]["raw_prompt_ids"]
    assert tok.decode(ids).endswith("<think></think>")
