"""The simulated user of the SmolLM2 interaction recipe (verl's BaseInteraction shape; interaction_config.yaml
names it as `feedback.py:AdditionInteraction`).

After each assistant turn it reads the turn's last integer (examples/smollm2_arith/reward.py's rule, so the
interaction and the reward agree on what the answer is): the right sum ends the trajectory (score 1.0,
"Your answer is correct!" — not appended, the conversation is over); any other answer, or none, gets `feedback`
as a user message (score 0.0) and the model answers again, until the rollout's turn limit
(`multi_turn.max_user_turns`) ends the trajectory. The scores land in `multi_turn_stats.turn_scores`; the
training reward is the reward function's, not these.
"""

from __future__ import annotations

from pathlib import Path

from hybridrl.rewards.custom import import_from_file

last_integer = import_from_file(Path(__file__).resolve().parent.parent / "smollm2_arith" / "reward.py",
                                "last_integer")
WRONG = "Your answer is incorrect. Add the two numbers again and end your reply with the sum."


class AdditionInteraction:
    """Says whether the latest answer's last integer is `ground_truth` (interaction_kwargs); config `feedback`
    replaces the wrong-answer message."""

    def __init__(self, config: dict | None = None):
        self.config = dict(config or {})
        self.feedback = str(self.config.get("feedback", WRONG))
        self._truth: dict[str, int] = {}
        self.calls = 0  # generate_response calls (read by the recipe's CPU test)

    def start_interaction(self, instance_id: str, ground_truth=None, **kwargs) -> str:
        try:
            self._truth[instance_id] = int(str(ground_truth))
        except ValueError:
            raise ValueError(f"extra_info.interaction_kwargs.ground_truth={ground_truth!r}: the addition "
                             "interaction needs the sum as an integer") from None
        return instance_id

    def generate_response(self, instance_id: str, messages: list[dict], **kwargs):
        self.calls += 1
        content = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"), "")
        answer = last_integer(content)
        if answer == self._truth[instance_id]:
            return True, "Your answer is correct!", 1.0, {"answer": answer}
        return False, self.feedback, 0.0, {"answer": answer}

    def finalize_interaction(self, instance_id: str, **kwargs) -> None:
        self._truth.pop(instance_id, None)
