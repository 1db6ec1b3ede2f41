"""ToolAgent: multi-turn tool use inside the native engine (`actor_rollout_ref.rollout.multi_turn`, verl's keys).

The engine (engine.py) owns the sequences and their KV cache; this agent decides, token by token, where an
assistant turn ends, and, once one has, what comes next: the tool messages to append or the end of the trajectory.

Choices:
- A turn ends at an eos token, or as soon as it holds `max_parallel_calls` complete tool calls (the token ids of
  the format's closing tag, e.g. `</tool_call>`, at its end; with Qwen's tokenizer one token) outside a reasoning
  block: with the default of 1 the model stops right after its call instead of running on to eos. A call whose
  closing tag the model tokenized unusually is still parsed when the turn ends at eos. Formats whose calls have no
  closing tag (llama3_json) end turns at eos only. `max_tokens_per_turn` ends a turn that long: its trajectory
  ends with finish_reason "length" (counted as cut by the turn limit).
- The turn's text is parsed in the configured format (tool_parser.py); calls inside `<think>` blocks are not run
  (counted); a turn without a call ends the trajectory. Otherwise the turn's calls run concurrently on this
  agent's call threads — the engine keeps decoding the other sequences meanwhile — and each answer,
  truncated to `max_tool_response_length` characters on `tool_response_truncate_side` as verl does, becomes a
  `tool` message. Malformed calls, unknown tools, bad arguments, crashing and timed-out tools all give an
  "Error: ..." message instead (counted, never raised): the rollout goes on.
- The appended tokens are exactly what the chat template writes between the assistant's content and the next
  assistant generation prompt: the template is rendered with an assistant message holding a sentinel and the tool
  messages after it (add_generation_prompt=True), and everything after the sentinel is tokenized. When the turn
  ended on eos the eos text the template writes there is already in the sequence (sampled) and is left out.
- Limits as in verl: after `max_assistant_turns` assistant turns, or `max_user_turns` tool turns, the trajectory
  ends even if it asked for tools (counted as cut by turns); calls beyond `max_parallel_calls` in one turn are
  dropped and counted; tool messages that do not fit in the response budget end the trajectory with
  finish_reason "length" (counted as cut by length) — the response never holds a partial tool message.
- Interactions (interactions.py, verl's simulated users): with `interaction_config_path`, a turn without a tool
  call goes to the sample's interaction (`extra_info.interaction_kwargs.name`; `begin` hands the agent the
  call's per-prompt kwargs) instead of ending the trajectory: its text becomes a `user` message and the
  trajectory goes on unless it said done. Its scores are kept per turn (`turn_scores`); user-message turns count
  toward `max_user_turns` as tool turns do; an interaction started for a trajectory is finalized when the
  trajectory ends, however it ends.
- Counts are kept per trajectory (`TrajectoryStats`, on the sequence) and summed by the trainer over the batch.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from hybridrl.awaiting import resolved as run_interaction
from hybridrl.rollout.interactions import finalize as finalize_interaction
from hybridrl.rollout.tool_parser import FORMATS, ParsedCall, get_format, strip_reasoning
from hybridrl.tools.registry import Tool

__all__ = ["MultiTurnSettings", "ToolAgent", "TrajectoryStats", "TurnOutcome", "message_ids", "truncate_tool_response"]

KEY = "actor_rollout_ref.rollout.multi_turn"
TRUNCATE_SIDES = ("left", "middle", "right")
SENTINEL = "\u2063HYBRIDRL-TURN-END\u2063"  # text no model writes: marks where the assistant's content ends


@dataclass(frozen=True)
class MultiTurnSettings:
    max_assistant_turns: int | None = None
    max_user_turns: int | None = None
    max_parallel_calls: int = 1
    max_tool_response_length: int = 256
    tool_response_truncate_side: str = "middle"
    format: str = "hermes"
    max_tokens_per_turn: int | None = None

    def __post_init__(self):
        for name in ("max_assistant_turns", "max_user_turns", "max_tokens_per_turn"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{KEY}.{name}={value!r} must be null (no limit) or an integer >= 1")
        for name in ("max_parallel_calls", "max_tool_response_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{KEY}.{name}={value!r} must be an integer >= 1")
        if self.tool_response_truncate_side not in TRUNCATE_SIDES:
            raise ValueError(f"{KEY}.tool_response_truncate_side={self.tool_response_truncate_side!r} must be one "
                             f"of {TRUNCATE_SIDES}")
        if self.format not in FORMATS:
            raise ValueError(f"{KEY}.format={self.format!r}: supported formats are {FORMATS}")

    @classmethod
    def from_config(cls, mt) -> MultiTurnSettings:
        return cls(max_assistant_turns=mt.max_assistant_turns, max_user_turns=mt.max_user_turns,
                   max_parallel_calls=mt.max_parallel_calls, max_tool_response_length=mt.max_tool_response_length,
                   tool_response_truncate_side=mt.tool_response_truncate_side, format=mt.format,
                   max_tokens_per_turn=mt.max_tokens_per_turn)


@dataclass
class TrajectoryStats:
    assistant_turns: int = 0
    user_turns: int = 0        # turns of tool or user (interaction) messages appended
    tool_calls: int = 0        # calls answered (each gets a tool message), malformed ones included
    tool_errors: int = 0       # calls answered with an error: malformed, unknown tool, bad arguments, crash, timeout
    malformed_calls: int = 0   # not JSON / no name / unknown tool
    tool_crashes: int = 0
    tool_timeouts: int = 0
    tool_time_s: float = 0.0
    dropped_calls: int = 0     # beyond max_parallel_calls in a turn
    calls_in_reasoning: int = 0  # written inside <think> blocks: not run
    interaction_turns: int = 0   # user messages an interaction answered with
    turn_scores: list = field(default_factory=list)  # each interaction answer's score
    tool_rewards: list = field(default_factory=list)  # each class tool call's step reward (verl's tool_rewards)
    appended: list = field(default_factory=list)  # the messages appended after each assistant turn
    truncated_responses: int = 0
    cut: str = ""              # "" | "turns" | "length" | "turn_length": ended by a limit (assistant / tool turns,
                               # appended messages that do not fit the response budget, max_tokens_per_turn); the
                               # engine adds "max_tokens" / "max_model_len" for a trajectory it ended mid-turn
    reward: float | None = None  # an agent loop's reward for the trajectory (None: the reward function scores it)

    def as_dict(self) -> dict:
        out = asdict(self)
        out.pop("appended")
        return {**out, "num_turns": self.assistant_turns + self.user_turns + 1}  # verl's count


@dataclass(frozen=True)
class TurnOutcome:
    token_ids: list[int] | None  # tokens to append before the next assistant turn; None = the trajectory ends
    finish_reason: str | None = None
    forks: tuple = ()   # (token_ids, tag) per branch: a new trajectory sharing the history up to this turn's end,
                        # continued after token_ids; it starts with agent_state = tag (agent_loop.py)


def message_ids(tokenizer, messages: list[dict], ended_on_text: str | None = None, tools=None) -> list[int]:
    """The token ids the chat template writes from the end of an assistant turn's content to the next assistant
    generation prompt, with `messages` (tool or user messages) in between: the template is rendered with an
    assistant message holding a sentinel, and what follows the sentinel is tokenized. `ended_on_text`: the eos text
    the turn already ended with (sampled), left out."""
    convo = [{"role": "user", "content": "?"}, {"role": "assistant", "content": SENTINEL}, *messages]
    text = tokenizer.apply_chat_template(convo, tools=tools, add_generation_prompt=True, tokenize=False)
    text = text[text.index(SENTINEL) + len(SENTINEL):]
    if ended_on_text is not None and text.startswith(ended_on_text):
        text = text[len(ended_on_text):]
    return list(tokenizer.encode(text, add_special_tokens=False))


def truncate_tool_response(text: str, limit: int, side: str) -> str:
    """verl's rule: `left` keeps the start, `right` the end, `middle` both halves, with a visible marker."""
    if len(text) <= limit:
        return text
    if side == "left":
        return text[:limit] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[-limit:]
    half = limit // 2
    return text[:half] + "...(truncated)..." + text[len(text) - half:]


def _done(outcome: TurnOutcome) -> Future:
    future: Future = Future()
    future.set_result(outcome)
    return future


def _count(seq: list[int], pattern: list[int]) -> int:
    k, n, i = len(pattern), 0, 0
    while i + k <= len(seq):
        if seq[i:i + k] == pattern:
            n, i = n + 1, i + k
        else:
            i += 1
    return n


class ToolAgent:
    def __init__(self, tokenizer, tools: dict[str, Tool], settings: MultiTurnSettings, *, eos_token_ids,
                 interactions: dict | None = None, max_running_seqs: int = 16):
        self.tokenizer, self.tools, self.settings = tokenizer, tools, settings
        self.interactions = interactions or {}
        if not tools and not self.interactions:
            raise ValueError(f"{KEY}.enable: no tools (tool_config_path) and no interactions (interaction_config_path)")
        self.requests: list = []   # per prompt of the current generate call: its interaction kwargs (begin)
        self.tools_kwargs: list = []   # per prompt: verl's extra_info.tools_kwargs (tool name -> create_kwargs, ...)
        self.schemas = [t.schema for t in tools.values()]
        self.format = get_format(settings.format)
        self.eos = set(eos_token_ids)
        if not self.eos:
            raise ValueError(f"{KEY}.enable: the tokenizer has no eos token to end an assistant turn with")
        end = self.format.call_end
        self.call_end_ids = list(tokenizer.encode(end, add_special_tokens=False)) if end else None
        self.eos_text = {e: tokenizer.decode([e], skip_special_tokens=False) for e in self.eos}
        self._check_template()
        # Every running sequence (at most max_running_seqs: the engine's) may be between turns at once, each
        # holding a turn thread and up to max_parallel_calls call threads; pools that large mean a slow tool (a
        # remote sandbox) never queues behind others for a thread (a pool of 16 made 256 trajectories of 50 ms
        # calls 7.7x slower than single-turn on a GPU). Threads start on demand. Turns wait on their calls, so the
        # calls get a pool of their own (one pool for both could fill up with waiting turns).
        self.pool = ThreadPoolExecutor(max_workers=max_running_seqs, thread_name_prefix="hybridrl-turn")
        self.call_pool = ThreadPoolExecutor(max_workers=max_running_seqs * settings.max_parallel_calls,
                                            thread_name_prefix="hybridrl-tool")

    def _check_template(self) -> None:
        if not self.tools:
            return
        name = next(iter(self.tools))
        prompt = self.tokenizer.apply_chat_template([{"role": "user", "content": "?"}], tools=self.schemas,
                                                    add_generation_prompt=True, tokenize=False)
        if name not in prompt:
            raise ValueError(f"{KEY}.enable: the tokenizer's chat template does not render the tools given with "
                             f"tools= (tool {name!r} is not in the prompt); multi-turn needs a Hermes/Qwen-style "
                             "tool template")
        probe = "PROBE-7f3a"
        if probe not in self.tokenizer.decode(message_ids(self.tokenizer, [{"role": "tool", "content": probe}],
                                                          tools=self.schemas)):
            raise ValueError(f"{KEY}.enable: the tokenizer's chat template does not render 'tool' messages")

    # ------------------------------------------------------------------ engine interface
    def ends_turn(self, seq) -> bool:
        """Whether the token just sampled ends the current assistant turn (called for every sampled token)."""
        ids = seq.token_ids
        tok, end = ids[-1], self.call_end_ids
        if tok in self.eos:
            return True
        limit = self.settings.max_tokens_per_turn
        if limit is not None and len(ids) - seq.turn_start >= limit:
            return True
        if end is None or tok != end[-1] or ids[-len(end):] != end:
            return False
        turn = ids[seq.turn_start:]
        if strip_reasoning(self.tokenizer.decode(turn, skip_special_tokens=False))[1].endswith(
                self.format.call_end):  # the call closes inside a reasoning block: the turn goes on
            return False
        limit = self.settings.max_parallel_calls
        return limit == 1 or _count(turn, end) >= limit

    def on_turn_end(self, seq, budget: int) -> Future:
        """Parse the ended turn and start its tools; the Future resolves to a TurnOutcome."""
        st = seq.agent_state = seq.agent_state or TrajectoryStats()
        st.assistant_turns += 1
        turn = seq.token_ids[seq.turn_start:]
        seq.agent_turns = [*getattr(seq, "agent_turns", []), (seq.turn_start, len(seq.token_ids))]
        s = self.settings
        parsed = self.format.parse(self.tokenizer.decode(turn, skip_special_tokens=False), self.schemas)
        st.calls_in_reasoning += parsed.in_reasoning
        calls = parsed.calls
        cut_long = (s.max_tokens_per_turn is not None and len(turn) >= s.max_tokens_per_turn
                    and turn[-1] not in self.eos and not self._ends_with_call(turn))
        if cut_long:  # the turn ran into max_tokens_per_turn: what it was writing is unfinished
            st.cut = "turn_length"
            return _done(TurnOutcome(None, "length"))
        interaction = self._interaction(seq) if not calls else None
        if not calls and interaction is None:
            return _done(TurnOutcome(None, "stop"))
        if (s.max_assistant_turns and st.assistant_turns >= s.max_assistant_turns) or (
                s.max_user_turns and st.user_turns >= s.max_user_turns):
            st.cut = "turns"
            return _done(TurnOutcome(None, "stop"))
        if budget <= 0:  # not even an empty tool message fits
            st.cut = "length"
            return _done(TurnOutcome(None, "length"))
        ended_on = turn[-1] if turn[-1] in self.eos else None
        if interaction is not None:
            return self.pool.submit(self._interact, seq, st, interaction, ended_on, budget)
        st.dropped_calls += max(0, len(calls) - s.max_parallel_calls)
        return self.pool.submit(self._run_turn, st, calls[:s.max_parallel_calls], ended_on, budget,
                                self._tools_kwargs(seq.request_id))

    def begin(self, interaction_kwargs) -> None:
        """The per-prompt interaction kwargs of the next generate call (index = the engine's request id); None or
        empty entries: no interaction for that prompt."""
        self.requests = list(interaction_kwargs) if interaction_kwargs is not None else []

    def begin_batch(self, non_tensor: dict) -> None:
        """The engine-agent protocol's per-call start: the prompt batch's non-tensor entries (interaction kwargs, and
        each prompt's extra_info.tools_kwargs: a class tool's `create` gets its `create_kwargs`, as in verl)."""
        self.begin(non_tensor.get("interaction_kwargs"))
        extra = non_tensor.get("extra_info")
        self.tools_kwargs = [] if extra is None else [
            (e.get("tools_kwargs") or {}) if isinstance(e, dict) else {} for e in extra]

    def _tools_kwargs(self, request_id: int) -> dict:
        return self.tools_kwargs[request_id] if request_id < len(self.tools_kwargs) else {}

    def trajectory_stats(self, seq) -> dict:
        """The trajectory's counts, once it has ended; an interaction it started is finalized here."""
        started = getattr(seq, "interaction", None)
        if started is not None:
            finalize_interaction(started, str(seq.seq_id))
            seq.interaction = None
        return (seq.agent_state or TrajectoryStats()).as_dict()

    def _interaction(self, seq):
        if not self.interactions:
            return None
        kwargs = self.requests[seq.request_id] if seq.request_id < len(self.requests) else None
        if not kwargs:
            return None
        name = kwargs.get("name")
        if name not in self.interactions:
            raise ValueError(f"extra_info.interaction_kwargs.name={name!r} of prompt {seq.request_id}: no such "
                             f"interaction in {KEY.removesuffix('.enable')}.interaction_config_path "
                             f"(have {sorted(self.interactions)})")
        return self.interactions[name]

    def _ends_with_call(self, turn: list[int]) -> bool:
        end = self.call_end_ids
        return end is not None and turn[-len(end):] == end

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.call_pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ on the tool threads
    def _answer(self, call: ParsedCall, tools_kwargs: dict) -> tuple[str, dict]:
        """A call's tool message and the counts it adds (added by the turn's thread: calls run concurrently)."""
        if call.error is not None or call.name not in self.tools:
            text = call.error or f"Error: unknown tool {call.name!r}; available: {sorted(self.tools)}"
            return text, {"tool_calls": 1, "malformed_calls": 1, "tool_errors": 1}
        create_kwargs = (tools_kwargs.get(call.name) or {}).get("create_kwargs") or {}
        out = self.tools[call.name].run(call.arguments, create_kwargs=create_kwargs)
        s = self.settings
        counts = {"tool_calls": 1, "tool_time_s": out.seconds, "tool_errors": int(out.status != "ok"),
                  "tool_rewards": [] if out.reward is None else [out.reward],
                  "tool_crashes": int(out.status == "crash"), "tool_timeouts": int(out.status == "timeout"),
                  "truncated_responses": int(len(out.text) > s.max_tool_response_length)}
        return truncate_tool_response(out.text, s.max_tool_response_length, s.tool_response_truncate_side), counts

    def _interact(self, seq, st: TrajectoryStats, interaction, ended_on: int | None, budget: int) -> TurnOutcome:
        kwargs = dict(self.requests[seq.request_id])   # the name included, as verl passes it
        instance = str(seq.seq_id)
        if getattr(seq, "interaction", None) is None:
            run_interaction(interaction.start_interaction(instance, **kwargs))
            seq.interaction = interaction
        done, text, score, _ = run_interaction(interaction.generate_response(instance, self._messages(seq), **kwargs))
        if score is not None:   # verl adds no turn score for None
            st.turn_scores.append(float(score))
        if done:
            return TurnOutcome(None, "stop")
        return self._append(st, [text], "user", ended_on, budget)

    def _messages(self, seq) -> list[dict]:
        """The conversation as chat messages: the prompt (decoded, template text included) as a user message, then
        each assistant turn's text (decoded from the sequence: what the model wrote) and the messages appended
        after it (tool answers or the interaction's, as given)."""
        decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True).strip()  # noqa: E731
        ids, appended = seq.token_ids, seq.agent_state.appended
        messages = [{"role": "user", "content": decode(ids[:seq.num_prompt_tokens])}]
        for i, (start, end) in enumerate(seq.agent_turns):
            messages.append({"role": "assistant", "content": decode(ids[start:end])})
            messages.extend(appended[i] if i < len(appended) else [])
        return messages

    def _run_turn(self, st: TrajectoryStats, calls: list[ParsedCall], ended_on: int | None,
                  budget: int, tools_kwargs: dict) -> TurnOutcome:
        contents = []
        for future in [self.call_pool.submit(self._answer, call, tools_kwargs) for call in calls]:
            text, counts = future.result()
            contents.append(text)
            for key, value in counts.items():
                setattr(st, key, getattr(st, key) + value)
        return self._append(st, contents, "tool", ended_on, budget)

    def _append(self, st: TrajectoryStats, contents: list[str], role: str, ended_on: int | None,
                budget: int) -> TurnOutcome:
        """The tokens of `role` messages after the turn, or the end of the trajectory when they do not fit."""
        ids = message_ids(self.tokenizer, [{"role": role, "content": c} for c in contents],
                          self.eos_text[ended_on] if ended_on is not None else None, self.schemas)
        if len(ids) > budget:
            st.cut = "length"
            return TurnOutcome(None, "length")
        st.user_turns += 1
        st.interaction_turns += role == "user"
        st.appended.append([{"role": role, "content": c} for c in contents])
        return TurnOutcome(ids)
