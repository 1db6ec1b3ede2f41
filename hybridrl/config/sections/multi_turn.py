"""`actor_rollout_ref.rollout.multi_turn`: tools, interactions and agent loops in the native engine."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from hybridrl.config.sections.base import Section
from hybridrl.config.sections.rules import Findings


@dataclass(frozen=True)
class MultiTurnConfig(Section):
    """`actor_rollout_ref.rollout.multi_turn`."""

    enable: bool
    """multi-turn in the native engine: a turn ends at eos or a tool call, the tools (or an interaction, or your agent
    loop) answer, generation goes on from the cached KV; their tokens are masked out of the loss"""
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
    """YAML listing the tools (verl's tool config; built-ins: class_name hybridrl.tools.builtin.calculator / .python);
    multi-turn needs this, interaction_config_path or agent_loop.path"""
    interaction_config_path: str | None
    """verl's interaction YAML (simulated users answering a turn without a tool call, chosen per sample by
    extra_info.interaction_kwargs.name; built in: hybridrl.rollout.interactions.Gsm8kInteraction)"""
    format: Literal["hermes", "qwen3_coder", "llama3_json"]
    """tool-call format: hermes (<tool_call>{"name": ..., "arguments": {...}}</tool_call>, Qwen2.5) | qwen3_coder
    (<tool_call><function=NAME><parameter=P>VALUE</parameter></function></tool_call>) | llama3_json (the turn is
    {"name": ..., "parameters": {...}}, Llama 3.1/3.2); calls inside <think> blocks are not run (counted)"""
    max_tokens_per_turn: int | None
    """tokens one assistant turn may take (null = only the response budget bounds it); a turn that reaches it ends the
    trajectory with finish_reason length (counted: multi_turn/cut_by_turn_length)"""
    agent_loop: AgentLoopConfig
    """your own environment loop instead of the tool agent (hybridrl.rollout.agent_loop; docs/architecture.md
    "Multi-turn")"""

    def check(self, rollout_name: str, found: Findings) -> None:
        """Turn and call limits; with `enable`, what answers the turns (files that exist) and the native engine."""
        key = "actor_rollout_ref.rollout.multi_turn"
        for name in ("max_assistant_turns", "max_user_turns", "max_tokens_per_turn"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                found.errors.append(f"'{key}.{name}' = {getattr(self, name)} must be null (no limit) or >= 1")
        for name in ("max_parallel_calls", "max_tool_response_length"):
            if getattr(self, name) < 1:
                found.errors.append(f"'{key}.{name}' = {getattr(self, name)} must be >= 1")
        if not self.enable:
            return
        loop = self.agent_loop
        if self.tool_config_path is None and self.interaction_config_path is None and loop.path is None:
            found.errors.append(f"'{key}.enable' = true needs '{key}.tool_config_path' (a YAML listing the tools), "
                                f"'{key}.interaction_config_path' (verl's interaction YAML) or '{key}.agent_loop.path' "
                                "(your AgentLoop's file)")
        for name, path in (("tool_config_path", self.tool_config_path),
                           ("interaction_config_path", self.interaction_config_path), ("agent_loop.path", loop.path)):
            if path is not None and not Path(os.path.expanduser(path)).is_file():
                found.errors.append(f"'{key}.{name}' = {path!r}: no such file")
        if loop.path is not None:
            if not loop.name:
                found.errors.append(f"'{key}.agent_loop.name' = {loop.name!r}: name the AgentLoop subclass in "
                                    f"'{key}.agent_loop.path'")
            for name in ("tool_config_path", "interaction_config_path"):
                if getattr(self, name) is not None:
                    found.errors.append(f"'{key}.{name}' = {getattr(self, name)!r} with '{key}.agent_loop.path': the "
                                        "agent loop replaces the tool agent; set one of them to null")
        if rollout_name != "native":
            found.errors.append(f"'{key}.enable' = true runs in the native engine: 'actor_rollout_ref.rollout.name' = "
                                f"{rollout_name!r} must be 'native'")


@dataclass(frozen=True)
class AgentLoopConfig(Section):
    """`actor_rollout_ref.rollout.multi_turn.agent_loop`."""

    path: str | None
    """a Python file defining an AgentLoop subclass: per trajectory run(traj) gets the prompt and `await
    traj.generate(env_token_ids)` on the cached KV, and returns the reward (or None: the reward function scores);
    tool_config_path and interaction_config_path must then be null"""
    name: str | None
    """the class's name in that file"""
    kwargs: dict
    """keyword arguments for its constructor (after the tokenizer)"""
