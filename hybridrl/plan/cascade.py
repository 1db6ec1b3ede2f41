"""The cascade decode forecast of `hybridrl config check`: whether the engine will read each prompt's K/V once for
its samples (rollout/shared_prefix.py, rollout/triton_decode.py) at the step's longest prompts.

The engine decides per decode step from the groups it finds in its block tables; the forecast applies the same
rule (`cascade_pays`: the groups' prefixes, each counted once, reach the GPU's L2 a layer) to the start of a
rollout, when every group is whole: the prompts one engine runs at once (its share of the step's, at most
max_num_seqs // n), each shared in full blocks by its samples, cut into parts of at most `prefix_members` rows
(each part reads its prefix once). As samples finish, groups thin out, so the cascade runs at most this long.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridrl.config.sections.rollout import ROLLOUT
from hybridrl.device_peaks import peaks_of
from hybridrl.models.fused import head_dim_fits
from hybridrl.plan.sizing import Sizing
from hybridrl.rollout.shared_prefix import (
    MIN_L2_FRACTION,
    MIN_PREFIX_TOKENS,
    cascade_pays,
    cascade_switched_off,
    prefix_members,
)


@dataclass(frozen=True)
class CascadeForecast:
    off: str | None = None      # why the engine never runs it here; None: its rule decides per step
    prompts: int = 0            # prompt groups decoding at once on one engine
    shared_tokens: int = 0      # a prompt's tokens in full blocks (what its samples share)
    parts: int = 0              # prefix reads a layer (groups cut into parts of at most prefix_members rows)
    prefix_bytes: int = 0       # those reads' K/V a layer on one engine
    l2_bytes: int | None = None  # the GPU's L2 (device_peaks); None: unknown

    @property
    def engages(self) -> bool | None:
        """The rule's answer at the rollout's start; None where the L2 is unknown."""
        if self.off is not None:
            return False
        return None if self.l2_bytes is None else cascade_pays(self.prefix_bytes, self.l2_bytes)

    def __str__(self) -> str:
        if self.off is not None:
            return f"cascade decode  off: {self.off}"
        held = (f"{self.prompts} prompts x {self.shared_tokens} shared tokens: {self.prefix_bytes / 1e6:.1f} MB of "
                f"K/V a layer, read once per group ({self.parts} groups),")
        if self.l2_bytes is None:
            return (f"cascade decode  {held} against an L2 not known here: on while the live groups' prefixes "
                    f"reach the GPU's L2 (x{MIN_L2_FRACTION:g}), decided per step")
        l2 = f"{self.l2_bytes / 2**20:.0f} MiB of L2 (x{MIN_L2_FRACTION:g})"
        if self.engages:
            return (f"cascade decode  {held} over {l2}: on from the first decode step while the groups stay large "
                    "enough (rollout/num_cascade_steps counts the steps)")
        return (f"cascade decode  {held} under {l2}: off at these prompts (the samples' repeated reads are L2 "
                "hits)")


def forecast_cascade(sizing: Sizing, max_num_seqs: int, dtype_bytes: int) -> CascadeForecast:
    """The forecast for this run's rollout on its planned device (see the module notes)."""
    get, layout, shape = sizing.get, sizing.layout, sizing.shape
    block = get(f"{ROLLOUT}.block_size")
    members = prefix_members(max(1, shape.heads // shape.kv_heads))
    shared = sizing.prompt_len // block * block
    reasons = [why for why, bad in (
        ("no GPU", sizing.device.type != "cuda"),
        ("HYBRIDRL_CASCADE=0", cascade_switched_off()),
        (f"'{ROLLOUT}.enable_prefix_sharing' is false", not get(f"{ROLLOUT}.enable_prefix_sharing")),
        ("one sample per prompt (n = 1)", layout.n < 2),
        (f"{shape.heads // shape.kv_heads} query heads per K/V head (its kernel stacks a group's rows x heads into "
         "64-row tiles: at most 32)", members < 2),
        (f"head_dim {shape.head_dim} is not a power of two (the Triton decode kernel's)",
         not head_dim_fits(shape.head_dim)),
        (f"prompts of at most {sizing.prompt_len} tokens share fewer than {MIN_PREFIX_TOKENS} in full blocks",
         shared < MIN_PREFIX_TOKENS)) if bad]
    if reasons:
        return CascadeForecast(off="; ".join(reasons))
    prompts = max(1, min(layout.rollout_prompts_per_dp, max_num_seqs // layout.n))
    parts = prompts * -(-layout.n // members)
    kv_heads = max(1, shape.kv_heads // layout.rollout_tp)
    token_bytes = 2 * kv_heads * shape.head_dim * dtype_bytes
    peaks = peaks_of(sizing.device.name)
    return CascadeForecast(prompts=prompts, shared_tokens=shared, parts=parts, prefix_bytes=parts * shared * token_bytes,
                           l2_bytes=peaks.l2_bytes if peaks else None)
