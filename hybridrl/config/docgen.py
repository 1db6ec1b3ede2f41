"""Generate docs/config.md from the config's section dataclasses and the packaged YAML files.

    python -m hybridrl.config.docgen > docs/config.md

The dataclasses give the keys (in order), each key's type and allowed values (its annotation) and its meaning (the
string below the field); the YAML gives the defaults exactly as written (a line scan, so `${...}` interpolations
and `1.0e-6` show as in the file) and a file's header comment. Types come from the annotations the validator
checks, so the reference cannot disagree with what load_config accepts. A test compares the committed file with
this output.
"""

from __future__ import annotations

import re
import sys
from typing import get_args, get_origin

from hybridrl.config.schema import (
    ALIAS_NOTES,
    ALIASES,
    CONFIG_DIR,
    KEY_EQUALS,
    KEY_RENAMES,
    SFT_KEY_EQUALS,
    SFT_KEY_RENAMES,
    SFT_REFUSED,
    VERL_REFUSED,
    allowed_values,
    is_section,
)
from hybridrl.config.sections import ROOTS
from hybridrl.config.sections.base import Section, field_docs, field_types, members, type_name
from hybridrl.config.verl_defaults import SFT_ANY_VALUE, VERL_ANY_VALUE

_KEY = re.compile(r"^(\s*)([A-Za-z_][\w\-]*):(.*)$")


def _split_comment(rest: str) -> str:
    quote = None
    for i, ch in enumerate(rest):
        if ch in "'\"":
            quote = None if quote == ch else (quote or ch)
        elif ch == "#" and quote is None and (i == 0 or rest[i - 1].isspace()):
            return rest[:i].strip()
    return rest.strip()


def scan_yaml(text: str) -> tuple[str, dict[str, str]]:
    """(the header comment, {dotted key: its value as written})."""
    header: list[str] = []
    stack: list[tuple[int, str]] = []
    out: dict[str, str] = {}
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#") and not out:
            header.append(stripped.lstrip("#").strip())
        m = _KEY.match(line)
        if not m:
            continue
        indent, key, rest = len(m.group(1)), m.group(2), m.group(3)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        out[".".join([k for _, k in stack] + [key])] = _split_comment(rest)
        stack.append((indent, key))
    return " ".join(header), out


def _fields(cls: type[Section], prefix: str = ""):
    """(dotted key, annotation, meaning) of every leaf field, in declaration order."""
    docs = field_docs(cls)
    for name, ann in field_types(cls).items():
        if is_section(ann):
            yield from _fields(ann, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", ann, docs.get(name, "")


def _type_cell(ann) -> str:
    parts = [f"list[{type_name(get_args(m)[0])}]" if get_origin(m) is list else type_name(m)
             for m in members(ann) if m is not type(None)]
    name = " | ".join(dict.fromkeys(parts)) + (" or null" if type(None) in members(ann) else "")
    allowed = allowed_values(ann, registered=False)
    return name + (": " + ", ".join(f"`{v}`" for v in allowed) if allowed else "")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_file(name: str) -> str:
    path = CONFIG_DIR / f"{name}.yaml"
    header, written = scan_yaml(path.read_text())
    lines = [f"## {path.name}", ""]
    if header:
        lines += [header, ""]
    section = None
    for key, ann, meaning in _fields(ROOTS[name]):
        top = key.split(".")[0]
        if top != section:
            section = top
            lines += ["", f"### {top}", "", "| key | default | type | meaning |", "|---|---|---|---|"]
        if key in ALIASES:
            spellings = ", ".join(f"`{a}` = `{c}`" for a, c in ALIASES[key].items())
            meaning += f" (verl spellings accepted: {spellings})"
        lines.append(f"| `{key}` | `{_cell(written[key])}` | {_cell(_type_cell(ann))} | {_cell(meaning.strip())} |")
    return "\n".join(lines) + "\n"


INTRO = """# Configuration reference

Generated from the config's section dataclasses (`hybridrl/config/sections/`) and the defaults in
`hybridrl/config/*.yaml` by `python -m hybridrl.config.docgen > docs/config.md`; do not
edit by hand (`tests/config/test_docgen.py` fails when the two differ). Key names follow verl.

Setting keys (later wins): the packaged defaults, then `--config FILE` (nested YAML like verl's; dotted
keys such as `actor_rollout_ref.actor.fsdp_config.param_offload: false` are accepted too), then
command-line overrides:

- `a.b=value` sets an existing key; the value is YAML (`8`, `1e-6`, `true`, `null`, `[console,wandb]`).
  An unknown key is an error that names the closest known key; a verl key with no counterpart here (vLLM engine
  settings, megatron, torch.compile, ...; `schema.VERL_REFUSED`) is refused saying why and what to do instead.
- verl's full generated config (`_generated_ppo_trainer.yaml`, every key at its default) loads as it is: its ~350
  keys that hybridrl has no use for (profilers, Hydra `_target_` classes, worker and server settings, features off
  by default; `hybridrl/config/verl/ppo_trainer_defaults.yaml`) are dropped where they hold exactly verl's default
  and named in one warning; at any other value such a key is refused, naming verl's default. Where verl writes null
  for "not set" (micro-batch sizes, `optim.warmup_style`; `verl_defaults.UNSET_WHEN_NULL`), the key keeps its
  default here (`auto`: the run plan's choice). `data.seed: null` (verl's default) draws the data order's seed when
  the run starts, prints it, and saves it with the checkpoints; a resume reads it back.
- `+a.b=value` adds a key; allowed only inside free dicts (default `{}`, e.g.
  `+actor_rollout_ref.model.override_config.attention_dropout=0.1`).
- `++a.b=value` sets or adds.
- verl's newer DAPO recipes pass the overlong buffer as `+reward_model.reward_kwargs.overlong_buffer_cfg.{enable,len,
  penalty_factor,log}`: read as `reward_model.overlong_buffer.*` (logged); their `reward_kwargs.max_resp_len` is
  accepted where it equals `data.max_response_length`, from which the buffer counts; likewise
  `actor_rollout_ref.ref.ulysses_sequence_parallel_size` where it equals the actor's (the reference runs on its mesh).
  verl's `actor.checkpoint.save_contents` is read as `actor.checkpoint.contents`, and its `load_contents` is accepted
  where it equals them (a resume loads what was saved).

`hybridrl config check FILE [overrides]` validates a config (types, allowed values, batch arithmetic,
mesh divisibility) and prints the device layout; `hybridrl config show` prints the resolved YAML.

**LoRA** (`actor_rollout_ref.model.lora_rank` > 0; needs `pip install -e '.[lora]'`): peft adapters on the
`target_modules` of the actor (`all-linear`: q/k/v/o and gate/up/down projections) and, on a mixture-of-experts
model, the expert tensors `target_parameters` names (`[experts.gate_up_proj, experts.down_proj]`: peft's
ParamWrapper, a rank-r A and B per expert), injected before FSDP. Only the
adapters are trained and kept in optimizer state (the run plan counts gradients and AdamW state for them alone);
they are stored in `fsdp_config.model_dtype`, while the frozen base is stored in the compute dtype (bf16 on GPUs,
fp32 on CPU; never wider than `model_dtype`), since FSDP's `mixed_precision.param_dtype` casts it to that anyway.
The reference policy (KL) is the actor's module with its
adapters switched off, so no reference copy is built. Each rollout streams merged weights W + (lora_alpha /
lora_rank)·B·A to the engine (per expert for expert tensors, which are therefore never used in place from
the actor), summed in fp32 per tensor on each rank's own rows. Checkpoints hold base and adapters (exact
resume); `hybridrl merge` writes the merged model and the adapter in peft's format under `adapter/`. Measured at
7B on one H200 (docs/benchmarks.md §0d) and on the real model (§0b). Not done: QLoRA (a quantized frozen base);
verl's `use_shm` and `layered_summon` are refused as unknown keys (the engine always receives the merged weights
one tensor at a time, which is what `layered_summon` buys in verl).

**Reward models** (`reward_model.enable=true`). `style: model` (verl's RewardModelWorker): a HF
`...ForSequenceClassification` checkpoint with num_labels=1 at `reward_model.model.path` runs as its own worker
group colocated on the training GPUs, FSDP2-sharded, in bf16 on GPUs (it never trains), its shards on the CPU
outside the reward phase unless `model.fsdp_config.param_offload=false`; the run plan counts its weights in every
phase where they are on the GPU and predicts a `reward_model` phase. It reads the policy's token ids when it shares
the policy's tokenizer and chat template (`model.input_tokenizer: null`, checked at load); with `input_tokenizer`
set to the policy's tokenizer (and `data.return_raw_chat=true`) each response is decoded and the chat re-rendered
with the reward model's own template. The score is the head's output at the input's last token, placed as the
token-level reward of the last valid response token (verl's `rm_scores`). On GPUs its forwards are token-budgeted
(`use_dynamic_bsz`, `forward_max_token_len_per_gpu`, verl's keys): the inputs sorted by length, each forward as many
as fit the budget counted padded, so long-tailed responses cost few forwards and little padding. `style: judge`: the policy itself judges,
through its rollout engine (greedy, `judge.max_tokens`), each response rendered into `judge.prompt_template`; the
last match of `judge.score_pattern` is the score. Combining with rule rewards, as verl: the model's score *is* the
reward and no rule scorer runs; a `custom_reward_function` must take an `rm_score` argument (`rm_scores` with
`reward_manager: batch`), receives the sample's model score with the usual arguments and returns the reward, e.g.
`return default_compute_score(data_source, solution_str, ground_truth) + 0.1 * rm_score` (`from hybridrl.rewards
import default_compute_score`); one without it is refused at start. Validation scores the same way; a function
returning `{"score": rm_score, "acc": rule}` trains on the model's score alone while validation reports the rule
as `val-core/{data_source}/acc` and the model's score as `val-aux/{data_source}/reward` (recipe:
`examples/smollm2_reward_model/`, which also trains the reward model from the policy's own samples). Metrics:
`reward_model/score/{mean,max,min}`, `reward_model/truncated` (inputs cut to `max_length`),
`reward_model/judge_failures` (unparsable verdicts and judge prompts too long for the engine, each scored 0; the
reward error guard counts them), `reward_model/judge_overlong`, `timing_s/reward`,
`memory/reward_model/peak_allocated_gb` on GPUs. Not done: a separate resource pool (`enable_resource_pool`), dynamic
batch size, Ulysses and remove-padding for the reward model, a second model as judge (verl's GenRM server).

**Multi-turn tool use** (`actor_rollout_ref.rollout.multi_turn.enable`, verl's keys; example:
`examples/multiturn_calculator/`): prompts are rendered with the tools of `tool_config_path` (the chat template's
`tools=`); in the native engine an assistant turn ends at eos or once it holds `max_parallel_calls` Hermes tool calls
(`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`), the calls run on a thread pool while the engine keeps
decoding the other sequences, the answers are appended as `tool` messages tokenized exactly as the chat template
writes them, and generation continues from the sequence's cached KV (only the new tokens are prefilled).
`response_length` bounds model and tool tokens together; tool tokens are in `responses` and attended, but
`response_mask` is 0 on them (no loss, advantage or KL) and their `rollout_log_probs` are 0. Malformed calls,
unknown tools, crashes and timeouts become "Error: ..." tool messages; each is counted. Metrics per step:
`num_turns/{min,max,mean}`, `tool_call_counts/{min,max,mean}` (verl's) and `multi_turn/{tool_use_rate, tool_calls,
tool_errors, tool_timeouts, tool_crashes, malformed_calls, dropped_calls, calls_in_reasoning, truncated_responses,
tool_time_s, tool_time_s_max, cut_by_turns, cut_by_length, cut_by_turn_length, masked_tokens}` (`tool_use_rate`: the fraction of trajectories with at
least one tool call); validation reports the same over all its samples under `val-aux/` (but `masked_tokens`), e.g.
`val-aux/multi_turn/tool_use_rate`, `val-aux/num_turns/mean` (verl's). A model whose template cannot render tools
gets one through `actor_rollout_ref.model.custom_chat_template`. Recipe `examples/smollm2_tools/run.sh`:
SmolLM2-135M-Instruct with a Hermes tool template for its ChatML (`chat_template.jinja`), an SFT warm-up on bignum
tool-call traces (`hybridrl sft data.multiturn.enable=true`: `messages` rows with assistant `tool_calls` and `tool`
messages, laid out as the rollout lays them out, loss on the assistant's tokens only), then multi-turn GRPO with the
calculator, validation reporting `val-core/bignum/acc/mean@1` and the tool-use rate; one GPU, run end to end on CPU
with a tiny model, not measured on a GPU yet. Tool config entries: `class_name` (`hybridrl.tools.builtin.calculator`,
`hybridrl.tools.builtin.python`, any `module.function` returning a string, or a `module.Class` with verl's BaseTool
interface, built once with `(config, tool_schema)` and driven create / execute / release per call with the sample's
`extra_info.tools_kwargs.<tool>.create_kwargs`; the last two need a `tool_schema`), `config.type: native`, `config.timeout_s` (default 30), `config.memory_mb` (python). Tool-call formats
(`multi_turn.format`): `hermes`, `qwen3_coder`, `llama3_json`; calls inside `<think>` blocks are not run. verl's
interactions (`interaction_config_path`, verl's YAML: a list under `interaction` of `name`, `class_name`, `config`;
built in: `hybridrl.rollout.interactions.Gsm8kInteraction`, also under verl's class name; `FILE.py:Class` names a
class in a file, relative to the YAML; an entry without `name` is named as verl names it, the class name without
"Interaction", lowercased) answer a turn without a tool call with a user message, chosen per sample by
`extra_info.interaction_kwargs.name` (all its keys, e.g. `ground_truth`, are passed to the interaction, as verl
passes them); their scores (None: no score for that turn) are in each sample's `multi_turn_stats.turn_scores`, and a
reward function's `extra_info` holds the trajectory's `num_turns`, `turn_scores` and `tool_rewards` (a class tool's
step rewards), as verl's managers add them. Recipe `examples/smollm2_interaction/run.sh`:
SmolLM2-135M-Instruct learns a + b with a simulated user that says "incorrect, try again" and allows up to two
retries (`max_user_turns=2`); run on CPU with a tiny model, not measured on a GPU yet.
With `tensor_model_parallel_size` > 1 the tools run once per engine, on rank 0 of its TP group, and their answers are
broadcast over that group with the turn's other decisions, so every rank resumes the same sequences at the same
step. **Agent loops** (`multi_turn.agent_loop.path` / `.name` / `.kwargs`; example `examples/agent_loop_guess/`):
your `hybridrl.rollout.agent_loop.AgentLoop` subclass drives each trajectory as a coroutine, `turn = await
traj.generate(env_token_ids)` returning the model's next turn on the cached KV (token ids in and out;
`traj.user_message(text)` renders a user message), and `run` returning the reward, which replaces the reward
function for that sample. `traj.row` holds the prompt's data (ground truth, extra info), and `traj.fork(ids)` adds
a branch that becomes one more sample of the prompt, grouped under its uid for GRPO. Limits are counted by cause:
`multi_turn/cut_by_max_tokens` and `cut_by_max_model_len` (the engine ended a trajectory mid-turn at the response
budget or at the model length the KV was sized for), beside the turn and length cuts. Not supported: MCP tools.
"""


def _key_rows(renames: dict, equals: dict, any_value: dict, refused: dict) -> list[str]:
    """The table rows of one config's verl keys: renamed, tied to another key, accepted at any value, refused."""
    return ([f"| `{old}` | read as `{new}`, with a warning |" for old, new in renames.items()]
            + [f"| `{key}` | accepted only where it equals `{target}`: {_cell(rule)} |"
               for key, (target, rule) in equals.items()]
            + [f"| `{key}` | accepted at any value, which changes nothing: {_cell(why)} |"
               for key, why in any_value.items()]
            + [f"| `{key}` | refused: {_cell(why)} |" for key, why in refused.items()])


def render_verl_keys() -> str:
    """The verl keys read under another spelling, accepted only at one value, or refused (schema's tables)."""
    lines = ["## verl keys read differently", "",
             "The tables above use verl's key names. These verl keys are read differently "
             "(`hybridrl/config/schema.py`); any other verl key missing from the tables is refused as unknown, naming "
             "the closest key, unless it holds exactly verl's default (`hybridrl/config/verl/ppo_trainer_defaults.yaml`"
             ": dropped, with a warning):", "",
             "| verl key | here |", "|---|---|"]
    for key, table in ALIASES.items():
        spellings = ", ".join(f"`{a}` as `{c}`" for a, c in table.items())
        note = ALIAS_NOTES.get(key)
        lines.append(f"| `{key}` values | {spellings}, with a warning" + (f": {_cell(note)}" if note else "") + " |")
    lines += _key_rows(KEY_RENAMES, KEY_EQUALS, VERL_ANY_VALUE, VERL_REFUSED)
    lines += ["", "verl's SFT trainer keys (`sft_trainer.yaml`, its optimizer defaults included) in the SFT config; at "
              "verl's default, any other of its keys is dropped with a warning "
              "(`hybridrl/config/verl/sft_trainer_defaults.yaml`):", "", "| verl key | here |", "|---|---|"]
    lines += _key_rows(SFT_KEY_RENAMES, SFT_KEY_EQUALS, SFT_ANY_VALUE, SFT_REFUSED)
    return "\n".join(lines) + "\n"


def render_all() -> str:
    return INTRO + "".join("\n" + render_file(name) for name in ROOTS) + "\n" + render_verl_keys()


def main() -> None:
    sys.stdout.write(render_all())


if __name__ == "__main__":
    main()
