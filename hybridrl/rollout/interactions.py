"""verl's interactions: a simulated user (or any environment) that answers an assistant turn that made no tool call
(`actor_rollout_ref.rollout.multi_turn.interaction_config_path`).

The config is verl's YAML, a list under `interaction`:

    interaction:
      - name: gsm8k                                  # optional; default as verl's: the class name without its
                                                     # "Interaction" suffix, lowercased (Gsm8kInteraction -> gsm8k)
        class_name: hybridrl.rollout.interactions.Gsm8kInteraction   # verl.interactions.* names map here too
        config: {}                                            # passed to the constructor
      - name: add
        class_name: feedback.py:AdditionInteraction           # FILE.py:Class: a file, relative to the YAML's folder

A class has verl's `BaseInteraction` shape, its methods plain or `async`:
`start_interaction(instance_id, **interaction_kwargs)`, `generate_response(instance_id, messages,
**interaction_kwargs) -> (done, text, score, extra)`, `finalize_interaction(instance_id)` (or verl's base
signature `finalize_interaction()`, called without the id). A sample chooses its interaction with
`extra_info.interaction_kwargs.name` (the dataset copies `extra_info.interaction_kwargs` into the batch as verl
does); all its kwargs, the name included as verl passes it, go to every call. A turn whose score is None adds no
turn score (verl skips it too).

Choices:
- Methods run on the agent's turn threads; a coroutine is run to completion there (`asyncio.run`), so verl's
  async interactions work unchanged and the engine keeps decoding meanwhile.
- `messages` holds the conversation as chat messages: the prompt's (when the batch carries them), then each
  assistant turn's text and each tool / user message appended after it.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

from hybridrl.awaiting import resolved

__all__ = ["Gsm8kInteraction", "load_interactions"]

KEY = "actor_rollout_ref.rollout.multi_turn.interaction_config_path"
VERL_ALIASES = {"verl.interactions.gsm8k_interaction.Gsm8kInteraction": "hybridrl.rollout.interactions.Gsm8kInteraction"}


def default_name(class_name: str) -> str:
    """verl's name for an interaction entry without one: the class name without "Interaction", lowercased."""
    return class_name.removesuffix("Interaction").lower()


def finalize(interaction, instance_id: str) -> None:
    """`finalize_interaction(instance_id)`, or `finalize_interaction()` for a class keeping verl's base signature."""
    try:
        takes_id = bool(inspect.signature(interaction.finalize_interaction).parameters)
    except (TypeError, ValueError):   # a builtin or C callable: give it the id
        takes_id = True
    resolved(interaction.finalize_interaction(instance_id) if takes_id else interaction.finalize_interaction())


class Gsm8kInteraction:
    """GSM8K feedback: the latest assistant answer is scored by verl's GSM8K scorer (flexible: the last number); a
    correct one ends the trajectory ("Your response is correct!", score 1.0), a wrong one asks to try again
    (score 0.0), as verl's gsm8k_interaction does."""

    def __init__(self, config: dict | None = None):
        self.config = dict(config or {})
        self._truth: dict[str, str] = {}

    def start_interaction(self, instance_id: str, ground_truth=None, **kwargs) -> str:
        self._truth[instance_id] = ground_truth
        return instance_id

    def generate_response(self, instance_id: str, messages: list[dict], **kwargs):
        from hybridrl.rewards.verl_compat.gsm8k import compute_score

        content = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"), "")
        answer = content if content.startswith("#### ") else "#### " + content
        score = float(compute_score(answer, self._truth[instance_id], method="flexible", format_score=0.0, score=1.0))
        if score == 1.0:
            return True, "Your response is correct!", score, {}
        return False, "Your response is incorrect! You need to reflect on your answer and try again.", score, {}

    def finalize_interaction(self, instance_id: str, **kwargs) -> None:
        self._truth.pop(instance_id, None)


def _import(class_name: str, folder: Path):
    """(class, where it came from, its name): `module.Class`, or `FILE.py:Class` imported from FILE (a relative
    path is relative to `folder`, the YAML's: a recipe's interaction can live beside its config)."""
    if ".py:" in class_name:
        from hybridrl.rewards.custom import import_from_file

        file, _, cls_name = class_name.rpartition(":")
        path = (folder / Path(file).expanduser()).resolve()
        return import_from_file(path, cls_name, key="interaction"), f"{path}:{cls_name}", cls_name
    path = VERL_ALIASES.get(class_name, class_name)
    module, _, cls_name = path.rpartition(".")
    return getattr(importlib.import_module(module), cls_name), path, cls_name


def _build(entry, where: str, folder: Path = Path(".")):
    if not isinstance(entry, dict) or not isinstance(entry.get("class_name"), str):
        raise ValueError(f"{where}: each interaction needs a class_name (module.Class or FILE.py:Class), got "
                         f"{entry!r}")
    try:
        cls, path, cls_name = _import(entry["class_name"], folder)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"{where}: class_name {entry['class_name']!r} cannot be imported ({e})") from e
    missing = [m for m in ("start_interaction", "generate_response", "finalize_interaction") if not hasattr(cls, m)]
    if missing:
        raise ValueError(f"{where}: {path} lacks {missing} (verl's BaseInteraction methods)")
    config = entry.get("config") or {}
    name = entry.get("name") or default_name(cls_name)
    return name, cls({**config, "name": name})


def load_interactions(path: str | Path) -> dict:
    """{interaction name: instance} from verl's interaction YAML; ValueError naming the file and entry."""
    from hybridrl.tools.registry import yaml_entries

    path = Path(path).expanduser()
    entries = yaml_entries(path, KEY, "interaction")
    out = {}
    for i, entry in enumerate(entries):
        name, instance = _build(entry, f"{path}: interaction[{i}]", path.parent)
        if name in out:
            raise ValueError(f"{path}: interaction[{i}]: the name {name!r} is used twice")
        out[name] = instance
    return out
