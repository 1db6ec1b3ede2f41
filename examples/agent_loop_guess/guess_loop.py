"""A number-guessing game as an agent loop (no tool calls): the model guesses, the game answers "higher" or "lower"
until the guess is right or the tries run out. Named in the config as

    actor_rollout_ref.rollout.multi_turn.agent_loop.path=examples/agent_loop_guess/guess_loop.py
    actor_rollout_ref.rollout.multi_turn.agent_loop.name=GuessNumber

The hidden number is the row's ground truth (make_data.py). The reward is 1 for a right first guess, less for
each further try, 0 when the tries ran out; each turn's score (1 right, 0 wrong) goes to `turn_scores`. The game's
messages are user turns appended as token ids (masked out of the loss); nothing of the conversation is
re-tokenised.
"""

import re

from hybridrl.rollout.agent_loop import AgentLoop


class GuessNumber(AgentLoop):
    def __init__(self, tokenizer, max_tries: int = 3, max_guess_tokens: int = 16):
        super().__init__(tokenizer)
        self.max_tries, self.max_guess_tokens = int(max_tries), int(max_guess_tokens)

    def ends_turn(self, turn_ids):
        """A guess ends once it holds a whole number (digits followed by something else), or after
        max_guess_tokens tokens: the game answers at once instead of letting the model write on to eos."""
        if len(turn_ids) >= self.max_guess_tokens:
            return True
        return re.search(r"\d\D", self.tokenizer.decode(turn_ids, skip_special_tokens=True)) is not None

    async def run(self, traj):
        secret = int(traj.row["reward_model"]["ground_truth"])
        turn = await traj.generate()              # the model's first guess, generated from the prompt
        for tries in range(1, self.max_tries + 1):
            found = re.search(r"-?\d+", turn.text)
            right = found is not None and int(found.group()) == secret
            traj.turn_scores.append(float(right))
            if right:
                return 1.0 - (tries - 1) / self.max_tries
            if turn.finished or tries == self.max_tries:   # out of response budget, or of tries
                return 0.0
            if found is None:
                hint = "Answer with one number."
            else:
                hint = "Wrong, try again: higher." if int(found.group()) < secret else "Wrong, try again: lower."
            turn = await traj.generate(traj.user_message(hint))
        return 0.0
