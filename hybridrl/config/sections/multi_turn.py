"""`actor_rollout_ref.rollout.multi_turn`: tools, interactions and agent loops in the native engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hybridrl.config.sections.base import Section


@dataclass(frozen=True)
class MultiTurnConfig(Section):
    """`actor_rollout_ref.rollout.multi_turn`."""

    enable: bool
    """multi-turn in the native engine: a turn ends at eos or a tool call, the tools (or an interaction, or your agent loop) answer, generation goes on from the cached KV; their tokens are masked out of the loss"""
    max_assistant_turns: int | None
    """assistant turns per trajectory at most (null = only response_length bounds it)"""
    max_user_turns: int | None
    """tool-message turns per trajectory at most (null = no limit)"""
    max_parallel_calls: int
    """tool calls per assistant turn: the turn ends once it holds this many (more are dropped, counted)"""
    max_tool_response_length: int
    """characters of a tool's answer kept (cut as verl does, counted)"""
    tool_response_truncate_side: Literal["left", "middle", "right"]
    """which part of a long tool answer is kept: left (the start) | middle (both ends) | right (the end)"""
    tool_config_path: str | None
    """YAML listing the tools (verl's tool config; built-ins: class_name hybridrl.tools.builtin.calculator / .python); multi-turn needs this, interaction_config_path or agent_loop.path"""
    interaction_config_path: str | None
    """verl's interaction YAML (simulated users answering a turn without a tool call, chosen per sample by extra_info.interaction_kwargs.name; built in: hybridrl.rollout.interactions.Gsm8kInteraction)"""
    format: Literal["hermes", "qwen3_coder", "llama3_json"]
    """tool-call format: hermes (<tool_call>{"name": ..., "arguments": {...}}</tool_call>, Qwen2.5) | qwen3_coder (<tool_call><function=NAME><parameter=P>VALUE</parameter></function></tool_call>) | llama3_json (the turn is {"name": ..., "parameters": {...}}, Llama 3.1/3.2); calls inside <think> blocks are not run (counted)"""
    max_tokens_per_turn: int | None
    """tokens one assistant turn may take (null = only the response budget bounds it); a turn that reaches it ends the trajectory with finish_reason length (counted: multi_turn/cut_by_turn_length)"""
    agent_loop: AgentLoopConfig
    """your own environment loop instead of the tool agent (hybridrl.rollout.agent_loop; docs/architecture.md "Multi-turn")"""


@dataclass(frozen=True)
class AgentLoopConfig(Section):
    """`actor_rollout_ref.rollout.multi_turn.agent_loop`."""

    path: str | None
    """a Python file defining an AgentLoop subclass: per trajectory run(traj) gets the prompt and `await traj.generate(env_token_ids)` on the cached KV, and returns the reward (or None: the reward function scores); tool_config_path and interaction_config_path must then be null"""
    name: str | None
    """the class's name in that file"""
    kwargs: dict
    """keyword arguments for its constructor (after the tokenizer)"""
