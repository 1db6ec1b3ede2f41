"""Wiring of a PPO/GRPO run: Ray, worker groups, data, rewards, loggers, checkpoints → RayPPOTrainer.fit().

Kept apart from the fit loop so the loop reads as the algorithm and this file as the deployment.
Everything a user can get wrong (files, reward function, batch arithmetic) is checked here before any worker starts.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from hybridrl.config.paths import check_paths, files_problem, model_dir_problem
from hybridrl.config.sections import PPOConfig
from hybridrl.config.sections.multi_turn import MultiTurnConfig
from hybridrl.data.rl_dataset import dataset_metrics
from hybridrl.models.external_lib import import_external_lib
from hybridrl.seeding import seed_everything
from hybridrl.trainer.ppo_trainer import RayPPOTrainer, need_critic, need_reference
from hybridrl.trainer.run_dir import claim_run_dir, run_log_dirs
from hybridrl.trainer.tracking import format_duration, logger_names


def _files(value, key: str) -> list[str]:
    problem = files_problem(value, key)
    if problem:
        raise FileNotFoundError(problem)
    return [os.path.expanduser(str(v)) for v in ([value] if isinstance(value, str) else list(value))]


def check_model_dir(path: str, key: str) -> str:
    """`path` expanded, once it is a directory holding config.json; else an error naming the key, the directory and
    what is missing (a half-copied or empty model directory otherwise fails later in the tokenizer or a worker)."""
    problem = model_dir_problem(path, key)
    if problem:
        raise FileNotFoundError(problem)
    return os.path.expanduser(str(path))


def prompt_tools(multi_turn: MultiTurnConfig) -> list[dict] | None:
    """The tool schemas prompts are rendered with (the chat template's tools=): multi-turn runs with tools only."""
    if not multi_turn.enable or not multi_turn.tool_config_path:
        return None
    from hybridrl.tools.registry import load_tool_config

    return [tool.schema for tool in load_tool_config(multi_turn.tool_config_path).values()]


def load_dataset(files, key: str, tokenizer, data_config, tools: list[dict] | None = None, max_samples: int = -1):
    """An RLHFDataset of the files named by `key` (at most `max_samples` of their rows), refused when no row is left
    (an empty file, or every prompt filtered as overlong), naming the files. `tools`: schemas the chat template
    offers in every prompt."""
    from hybridrl.data.rl_dataset import RLHFDataset

    paths = _files(files, key)
    dataset = RLHFDataset(paths, tokenizer, data_config, tools=tools, max_samples=max_samples)
    if len(dataset) == 0:
        filtered = getattr(dataset, "num_filtered", 0)
        why = (f"all {filtered} prompts are longer than data.max_prompt_length={data_config.max_prompt_length}"
               if filtered else "the files hold no rows")
        raise ValueError(f"{key}: {paths} give no samples ({why}); every dataset needs at least one row")
    return dataset


SINGLE_TURN_AGENT, TOOL_AGENT = "single_turn_agent", "tool_agent"   # verl's agent loop names


def check_agent_names(dataset, key: str, multi_turn: bool) -> None:
    """verl routes each row to the agent loop its `agent_name` column names; here the run's mode decides for every
    row (actor_rollout_ref.rollout.multi_turn.enable), so a row asking for another loop is refused, naming it,
    rather than trained in the wrong one."""
    want = TOOL_AGENT if multi_turn else SINGLE_TURN_AGENT
    for row in dataset.rows:
        name = row.get("agent_name")
        if name is not None and name != want:
            how = ("set actor_rollout_ref.rollout.multi_turn.enable=true (with a tool config) to run tool_agent "
                   "rows" if name == TOOL_AGENT else
                   f"rows of a multi-turn run are {TOOL_AGENT}'s" if multi_turn else
                   f"the agent loops here are {SINGLE_TURN_AGENT} and {TOOL_AGENT}")
            raise ValueError(f"{key}: {row['_file']} row {row['_row']} has agent_name={name!r}, but this run's rows "
                             f"all run as {want!r} (actor_rollout_ref.rollout.multi_turn.enable={multi_turn}): {how}")


def startup_data_metrics(train_set, val_set) -> dict[str, float]:
    """What loading did to the training prompts (`data/*`) and the validation prompts (`val-aux/data/*`), logged
    with the run's first record: a validation score computed on the prompts that were kept says how many those
    are."""
    metrics = dataset_metrics(train_set)
    if val_set is not None:
        metrics |= {f"val-aux/{key}": value for key, value in dataset_metrics(val_set).items()}
    return metrics


def build_reward_fns(config: PPOConfig, tokenizer):
    from hybridrl.rewards import RewardManager, default_compute_score, load_custom_reward_function
    from hybridrl.rewards.reward_manager import OverlongBuffer, takes_rm_score

    crf = config.custom_reward_function
    custom = load_custom_reward_function(crf.path, crf.name, crf.reward_kwargs)
    score = custom or default_compute_score
    rm = config.reward_model
    if rm.enable and custom is not None and not takes_rm_score(custom, rm.reward_manager):
        arg = "rm_score" if rm.reward_manager == "naive" else "rm_scores"
        raise ValueError(f"custom_reward_function.path={config.custom_reward_function.path!r} with reward_model.enable="
                         f"true: {config.custom_reward_function.name}() has no `{arg}` parameter, so either it or the "
                         f"reward model would go unused; add `{arg}=None` to it and return the combined score (or "
                         "drop custom_reward_function to train on the reward model's score alone)")
    _require_sandbox_layers(rm.sandbox.required_layers)
    timeout_s = rm.timeout_s  # null: in-process, no time limit
    ob = rm.overlong_buffer  # training and validation rewards both carry it, as in verl's DAPO trainer
    overlong = OverlongBuffer(ob.len, ob.penalty_factor, config.data.max_response_length,
                              ob.log) if ob.enable else None
    kwargs = dict(compute_score=score, reward_fn_key=config.data.reward_fn_key, timeout_s=timeout_s,
                  mode=rm.reward_manager, overlong_buffer=overlong, workers=scorer_workers(rm.scorer_workers))
    return RewardManager(tokenizer, **kwargs), RewardManager(tokenizer, **kwargs)


def scorer_workers(value) -> int:
    """reward_model.scorer_workers: auto = this (the driver's) machine's CPUs, at most 16."""
    return min(16, os.cpu_count() or 1) if value == "auto" else int(value)


def _require_sandbox_layers(value) -> None:
    """Refuse to start when reward_model.sandbox.required_layers names a layer this machine lacks; otherwise pass
    the requirement on (through the environment) to every sandbox the scorers start, spawned processes included,
    and log which layers are on."""
    from hybridrl.tools import sandbox

    key = "reward_model.sandbox.required_layers"
    required = sandbox.parse_required_layers(list(value) if not isinstance(value, str) else value, key)
    sandbox.check_required_layers(required, key)
    if required:
        os.environ[sandbox.REQUIRED_LAYERS_ENV] = ",".join(required)
    else:
        sandbox.isolation_report()  # logs the layers once: a run without required layers still says what it has


def _use_gpu(config: PPOConfig) -> bool:
    import ray

    device = config.trainer.device
    if device == "cpu":
        return False
    gpus = ray.cluster_resources().get("GPU", 0)
    if device == "cuda" and gpus < 1:
        raise ValueError("trainer.device=cuda but the Ray cluster has no GPU")
    return gpus >= 1


def _loggers(config: PPOConfig) -> list[str]:
    return logger_names(config.trainer.logger)


def _device_spec(use_gpu: bool):
    """The GPU the workers will get and the host memory available beside it, asked of the cluster by a one-GPU task
    (the driver may have none)."""
    from hybridrl.plan import DeviceSpec

    if not use_gpu:
        return DeviceSpec("cpu", "cpu", None)
    import ray

    def probe():
        import torch

        from hybridrl.plan.host_memory import host_available_bytes

        p = torch.cuda.get_device_properties(0)
        return p.name, int(p.total_memory), host_available_bytes()

    name, total, host = ray.get(ray.remote(num_gpus=1)(probe).remote())
    return DeviceSpec("cuda", name, total, host)


def use_reward_model_worker(config: PPOConfig) -> bool:
    return config.reward_model.enable and config.reward_model.style == "model"


def make_run_plan(config: PPOConfig, model_path: str, use_gpu: bool, val_prompts: int | None):
    from hybridrl.plan import make_plan, reward_model_hf_config
    from hybridrl.training.fsdp import load_hf_config

    hf_config = load_hf_config(model_path, override_config=config.actor_rollout_ref.model.override_config,
                               trust_remote_code=config.actor_rollout_ref.model.trust_remote_code)
    return make_plan(config, hf_config, _device_spec(use_gpu), val_prompts=val_prompts,
                     rm_hf_config=reward_model_hf_config(config))


def run_ppo(config: PPOConfig, report: bool = True) -> dict:
    """The whole run holds the lock on trainer.default_local_dir, taken (with a write check of the checkpoint and
    log directories) before anything else starts: a second run on the directory stops here, naming the holder.
    report: print the closing line (wall time, where logs and checkpoints went); a caller that prints its own
    (the demo, whose wall time covers more than this run) passes False."""
    run_dir = Path(os.path.expanduser(config.trainer.default_local_dir))
    with claim_run_dir(run_dir, run_log_dirs(_loggers(config), run_dir / "logs")), contextlib.ExitStack() as cleanup:
        summary = _run_ppo_claimed(config, cleanup)
    if report:
        print(f"[hybridrl] done in {format_duration(summary['wall_s'])}: {outputs_line(summary)}", flush=True)
    return summary


def outputs_line(summary: dict) -> str:
    """Where a run's logs, memory plot and checkpoints went, in one line."""
    plot = summary["memory_plot"] or "none (no GPU memory measured on CPU)"
    return f"logs {summary['log_dir']}, memory plot {plot}, checkpoints {summary['run_dir']}"


def data_seed(config: PPOConfig) -> int:
    """`data.seed`, or where it is null (verl's unseeded order) the seed of the checkpoint this run resumes from,
    else a fresh random one; a drawn seed is printed (checkpoints save it in their dataloader state)."""
    if config.data.seed is not None:
        return config.data.seed
    import json
    import secrets

    from hybridrl.trainer.checkpoint_manager import CheckpointManager

    t = config.trainer
    resume = CheckpointManager(os.path.expanduser(t.default_local_dir)).resolve_resume(t.resume_mode,
                                                                                     t.resume_from_path)
    if resume is not None:
        saved = json.loads((Path(resume) / "trainer_state.json").read_text()).get("dataloader", {}).get("seed")
        if saved is not None:
            print(f"[hybridrl] data.seed is null: the resumed run's data order, seed {saved}", flush=True)
            return int(saved)
    seed = secrets.randbelow(2**31)
    print(f"[hybridrl] data.seed is null: the data order is drawn with seed {seed} (set data.seed={seed} to repeat "
          "it)", flush=True)
    return seed


def _run_ppo_claimed(config: PPOConfig, cleanup: contextlib.ExitStack) -> dict:
    """`cleanup` shuts the worker groups down and releases the pool however the run ends: a failed run must
    not leave its workers and placement groups behind in a Ray that a later run reuses."""
    from hybridrl.controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, init_ray
    from hybridrl.data.rl_dataset import StatefulDataLoader
    from hybridrl.models.tokenizer import policy_tokenizer
    from hybridrl.trainer.checkpoint_manager import CheckpointManager
    from hybridrl.trainer.memory_timeline import MemoryTimeline
    from hybridrl.trainer.tracking import Tracking
    from hybridrl.workers.actor_rollout_ref import ActorRolloutRefWorker
    from hybridrl.workers.critic import CriticWorker

    t = config.trainer
    seed_everything(t.seed)  # the driver's own draws (e.g. group uids); workers seed themselves at init
    import_external_lib(config.actor_rollout_ref.model.external_lib)  # before any HF config or model is read
    check_paths(config)  # every missing model, data or reward file at once, before any is read
    config = config.with_value("data.seed", data_seed(config))
    model_path = os.path.expanduser(config.actor_rollout_ref.model.path)
    tokenizer = policy_tokenizer(config)
    tools = prompt_tools(config.actor_rollout_ref.rollout.multi_turn)
    train_set = load_dataset(config.data.train_files, "data.train_files", tokenizer, config.data, tools,
                             config.data.train_max_samples)
    val_set = (load_dataset(config.data.val_files, "data.val_files", tokenizer, config.data, tools,
                            config.data.val_max_samples) if config.data.val_files else None)
    # generation batches: data.gen_batch_size prompts (dynamic sampling may use several per step), else a step's
    gen_key = "gen_batch_size" if config.data.gen_batch_size is not None else "train_batch_size"
    gen_size = getattr(config.data, gen_key)
    loader = StatefulDataLoader(train_set, batch_size=gen_size, shuffle=config.data.shuffle, seed=config.data.seed,
                                drop_last=True, batch_size_key=f"data.{gen_key}")
    if len(loader) == 0:
        raise ValueError(f"data.{gen_key}={gen_size} is larger than the training set "
                         f"({len(train_set)} rows after filtering) — no full batch can be formed")
    for key, dataset in (("data.train_files", train_set), ("data.val_files", val_set)):
        if dataset is not None:
            check_agent_names(dataset, key, config.actor_rollout_ref.rollout.multi_turn.enable)
    reward_fn, val_reward_fn = build_reward_fns(config, tokenizer)
    total_steps = t.total_training_steps if t.total_training_steps is not None else len(loader) * t.total_epochs
    # the LR schedule needs the horizon, known only once the data is loaded (as in verl)
    config = (config.with_value("actor_rollout_ref.actor.optim.total_training_steps", total_steps)
              .with_value("critic.optim.total_training_steps", total_steps))

    from hybridrl.plan.shape import parallelism

    shape = parallelism(config)  # the plan's shape; the plan itself needs Ray up (it asks the cluster for its GPU)
    world = shape.world_size
    local = not (t.ray_address or os.environ.get("RAY_ADDRESS"))
    # a local Ray on a CPU machine needs a slot per worker even when there are fewer cores than workers
    init_ray(t.ray_address, num_cpus=max(os.cpu_count() or 1, world) if local else None)
    use_gpu = _use_gpu(config)
    with_critic = need_critic(config)
    val_prompts = (config.data.val_batch_size or len(val_set)) if val_set is not None else None
    plan = make_run_plan(config, model_path, use_gpu, val_prompts)
    print(plan, flush=True)
    with_rm = use_reward_model_worker(config)
    # roles in their own processes share each GPU's bundle (the actor, rollout and reference are one process)
    pool = RayResourcePool([shape.gpus_per_node] * shape.nodes, use_gpu=use_gpu,
                           max_colocate_count=1 + with_critic + with_rm)
    cleanup.callback(pool.release)  # callbacks run last-in first-out: the groups first, then their pool
    timeout = t.worker_timeout_s
    role = "actor_rollout_ref" if need_reference(config) else "actor_rollout"
    actor_wg = RayWorkerGroup(pool, RayClassWithInitArgs(ActorRolloutRefWorker, config, plan, role=role),
                              name_prefix="actor_rollout", worker_timeout_s=timeout)
    cleanup.callback(actor_wg.shutdown)
    init_info = actor_wg.init_model()
    critic_wg = None
    if with_critic:
        critic_wg = RayWorkerGroup(pool, RayClassWithInitArgs(CriticWorker, config, plan), name_prefix="critic",
                                   worker_timeout_s=timeout)
        cleanup.callback(critic_wg.shutdown)
        critic_wg.init_model()
    reward_model = None
    if with_rm:
        from hybridrl.workers.reward_model import RewardModelWorker

        reward_model = RayWorkerGroup(pool, RayClassWithInitArgs(RewardModelWorker, config, plan),
                                      name_prefix="reward_model", worker_timeout_s=timeout)
        cleanup.callback(reward_model.shutdown)
        reward_model.init_model()
    elif config.reward_model.enable:  # style=judge: the policy judges through its own rollout engine
        from hybridrl.rewards.judge import JudgeRewardModel

        reward_model = JudgeRewardModel(actor_wg, tokenizer, config)

    run_dir = Path(os.path.expanduser(t.default_local_dir))
    run_dir.mkdir(parents=True, exist_ok=True)
    log_dir = run_dir / "logs"
    tracker = Tracking(t.project_name, t.experiment_name, _loggers(config), config=config, log_dir=str(log_dir),
                       total_steps=total_steps)
    # one directory per step holds actor and critic: validation refuses a different max_critic_ckpt_to_keep
    ckpt = CheckpointManager(str(run_dir), max_to_keep=t.max_actor_ckpt_to_keep)
    timeline = MemoryTimeline()
    trainer = RayPPOTrainer(config, tokenizer, actor_wg, critic_wg, reward_fn, val_reward_fn, loader, val_set,
                            tracker, ckpt, n_gpus=world, memory_timeline=timeline, plan=plan,
                            reward_model=reward_model, startup_metrics=startup_data_metrics(train_set, val_set))
    t0 = time.time()
    try:
        history = trainer.fit()
    finally:
        tracker.finish()
    plot = None
    if timeline.data:  # GPU runs only: on CPU no memory is measured, and an empty plot would pretend otherwise
        plot = run_dir / "memory_timeline.png"
        timeline.to_json(str(run_dir / "memory_timeline.json"))
        timeline.plot(str(plot), title=f"{t.project_name}/{t.experiment_name}: GPU memory by phase")
    summary = {"history": history, "wall_s": time.time() - t0, "run_dir": str(run_dir), "log_dir": str(log_dir),
               "memory_plot": str(plot) if plot else None, "filtered_prompts": train_set.num_filtered,
               "truncated_prompts": train_set.num_truncated, "init": init_info,
               "placement": {"actor_rollout": actor_wg.placement,
                             "critic": critic_wg.placement if critic_wg is not None else None,
                             "reward_model": reward_model.placement if with_rm else None}}
    return summary
