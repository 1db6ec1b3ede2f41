"""verl's interactions in the multi-turn agent: a turn without a tool call is answered by the sample's interaction
(its text appended as a user message) until it says done; scores kept per turn; instances finalized."""

import pytest
import yaml
from multi_turn_tools import CountdownInteraction
from transformers import AutoTokenizer

from hybridrl.rollout.interactions import Gsm8kInteraction, load_interactions
from hybridrl.rollout.multi_turn import MultiTurnSettings, ToolAgent


def _yaml(tmp_path, entries):
    path = tmp_path / "interaction.yaml"
    path.write_text(yaml.safe_dump({"interaction": entries}))
    return path


def test_interaction_config_follows_verls_yaml(tmp_path):
    got = load_interactions(_yaml(tmp_path, [
        {"name": "gsm8k", "class_name": "verl.interactions.gsm8k_interaction.Gsm8kInteraction", "config": {}},
        {"class_name": "multi_turn_tools.CountdownInteraction", "config": {"tries": 2}}]))
    assert isinstance(got["gsm8k"], Gsm8kInteraction) and got["countdown"].tries == 2   # verl's default name
    with pytest.raises(ValueError, match=r"interaction\[0\]: class_name 'nowhere.Thing' cannot be imported"):
        load_interactions(_yaml(tmp_path, [{"class_name": "nowhere.Thing"}]))
    with pytest.raises(ValueError, match="lacks"):
        load_interactions(_yaml(tmp_path, [{"class_name": "multi_turn_tools.crash"}]))
    # FILE.py:Class: a file relative to the YAML's folder (a recipe's own interaction beside its config)
    (tmp_path / "mine.py").write_text("from multi_turn_tools import CountdownInteraction as Mine\n")
    assert load_interactions(_yaml(tmp_path, [{"class_name": "mine.py:Mine", "config": {"tries": 4}}]))["mine"].tries == 4
    with pytest.raises(ValueError, match=r"class_name 'nowhere.py:Thing' cannot be imported .*No such file"):
        load_interactions(_yaml(tmp_path, [{"class_name": "nowhere.py:Thing"}]))
    with pytest.raises(ValueError, match=r"class_name 'mine.py:Other' cannot be imported .*no such name"):
        load_interactions(_yaml(tmp_path, [{"class_name": "mine.py:Other"}]))
    with pytest.raises(ValueError, match="used twice"):
        load_interactions(_yaml(tmp_path, [{"name": "a", "class_name": "multi_turn_tools.CountdownInteraction"}] * 2))


class _Seq:
    def __init__(self, tok, prompt: str, request_id: int = 0):
        self.token_ids = tok.encode(prompt, add_special_tokens=False)
        self.num_prompt_tokens = self.turn_start = len(self.token_ids)
        self.request_id, self.seq_id, self.agent_state = request_id, 1000 + request_id, None

    def say(self, tok, text):
        self.token_ids += tok.encode(text, add_special_tokens=False)


def _agent(model_dir, interactions):
    tok = AutoTokenizer.from_pretrained(model_dir)
    return tok, ToolAgent(tok, {}, MultiTurnSettings(max_user_turns=5), eos_token_ids=[tok.eos_token_id],
                          interactions=interactions)


PROMPT = "<|im_start|>user\nWhat is 6*7?<|im_end|>\n<|im_start|>assistant\n"


def test_gsm8k_feedback_until_correct(tiny_model_dir):
    interaction = Gsm8kInteraction()
    tok, agent = _agent(tiny_model_dir, {"gsm8k": interaction})
    try:
        agent.begin([{"name": "gsm8k", "ground_truth": "42"}, {}])
        seq = _Seq(tok, PROMPT)
        seq.say(tok, "It is 41.<|im_end|>")
        wrong = agent.on_turn_end(seq, budget=100).result(timeout=10)
        assert "incorrect" in tok.decode(wrong.token_ids) and tok.decode(wrong.token_ids).rstrip().endswith(
            "assistant")  # a user message, then the next generation prompt
        seq.token_ids += wrong.token_ids
        seq.turn_start = len(seq.token_ids)
        seq.say(tok, "Sorry, it is 42<|im_end|>")   # verl's flexible rule: "42." would not match
        right = agent.on_turn_end(seq, budget=100).result(timeout=10)
        assert (right.token_ids, right.finish_reason) == (None, "stop")
        stats = agent.trajectory_stats(seq)
        assert stats["turn_scores"] == [0.0, 1.0] and stats["interaction_turns"] == 1 and stats["user_turns"] == 1
        assert interaction._truth == {}   # finalized at the end of the trajectory
        other = _Seq(tok, PROMPT, request_id=1)   # a prompt without interaction_kwargs ends at a plain answer
        other.say(tok, "42<|im_end|>")
        assert agent.on_turn_end(other, budget=100).result(timeout=10).finish_reason == "stop"
    finally:
        agent.close()


def test_async_interaction_sees_the_conversation_and_its_limits_hold(tiny_model_dir):
    interaction = CountdownInteraction({"tries": 10})
    tok, agent = _agent(tiny_model_dir, {"count": interaction})
    try:
        agent.begin([{"name": "count"}])
        seq = _Seq(tok, PROMPT)
        outcomes = []
        for i in range(6):
            seq.say(tok, f"try {i}<|im_end|>")
            outcome = agent.on_turn_end(seq, budget=100).result(timeout=10)
            outcomes.append(outcome)
            if outcome.token_ids is None:
                break
            seq.token_ids += outcome.token_ids
            seq.turn_start = len(seq.token_ids)
        assert len(outcomes) == 6 and outcomes[-1].token_ids is None   # max_user_turns = 5 answers, then cut
        assert agent.trajectory_stats(seq)["cut"] == "turns" and interaction.open == {}
        last = interaction.seen[-1]
        assert [m["role"] for m in last] == ["user"] + ["assistant", "user"] * 4 + ["assistant"]
        assert last[-1]["content"] == "try 4" and last[-2]["content"] == "again"
        agent.begin([{"name": "missing"}])
        seq = _Seq(tok, PROMPT)
        seq.say(tok, "x<|im_end|>")
        with pytest.raises(ValueError, match="interaction_kwargs.name='missing'"):
            agent.on_turn_end(seq, budget=100)
    finally:
        agent.close()


class VerlBaseShaped:
    """verl's BaseInteraction as its base class writes it: finalize_interaction() takes no id; a turn may score
    None; the kwargs carry the interaction's name, as verl passes them."""

    def __init__(self, config):
        self.kwargs, self.finalized = [], 0

    async def start_interaction(self, instance_id, **kwargs):
        self.kwargs.append(kwargs)
        return instance_id

    async def generate_response(self, instance_id, messages, **kwargs):
        self.kwargs.append(kwargs)
        return len(self.kwargs) > 2, "go on", None if len(self.kwargs) == 2 else 0.5, {}

    async def finalize_interaction(self):
        self.finalized += 1


def test_verl_base_interaction_signatures(tiny_model_dir):
    interaction = VerlBaseShaped({})
    tok, agent = _agent(tiny_model_dir, {"feedback": interaction})
    try:
        agent.begin([{"name": "feedback", "ground_truth": "7"}])
        seq = _Seq(tok, PROMPT)
        seq.say(tok, "a<|im_end|>")
        outcome = agent.on_turn_end(seq, budget=100).result(timeout=10)
        seq.token_ids += outcome.token_ids
        seq.turn_start = len(seq.token_ids)
        seq.say(tok, "b<|im_end|>")
        assert agent.on_turn_end(seq, budget=100).result(timeout=10).finish_reason == "stop"
        stats = agent.trajectory_stats(seq)
        assert stats["turn_scores"] == [0.5]   # the None score adds no turn score
        assert interaction.finalized == 1 and all(k == {"name": "feedback", "ground_truth": "7"}
                                                  for k in interaction.kwargs)
    finally:
        agent.close()
