"""TurnSync: the multi-turn decisions of an engine's TP group, made once and shared.

The TP ranks of one engine sample identical tokens (rollout/engine.py), so every decision taken from tokens alone —
where a turn ends, a turn budget, what the scheduler runs next — is already the same on each. What is not: a tool's
answer, an environment's reply and the moment either is known (threads, clocks, the outside world). Those are
made on one rank and broadcast.

Choices:
- The leader is rank 0 of the engine's TP group, and the broadcast runs over that group only (passed explicitly,
  never the default group: other engines' groups share the world). Only the leader runs the agent (tools,
  interactions, agent loops); the other ranks keep the same sequences and apply what the leader sends.
- One broadcast per engine step while some sequence waits on a turn outcome (none otherwise): the list of
  outcomes known at that step. The ranks apply the same outcomes at the same step, so their schedules, and hence
  their sampled tokens, stay identical while the other sequences keep decoding.
- An exception on the leader (the agent's own, not a tool's: those are answers) is broadcast and raised on every
  rank, so no rank is left waiting on a broadcast that never comes.
- Without a group (TP = 1) nothing is sent: the one rank leads.
"""

from __future__ import annotations

import torch.distributed as dist

__all__ = ["TurnSync"]


class TurnSync:
    def __init__(self, tp_group=None):
        self.group = tp_group if tp_group is not None and dist.get_world_size(tp_group) > 1 else None
        self.leads = self.group is None or dist.get_rank(self.group) == 0

    def share(self, make):
        """`make()` on the leader, its value on every rank (an exception it raised is raised on every rank)."""
        if self.group is None:
            return make()
        box = [None]
        if self.leads:
            try:
                box[0] = (True, make())
            except Exception as e:  # noqa: BLE001 - re-raised below, after the other ranks were told
                box[0] = (False, e)
        dist.broadcast_object_list(box, group=self.group, group_src=0)
        ok, value = box[0]
        if not ok:
            raise value
        return value
