"""Agent loops: a user's multi-turn environment as one coroutine per trajectory, on the engine's cached KV.

A user subclasses `AgentLoop` in their own file and names it with `actor_rollout_ref.rollout.multi_turn.agent_loop.
path` / `.name` (loaded like custom_reward_function; `.kwargs` go to its constructor). The engine generates each
trajectory's first assistant turn from the prompt; `run(traj)` then drives the rest through its `Trajectory`:

    class Guess(AgentLoop):
        async def run(self, traj):
            turn = await traj.generate()                          # the model's first turn
            for _ in range(3):
                if "42" in turn.text:
                    return 1.0                                    # the trajectory's reward
                if turn.finished:                                 # the response budget ran out
                    break
                turn = await traj.generate(traj.user_message("Wrong, try again."))
            return 0.0

Choices:
- Token in, token out: `generate(ids)` appends the environment's tokens (response mask 0, log-prob 0) and returns the
  model's next turn as token ids (mask 1). Nothing is re-tokenised, so the trainer sees exactly what the model was
  conditioned on. `message_ids(messages)` / `user_message(text)` render messages with the chat template (what it
  writes between an assistant turn and the next generation prompt, as the tool path does).
- A turn ends at an eos token, where `ends_turn(turn_ids)` says (the loop's own stop rule, e.g. a closing tag;
  called for every sampled token, so cheap), or at `multi_turn.max_tokens_per_turn` (the trajectory then ends:
  counted as cut by turn length).
- The engine ends a trajectory when its response budget (max_tokens, max_model_len) runs out: the turn `generate`
  returns then has `finished` set. Environment tokens that do not fit end it the same way (finish_reason "length",
  counted as cut by length): a response never holds a partial message.
- `run` returns the trajectory's reward (a number: it replaces the reward function for that sample) or None (the
  reward function scores it); `traj.turn_scores` holds per-turn scores (reported in `multi_turn_stats`).
- Branches: `traj.fork(ids)` (before the turn's `generate`, `finish` or return, which hand it to the engine) makes a
  new trajectory that shares the history so far (its KV blocks too, copied on write) and continues after `ids`;
  the loop drives it with its own `generate` calls and sets its `reward`. A branch is one more sample of the prompt: its own row, mask and reward,
  under the prompt's uid (GRPO groups it with the prompt's other samples).
- Loops are coroutines on one event-loop thread: many trajectories can wait on the engine or an environment
  without a thread each; a blocking call belongs in `await asyncio.to_thread(...)`. An exception in `run` fails the
  rollout (a bug in the loop, not an answer of the environment). Under TP only the engine group's rank 0 runs loops.
- Counts per trajectory in `TrajectoryStats` (multi_turn.py): assistant turns, environment turns (`user_turns`),
  cuts, turn scores and the reward.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import numbers
import threading
from concurrent.futures import Future
from dataclasses import dataclass

from hybridrl.rollout.multi_turn import KEY, MultiTurnSettings, TrajectoryStats, TurnOutcome, message_ids

__all__ = ["AgentLoop", "AgentLoopAgent", "Trajectory", "Turn", "load_agent_loop"]

_tags = itertools.count(1)


@dataclass(frozen=True)
class Turn:
    token_ids: list[int]          # the model's tokens of this turn (eos included when it ended on one)
    text: str                     # decoded, special tokens skipped
    finish_reason: str | None     # None: the trajectory can go on; "length" / "stop": it has ended

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class AgentLoop:
    """Subclass and implement `run`; `ends_turn` optionally. Constructed once per worker as cls(tokenizer, **kwargs)."""

    def __init__(self, tokenizer, **kwargs):
        self.tokenizer = tokenizer

    def ends_turn(self, turn_ids: list[int]) -> bool:
        """Whether the current turn (its token ids so far) ends here; eos always ends a turn."""
        return False

    async def run(self, traj: Trajectory) -> float | None:
        raise NotImplementedError(f"{type(self).__name__}.run(traj) is not implemented")


class Trajectory:
    """One trajectory's handle: its prompt, its row of the data set, and `generate`."""

    def __init__(self, agent: AgentLoopAgent, prompt_ids: list[int], row: dict, root: Trajectory | None = None):
        self._agent = agent
        self.prompt_ids = prompt_ids
        self.row = row                      # the prompt's non-tensor data: data_source, reward_model, extra_info, ...
        self.messages = row.get("raw_prompt")  # the prompt's chat messages when the data set keeps them
        self.stats = TrajectoryStats()
        self.turn_scores = self.stats.turn_scores
        self.reward: float | None = None
        self.root = root or self
        self.family: list[Trajectory] = []             # on the root: the branches forked from it or its branches
        self._turns: asyncio.Queue = asyncio.Queue()   # the model's turns, as the engine ends them
        self._outcome: Future | None = None            # what the engine waits for at the current turn end
        self._forks: list = []
        self._budget = 0
        self._ended_on: str | None = None              # eos text the last turn ended with
        self._started = self.ended = False   # ended: the engine has (or is sent) this trajectory's end
        self._over = False                   # the loop has seen the end (a finished turn, or its own finish())

    async def generate(self, token_ids: list[int] | None = None) -> Turn:
        """The model's next turn: the first call returns the turn generated from the prompt (pass nothing); later
        calls append `token_ids` (the environment's) first."""
        if self._over:
            raise RuntimeError("Trajectory.generate after the trajectory ended (check turn.finished)")
        if self._started:
            ids = [int(t) for t in (token_ids or [])]
            if not ids:
                raise ValueError("Trajectory.generate(token_ids): after the first turn, pass the environment's "
                                 "token ids to append (e.g. traj.user_message(text))")
            if len(ids) > self._budget:
                self.stats.cut = "length"
                self._close(TurnOutcome(None, "length"))
                self._over = True
                return Turn([], "", "length")
            self.stats.user_turns += 1
            self._send(TurnOutcome(ids))
        elif token_ids:
            raise ValueError("Trajectory.generate: the first call returns the turn generated from the prompt; "
                             "it takes no token ids")
        self._started = True
        turn = await self._turns.get()
        self._over = turn.finished
        return turn

    def fork(self, token_ids: list[int]) -> Trajectory:
        """A branch continuing this trajectory's history (up to its current turn end) after `token_ids`. The engine
        learns of it with this turn's `generate(ids)`, `finish()` or the return of `run`, so fork first; then
        drive it with `await branch.generate()` (its first turn) and set `branch.reward`."""
        if self._outcome is None or self._outcome.done() or self.ended:
            raise RuntimeError("Trajectory.fork: only at a turn end, before this turn's generate or return")
        ids = [int(t) for t in token_ids]
        if not ids or len(ids) > self._budget:
            raise ValueError(f"Trajectory.fork: {len(ids)} token ids; a branch needs 1..{self._budget} (the budget)")
        branch = Trajectory(self._agent, self.prompt_ids, self.row, self.root)
        self.root.family.append(branch)
        tag = next(_tags)
        self._agent.branches[tag] = branch
        self._forks.append((ids, tag))
        branch.stats.user_turns = 1
        return branch

    def finish(self) -> None:
        """End this trajectory now (`run` returning does the same); branches forked at this turn end go on."""
        self._over = True
        if not self.ended:
            self._close(TurnOutcome(None, "stop"))

    def message_ids(self, messages: list[dict]) -> list[int]:
        """Token ids of `messages` as the chat template writes them after this trajectory's last turn."""
        return message_ids(self._agent.tokenizer, messages, self._ended_on)

    def user_message(self, text: str) -> list[int]:
        return self.message_ids([{"role": "user", "content": text}])

    # ------------------------------------------------------------------ engine side
    def _send(self, outcome: TurnOutcome) -> None:
        outcome = TurnOutcome(outcome.token_ids, outcome.finish_reason, tuple(self._forks))
        self._forks = []
        self._outcome.set_result(outcome)

    def _close(self, outcome: TurnOutcome) -> None:
        """The trajectory ends (the loop returned or the budget ran out): tell the engine if it waits."""
        self.ended = True
        if self._outcome is not None and not self._outcome.done():
            self._send(outcome)


class AgentLoopAgent:
    """The engine's multi-turn agent (ends_turn / on_turn_end / trajectory_stats) running a user's AgentLoop."""

    def __init__(self, loop: AgentLoop, tokenizer, settings: MultiTurnSettings, *, eos_token_ids):
        self.loop, self.tokenizer, self.settings = loop, tokenizer, settings
        self.eos = set(eos_token_ids)
        if not self.eos:
            raise ValueError(f"{KEY}.enable: the tokenizer has no eos token to end an assistant turn with")
        self.eos_text = {e: tokenizer.decode([e], skip_special_tokens=False) for e in self.eos}
        self.events = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.events.run_forever, name="hybridrl-agent-loop", daemon=True)
        self.thread.start()
        self.rows: list[dict] = []
        self.trajs: dict = {}       # seq_id -> Trajectory
        self.branches: dict = {}    # fork tag -> the branch's Trajectory, until its sequence's first turn end
        self.runs: dict = {}        # root Trajectory -> concurrent Future of its run

    def begin_batch(self, non_tensor: dict) -> None:
        """Each prompt's non-tensor entries of the next generate call (index = the engine's request id)."""
        n = len(next(iter(non_tensor.values()))) if non_tensor else 0
        self.rows = [{k: v[i] for k, v in non_tensor.items()} for i in range(n)]
        self.trajs, self.branches, self.runs = {}, {}, {}

    def ends_turn(self, seq) -> bool:
        turn = seq.token_ids[seq.turn_start:]
        limit = self.settings.max_tokens_per_turn
        return turn[-1] in self.eos or (limit is not None and len(turn) >= limit) or self.loop.ends_turn(turn)

    def on_turn_end(self, seq, budget: int) -> Future:
        traj = self._traj(seq)
        traj.stats.assistant_turns += 1
        turn_ids = seq.token_ids[seq.turn_start:]
        limit = self.settings.max_tokens_per_turn
        cut = (limit is not None and len(turn_ids) >= limit and turn_ids[-1] not in self.eos
               and not self.loop.ends_turn(turn_ids))
        traj._outcome, traj._budget = Future(), budget
        traj._ended_on = self.eos_text.get(turn_ids[-1])
        if cut:
            traj.stats.cut = "turn_length"
            traj._close(TurnOutcome(None, "length"))
        self._deliver(traj, Turn(turn_ids, self._text(turn_ids), "length" if cut else None))
        return traj._outcome

    def trajectory_stats(self, seq) -> dict:
        traj = self._traj(seq)
        result = self.runs[traj.root].result()  # the loop's own failures propagate
        if traj is traj.root and result is not None:
            traj.reward = result
        traj.stats.reward = self._reward(traj.reward)
        return traj.stats.as_dict()

    def end_call(self, seqs) -> None:
        """The call's sequences have all ended: a loop still waiting on a turn gets it, marked finished."""
        for seq in seqs:
            traj = self._traj(seq)
            if not traj.ended:
                turn_ids = seq.token_ids[seq.turn_start:]
                traj.ended = True
                traj.stats.assistant_turns += bool(turn_ids)
                self._deliver(traj, Turn(turn_ids, self._text(turn_ids), seq.finish_reason or "length"))

    def close(self) -> None:
        self.events.call_soon_threadsafe(self.events.stop)

    # ------------------------------------------------------------------ helpers
    def _traj(self, seq) -> Trajectory:
        traj = self.trajs.get(seq.seq_id)
        if traj is None:
            if seq.agent_state is not None:   # a branch: its fork tag
                traj = self.branches.pop(seq.agent_state)
            else:
                row = self.rows[seq.request_id] if seq.request_id < len(self.rows) else {}
                traj = Trajectory(self, seq.token_ids[:seq.num_prompt_tokens], row)
                self.runs[traj] = asyncio.run_coroutine_threadsafe(self._run(traj), self.events)
            self.trajs[seq.seq_id] = traj
        return traj

    async def _run(self, traj: Trajectory):
        try:
            return await self.loop.run(traj)
        finally:   # the trajectory and its branches end with the loop; the engine stops waiting for them
            for t in [traj, *traj.family]:
                t._close(TurnOutcome(None, "stop"))

    def _deliver(self, traj: Trajectory, turn: Turn) -> None:
        self.events.call_soon_threadsafe(traj._turns.put_nowait, turn)

    def _text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _reward(self, value):
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
            raise ValueError(f"{KEY}.agent_loop: {type(self.loop).__name__}.run returned {value!r}; a reward must be "
                             "a finite number or None (the reward function scores the trajectory)")
        return float(value)


def load_agent_loop(mt, tokenizer, eos_token_ids) -> AgentLoopAgent:
    """The AgentLoopAgent of `multi_turn.agent_loop` (path, name, kwargs)."""
    from pathlib import Path

    from hybridrl.rewards.custom import import_from_file

    spec = mt.agent_loop
    path = Path(str(spec.path)).expanduser().resolve()
    cls = import_from_file(path, str(spec.name), f"{KEY}.agent_loop")
    if not (isinstance(cls, type) and issubclass(cls, AgentLoop)):
        raise ValueError(f"{KEY}.agent_loop.name={spec.name!r} in {str(path)!r} must be a subclass of "
                         "hybridrl.rollout.agent_loop.AgentLoop")
    kwargs = dict(spec.kwargs or {})
    return AgentLoopAgent(cls(tokenizer, **kwargs), tokenizer, MultiTurnSettings.from_config(mt),
                          eos_token_ids=eos_token_ids)
