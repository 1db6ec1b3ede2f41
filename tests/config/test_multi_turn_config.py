"""actor_rollout_ref.rollout.multi_turn: verl's keys, each bad value refused naming the key and the rule."""

from pathlib import Path

import pytest

from hybridrl.config import ConfigError, load_config

MT = "actor_rollout_ref.rollout.multi_turn"


@pytest.fixture
def tool_yaml(tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text("tools:\n  - class_name: hybridrl.tools.builtin.calculator\n    config: {type: native}\n")
    return path


def test_enabled_multi_turn_config_loads(tool_yaml):
    cfg = load_config(overrides=[f"{MT}.enable=true", f"{MT}.tool_config_path={tool_yaml}", f"{MT}.max_user_turns=4",
                                 f"{MT}.tool_response_truncate_side=left"])
    assert cfg.actor_rollout_ref.rollout.multi_turn.max_user_turns == 4


@pytest.mark.parametrize("overrides,key,rule", [
    ([f"{MT}.enable=true"], f"{MT}.enable", "a YAML listing the tools"),
    ([f"{MT}.enable=true", f"{MT}.tool_config_path=/nonexistent/tools.yaml"], f"{MT}.tool_config_path", "no such file"),
    ([f"{MT}.enable=true", f"{MT}.interaction_config_path=/nonexistent/interaction.yaml"],
     f"{MT}.interaction_config_path", "no such file"),
    ([f"{MT}.max_assistant_turns=0"], f"{MT}.max_assistant_turns", "must be null (no limit) or >= 1"),
    ([f"{MT}.max_parallel_calls=0"], f"{MT}.max_parallel_calls", ">= 1"),
    ([f"{MT}.max_tool_response_length=0"], f"{MT}.max_tool_response_length", ">= 1"),
    ([f"{MT}.tool_response_truncate_side=top"], f"{MT}.tool_response_truncate_side", "not one of"),
    ([f"{MT}.format=gpt_oss"], f"{MT}.format", "not one of"),
    ([f"{MT}.max_tokens_per_turn=0"], f"{MT}.max_tokens_per_turn", "must be null (no limit) or >= 1"),
    ([f"{MT}.enable=true", "TOOLS", "actor_rollout_ref.rollout.name=hf"], f"{MT}.enable", "must be 'native'"),
    ([f"{MT}.enable=true", f"{MT}.agent_loop.path=LOOP"], f"{MT}.agent_loop.name", "name the AgentLoop subclass"),
    ([f"{MT}.enable=true", f"{MT}.agent_loop.path=LOOP", f"{MT}.agent_loop.name=GuessNumber", "TOOLS"],
     f"{MT}.tool_config_path", "the agent loop replaces the tool agent"),
    ([f"{MT}.enable=true", f"{MT}.agent_loop.path=/nonexistent/loop.py", f"{MT}.agent_loop.name=X"],
     f"{MT}.agent_loop.path", "no such file"),
])
def test_bad_multi_turn_values_are_refused_by_name(tool_yaml, overrides, key, rule):
    loop = Path(__file__).resolve().parents[2] / "examples" / "agent_loop_guess" / "guess_loop.py"
    overrides = [f"{MT}.tool_config_path={tool_yaml}" if o == "TOOLS" else o.replace("LOOP", str(loop))
                 for o in overrides]
    with pytest.raises(ConfigError) as e:
        load_config(overrides=overrides)
    assert f"'{key}'" in str(e.value) and rule in str(e.value), str(e.value)


def test_seed_layout_accepts_multi_turn(monkeypatch):
    """The seed's 6-GPU layout (rollout TP = 2) with multi-turn on: the TP group's rank 0 runs the tools."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(repo)
    cfg = load_config(repo / "examples" / "seed_6gpu.yaml", overrides=[
        f"{MT}.enable=true", f"{MT}.tool_config_path=examples/multiturn_calculator/tool_config.yaml"])
    assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == 2 and cfg.actor_rollout_ref.rollout.multi_turn.enable


def test_example_multi_turn_config_validates(monkeypatch):
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(repo)  # the example names its tool config relative to the repo root
    cfg = load_config(repo / "examples" / "multiturn_calculator" / "config.yaml")
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    assert mt.enable and mt.max_assistant_turns == 4
    from hybridrl.tools.registry import load_tool_config

    assert list(load_tool_config(mt.tool_config_path)) == ["calculator"]


def test_agent_loop_example_config_validates_and_loads_its_loop(monkeypatch, tiny_model_dir):
    from transformers import AutoTokenizer

    from hybridrl.rollout.agent_loop import load_agent_loop

    repo = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(repo)  # the example names its loop relative to the repo root
    cfg = load_config(repo / "examples" / "agent_loop_guess" / "config.yaml")
    agent = load_agent_loop(cfg.actor_rollout_ref.rollout.multi_turn, AutoTokenizer.from_pretrained(tiny_model_dir),
                            eos_token_ids=[0])
    try:
        assert type(agent.loop).__name__ == "GuessNumber" and agent.loop.max_tries == 3
    finally:
        agent.close()
