"""load_config: merge order, verl-style overrides, user YAML forms, aliases, deprecated keys."""

import logging

import pytest

from hybridrl.config import ConfigError, load_config
from hybridrl.config.loader import load_defaults, parse_override

R = "actor_rollout_ref.rollout"
A = "actor_rollout_ref.actor"


def test_defaults_resolve_interpolations_after_overrides():
    cfg = load_config(overrides=["data.max_prompt_length=1024"])
    assert cfg.actor_rollout_ref.rollout.prompt_length == 1024
    assert cfg.critic.ppo_mini_batch_size == cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    assert "${" not in cfg.to_yaml()


@pytest.mark.parametrize("text,value", [
    ("a.b=3", 3), ("a.b=1e-6", 1e-6), ("a.b=2.5", 2.5), ("a.b=False", False), ("a.b=true", True),
    ("a.b=null", None), ("a.b=[console,file]", ["console", "file"]), ("a.b=[0.9, 1e-3]", [0.9, 1e-3]),
    ("a.b=~/data/x.parquet", "~/data/x.parquet"), ("a.b=", ""), ("a.b=x=y", "x=y"), ("a.b={k: 1}", {"k": 1}),
])
def test_override_values_are_parsed_as_yaml(text, value):
    ov = parse_override(text)
    assert (ov.kind, ov.key, ov.value) == ("set", "a.b", value)
    assert type(ov.value) is type(value)


def test_override_kinds_and_malformed():
    assert parse_override("+a.b=1").kind == "add"
    assert parse_override("++a.b=1").kind == "force"
    with pytest.raises(ConfigError, match="key=value"):
        parse_override("trainer.nnodes")
    with pytest.raises(ConfigError, match="deleting"):
        parse_override("~trainer.nnodes=1")


def test_typed_overrides_land_in_config():
    cfg = load_config(overrides=[f"{A}.optim.lr=3e-6", f"{A}.optim.betas=[0.8,0.95]", "trainer.logger=[console,file]",
                                 f"{A}.fsdp_config.param_offload=True", "data.val_batch_size=null"])
    assert cfg.actor_rollout_ref.actor.optim.lr == pytest.approx(3e-6)
    assert list(cfg.actor_rollout_ref.actor.optim.betas) == [0.8, 0.95]
    assert list(cfg.trainer.logger) == ["console", "file"]
    assert cfg.actor_rollout_ref.actor.fsdp_config.param_offload is True
    assert cfg.data.val_batch_size is None


def test_plus_adds_only_inside_free_dicts():
    cfg = load_config(overrides=["+actor_rollout_ref.model.override_config.attention_dropout=0.1",
                                 "+actor_rollout_ref.model.override_config.rope_scaling.type=linear"])
    oc = cfg.actor_rollout_ref.model.override_config
    assert oc == {"attention_dropout": 0.1, "rope_scaling": {"type": "linear"}}
    with pytest.raises(ConfigError, match="free dicts") as e:
        load_config(overrides=["+data.new_key=1"])
    assert "data.new_key" in str(e.value)
    assert load_config(overrides=["+data.seed=1"]).data.seed == 1   # verl's recipes add keys ours has: set
    with pytest.raises(ConfigError, match=r"write \+actor_rollout_ref.model.override_config.x"):
        load_config(overrides=["actor_rollout_ref.model.override_config.x=1"])


def test_force_sets_or_adds():
    cfg = load_config(overrides=["++data.seed=7", "++critic.model.override_config.k=v"])
    assert cfg.data.seed == 7 and cfg.critic.model.override_config == {"k": "v"}
    with pytest.raises(ConfigError, match="trainer.nope"):
        load_config(overrides=["++trainer.nope=1"])


def test_unknown_override_names_closest_key_and_all_errors_are_reported():
    with pytest.raises(ConfigError) as e:
        load_config(overrides=[f"{R}.tensor_parallel_size=2", "trainer.n_gpu_per_node=2"])
    msg = str(e.value)
    assert f"did you mean '{R}.tensor_model_parallel_size'" in msg
    assert "did you mean 'trainer.n_gpus_per_node'" in msg
    assert len(e.value.errors) == 2


def test_user_yaml_nested_and_dotted_keys(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("trainer:\n  n_gpus_per_node: 4\n"
                 "actor_rollout_ref.actor.fsdp_config.param_offload: True\n"
                 "actor_rollout_ref.actor.optim:\n  lr: 2e-6\n")
    cfg = load_config(f, ["trainer.nnodes=2"])
    assert cfg.trainer.n_gpus_per_node == 4 and cfg.trainer.nnodes == 2
    assert cfg.actor_rollout_ref.actor.fsdp_config.param_offload is True
    assert cfg.actor_rollout_ref.actor.optim.lr == pytest.approx(2e-6)
    assert cfg.actor_rollout_ref.actor.optim.weight_decay == 0.01  # untouched siblings kept


def test_user_yaml_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(lst)
    twice = tmp_path / "twice.yaml"
    twice.write_text("data:\n  seed: 1\ndata.seed: 2\n")
    with pytest.raises(ConfigError, match="data.seed"):
        load_config(twice)
    typo = tmp_path / "typo.yaml"
    typo.write_text("actor_rollout_ref:\n  rollout:\n    tensor_model_parallel: 2\n")
    with pytest.raises(ConfigError, match="tensor_model_parallel_size"):
        load_config(typo)
    with pytest.raises(FileNotFoundError, match="sft_nope"):
        load_defaults("sft_nope")


def test_seed_config_verbatim_with_vllm_alias(seed_yaml, caplog):
    with caplog.at_level(logging.WARNING, logger="hybridrl.config"):
        cfg = load_config(seed_yaml, [f"{A}.fsdp_config.param_offload=False", f"{A}.fsdp_config.optimizer_offload=False",
                                      f"{R}.log_prob_micro_batch_size_per_gpu=8", f"{A}.strategy=fsdp"])
    assert cfg.actor_rollout_ref.rollout.name == "native"
    assert cfg.actor_rollout_ref.actor.strategy == "fsdp2"
    assert cfg.data.train_batch_size == 60 and cfg.actor_rollout_ref.rollout.n == 12
    assert any("vllm" in r.getMessage() and "native" in r.getMessage() for r in caplog.records)


def test_deprecated_global_micro_batch_is_converted(caplog):
    base = ["trainer.n_gpus_per_node=6", "data.train_batch_size=60", f"{A}.ppo_mini_batch_size=60", f"{R}.n=2"]
    with caplog.at_level(logging.WARNING, logger="hybridrl.config"):
        cfg = load_config(overrides=base + [f"{A}.ppo_micro_batch_size=12", f"{R}.log_prob_micro_batch_size=24"])
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 2
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size is None
    assert cfg.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu == 4
    assert sum("deprecated" in r.getMessage() for r in caplog.records) == 2
    with pytest.raises(ConfigError, match="both set"):
        load_config(overrides=base + [f"{A}.ppo_micro_batch_size=12", f"{A}.ppo_micro_batch_size_per_gpu=2"])
    with pytest.raises(ConfigError, match=f"'{A}.ppo_micro_batch_size' = 13"):
        load_config(overrides=base + [f"{A}.ppo_micro_batch_size=13"])


def test_validate_false_skips_checks():
    cfg = load_config(overrides=["data.train_batch_size=7"], validate=False)
    assert cfg.data.train_batch_size == 7


DAPO_KWARGS = ["+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
               "+reward_model.reward_kwargs.overlong_buffer_cfg.len=128",
               "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.5",
               "+reward_model.reward_kwargs.overlong_buffer_cfg.log=True"]


def test_verl_reward_kwargs_overlong_buffer_is_read_as_ours(caplog):
    with caplog.at_level(logging.WARNING, logger="hybridrl.config"):
        cfg = load_config(overrides=["data.max_response_length=1024", *DAPO_KWARGS,
                                     "+reward_model.reward_kwargs.max_resp_len=1024"])
    ob = cfg.reward_model.overlong_buffer
    assert (ob.enable, ob.len, ob.penalty_factor, ob.log) == (True, 128, 0.5, True)
    assert any("overlong_buffer_cfg.len is read as reward_model.overlong_buffer.len" in r.getMessage()
               for r in caplog.records)
    # max_resp_len is accepted only where it is data.max_response_length, from which the buffer counts
    with pytest.raises(ConfigError, match=r"'reward_model.reward_kwargs.max_resp_len' = 2048 must equal "
                                          r"'data.max_response_length' = 1024"):
        load_config(overrides=["data.max_response_length=1024", "+reward_model.reward_kwargs.max_resp_len=2048"])


def test_verl_reward_kwargs_in_a_config_file(tmp_path):
    path = tmp_path / "dapo.yaml"
    path.write_text("data:\n  max_response_length: 256\nreward_model:\n  reward_kwargs:\n    max_resp_len: 256\n"
                    "    overlong_buffer_cfg:\n      enable: true\n      len: 64\n      penalty_factor: 1.0\n")
    ob = load_config(path).reward_model.overlong_buffer
    assert (ob.enable, ob.len, ob.penalty_factor) == (True, 64, 1.0)
    path.write_text("reward_model:\n  overlong_buffer:\n    len: 32\n  reward_kwargs:\n    overlong_buffer_cfg:\n"
                    "      len: 64\n")
    with pytest.raises(ConfigError, match=r"'reward_model.overlong_buffer.len' is given twice, as 32 and \(as verl's "
                                          r"'reward_model.reward_kwargs.overlong_buffer_cfg.len'\) 64; keep one"):
        load_config(path)
    path.write_text("reward_model:\n  reward_kwargs:\n    overlong_buffer_cfg:\n      len: 64\n  overlong_buffer:\n"
                    "    len: 32\n")   # the verl spelling first: the message still names which is which
    with pytest.raises(ConfigError, match=r"'reward_model.overlong_buffer.len' is given twice, as 32 and \(as verl's "
                                          r"'reward_model.reward_kwargs.overlong_buffer_cfg.len'\) 64; keep one"):
        load_config(path)
    path.write_text("reward_model:\n  reward_kwargs:\n    max_resp_len: 999\n")
    with pytest.raises(ConfigError, match=r"config file .*dapo.yaml'.*'reward_model.reward_kwargs.max_resp_len' = 999 "
                                          r"must equal 'data.max_response_length' = 512"):
        load_config(path)
    # the overlong buffer's own rules still apply under verl's name
    with pytest.raises(ConfigError, match=r"'reward_model.overlong_buffer.len' = 600 must be in \(0, "
                                          r"data.max_response_length = 512\]"):
        load_config(overrides=["+reward_model.reward_kwargs.overlong_buffer_cfg.enable=true",
                               "+reward_model.reward_kwargs.overlong_buffer_cfg.len=600"])


def test_verl_reference_ulysses_key_is_accepted_at_the_actors_degree():
    cfg = load_config(overrides=[f"{A}.ulysses_sequence_parallel_size=2", "trainer.n_gpus_per_node=2",
                                 "actor_rollout_ref.model.use_remove_padding=true",
                                 "actor_rollout_ref.ref.ulysses_sequence_parallel_size=2"])
    assert cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size == 2
    with pytest.raises(ConfigError, match=r"'actor_rollout_ref.ref.ulysses_sequence_parallel_size' = 4 must equal "
                                          r"'actor_rollout_ref.actor.ulysses_sequence_parallel_size' = 1: the "
                                          r"reference model runs on the actor's training mesh"):
        load_config(overrides=["actor_rollout_ref.ref.ulysses_sequence_parallel_size=4"])


def test_verl_checkpoint_save_and_load_contents():
    ckpt = f"{A}.checkpoint"
    cfg = load_config(overrides=[f"{ckpt}.save_contents=['model', 'optimizer', 'extra', 'hf_model']",
                                 f"{ckpt}.load_contents=[model,optimizer,extra,hf_model]"])
    assert list(cfg.actor_rollout_ref.actor.checkpoint.contents) == ["model", "optimizer", "extra", "hf_model"]
    with pytest.raises(ConfigError, match=r"'actor_rollout_ref.actor.checkpoint.load_contents' = \['model'\] must "
                                          r"equal 'actor_rollout_ref.actor.checkpoint.contents'"):
        load_config(overrides=[f"{ckpt}.load_contents=[model]"])


def test_val_only_needs_validation_data():
    assert load_config(overrides=["trainer.val_only=true"]).trainer.val_only
    with pytest.raises(ConfigError, match=r"'trainer.val_only' = true needs validation data: 'data.val_files' is null"):
        load_config(overrides=["trainer.val_only=true", "data.val_files=null"])


@pytest.mark.parametrize("key", ["data.train_max_samples", "data.val_max_samples"])
def test_max_samples_are_all_rows_or_a_positive_count(key):
    assert getattr(load_config(overrides=[f"{key}=16"]).data, key.removeprefix("data.")) == 16
    with pytest.raises(ConfigError, match=rf"'{key}' = 0 must be -1 \(all rows\) or a positive number of rows"):
        load_config(overrides=[f"{key}=0"])


def test_loss_scale_factor_is_null_or_positive():
    assert load_config(overrides=[f"{A}.loss_scale_factor=4096"]).actor_rollout_ref.actor.loss_scale_factor == 4096
    with pytest.raises(ConfigError, match="loss_scale_factor"):
        load_config(overrides=[f"{A}.loss_scale_factor=0"])


def test_verl_keys_without_a_counterpart_are_refused_saying_why(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(overrides=[f"{R}.data_parallel_size=2", "+actor_rollout_ref.actor.megatron.context_parallel_size=2",
                               f"{R}.nn=3"])
    msg = str(e.value)
    assert (f"unknown key '{R}.data_parallel_size': verl's key, the engine's data-parallel size is the world size "
            "over rollout.tensor_model_parallel_size: remove it (or set verl's default, 1, which changes nothing)") in msg
    assert "megatron.context_parallel_size' is not in the schema: verl's key, hybridrl trains with FSDP2 only" in msg
    assert f"unknown key '{R}.nn'; did you mean '{R}.n'?" in msg   # any other key: the closest one
    path = tmp_path / "verl.yaml"
    path.write_text("actor_rollout_ref:\n  actor:\n    use_torch_compile: false\n")
    with pytest.raises(ConfigError, match=r"unknown key 'actor_rollout_ref.actor.use_torch_compile': verl's key, the "
                                          r"training model is not torch.compiled"):
        load_config(path)


def test_plus_on_a_key_verl_lacks_but_ours_has_sets_it(caplog):
    """verl's DAPO recipes add keys its base config lacks (`+algorithm.filter_groups.enable=True`); a verl command
    line valid in verl must not stop here on Hydra's 'already exists'."""
    fg = "algorithm.filter_groups"
    with caplog.at_level(logging.WARNING, logger="hybridrl.config"):
        cfg = load_config(overrides=[f"+{fg}.enable=True", f"+{fg}.metric=acc", "+trainer.rollout_data_dir=/tmp/x"])
    assert cfg.algorithm.filter_groups.enable and cfg.algorithm.filter_groups.metric == "acc"
    assert cfg.trainer.rollout_data_dir == "/tmp/x"
    assert any(f"+{fg}.enable sets a key that exists here" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("role", [A, "critic"])
def test_verl_engine_optimizer_spellings_are_read_as_ours(role, caplog):
    """verl's engine workers read `optim.clip_grad` and `optim.lr_scheduler_type`; ours are the legacy workers'
    `grad_clip` and `optim.warmup_style`. Given both ways with different values, the run is refused."""
    with caplog.at_level(logging.WARNING, logger="hybridrl.config"):
        cfg = load_config(overrides=[f"{role}.optim.clip_grad=0.5", f"{role}.optim.lr_scheduler_type=cosine"])
    section = cfg.actor_rollout_ref.actor if role == A else cfg.critic
    assert section.grad_clip == 0.5 and section.optim.warmup_style == "cosine"
    assert any(f"{role}.optim.clip_grad is read as {role}.grad_clip" in r.getMessage() for r in caplog.records)
    assert load_config(overrides=[f"{role}.grad_clip=0.5", f"{role}.optim.clip_grad=0.5"])  # the same value: fine
    with pytest.raises(ConfigError, match=rf"override '{role}.optim.clip_grad=0.3': '{role}.grad_clip' is also set "
                                          rf"by {role}.grad_clip=1.0 \(one of the two is verl's spelling of it\)"):
        load_config(overrides=[f"{role}.grad_clip=1.0", f"{role}.optim.clip_grad=0.3"])
    with pytest.raises(ConfigError, match=r"lr_scheduler_type.*'wsd' is not one of|warmup_style.*'wsd'"):
        load_config(overrides=[f"{role}.optim.lr_scheduler_type=wsd"])


def test_verl_async_rollout_mode_runs_the_engine(caplog):
    with caplog.at_level(logging.WARNING, logger="hybridrl.config"):
        cfg = load_config(overrides=[f"{R}.mode=async"])
    assert cfg.actor_rollout_ref.rollout.mode == "sync"
    assert any(f"{R}.mode=async is read as {R}.mode=sync" in r.getMessage() for r in caplog.records)
    with pytest.raises(ConfigError, match=rf"'{R}.mode'"):
        load_config(overrides=[f"{R}.mode=stream"])


def test_verl_reference_and_data_keys_accepted_at_the_value_they_stand_for():
    ref = "actor_rollout_ref.ref"
    cfg = load_config(overrides=[f"{ref}.strategy=fsdp", f"{A}.strategy=fsdp2", f"{ref}.fsdp_config.fsdp_size=-1",
                                 "data.trust_remote_code=false"])   # verl's spelling of a value reads as ours
    assert cfg.actor_rollout_ref.actor.strategy == "fsdp2"
    with pytest.raises(ConfigError) as e:
        load_config(overrides=[f"{ref}.strategy=megatron", f"{ref}.fsdp_config.fsdp_size=2",
                               "data.trust_remote_code=true"])
    msg = str(e.value)
    assert (f"'{ref}.strategy' = 'megatron' must equal '{A}.strategy' = 'fsdp2': the reference model is sharded as "
            "the actor is") in msg
    assert f"'{ref}.fsdp_config.fsdp_size' = 2 must equal '{A}.fsdp_config.fsdp_size' = -1" in msg
    assert ("'data.trust_remote_code' = True must equal 'actor_rollout_ref.model.trust_remote_code' = False: prompts "
            "are tokenized with the policy's tokenizer") in msg


@pytest.mark.parametrize("override,reason", [
    ("+actor_rollout_ref.nccl_timeout=1200", "collectives use torch.distributed's default timeout"),
    (f"{A}.fsdp_config.use_torch_compile=false", "the training model is not torch.compiled"),
    (f"{A}.fsdp_config.forward_prefetch=true", "FSDP2 prefetches the next layer's all-gather on its own"),
    (f"{R}.expert_parallel_size=2", "the engine shards experts by tensor parallelism"),
    (f"{R}.checkpoint_engine.update_weights_bucket_megabytes=512", "one tensor at a time through the reshard"),
    ("reward_model.rollout.gpu_memory_utilization=0.6", "a server for the reward model; reward_model.enable is false, "
     "and hybridrl runs no such server"),
    ("+data.custom_cls.path=my_dataset.py", "convert the rows to the trainer's parquet schema"),
    ("global_profiler.tool=nsys", "no profiler integration"),
])
def test_more_verl_keys_are_refused_saying_why(override, reason):
    with pytest.raises(ConfigError, match="verl's key, ") as e:
        load_config(overrides=[override])
    assert reason in str(e.value)


def test_token_budgets_are_per_gpu_with_ulysses():
    """verl's meaning: a Ulysses group's micro-batch holds the per-GPU budget times its size, so a budget of half
    prompt + response is enough at SP 2 (and below it is refused, naming the rule)."""
    sp2 = [f"{A}.ulysses_sequence_parallel_size=2", "trainer.n_gpus_per_node=2", "data.train_batch_size=8",
           f"{A}.ppo_mini_batch_size=8", "actor_rollout_ref.model.use_remove_padding=true",
           "data.max_prompt_length=512", "data.max_response_length=512", f"{A}.use_dynamic_bsz=true"]
    assert load_config(overrides=[*sp2, f"{A}.ppo_max_token_len_per_gpu=512"]).actor_rollout_ref.actor \
        .ppo_max_token_len_per_gpu == 512
    with pytest.raises(ConfigError, match=r"'actor_rollout_ref.actor.ppo_max_token_len_per_gpu' = 511 must be >= "
                                          r"\(max_prompt_length \+ max_response_length = 1024\) / "
                                          r"ulysses_sequence_parallel_size 2 = 512"):
        load_config(overrides=[*sp2, f"{A}.ppo_max_token_len_per_gpu=511"])
    with pytest.raises(ConfigError, match=r"log_prob_max_token_len_per_gpu' = 300 must be >= .* = 512"):
        load_config(overrides=[*sp2, f"{R}.log_prob_use_dynamic_bsz=true", f"{R}.log_prob_max_token_len_per_gpu=300"])


@pytest.mark.parametrize("override", ["trainer.use_legacy_worker_impl=disable", f"{A}.entropy_checkpointing=true",
                                      "critic.model.use_shm=true", f"{R}.calculate_log_probs=true",
                                      f"{R}.enable_chunked_prefill=false"])
def test_verl_keys_whose_every_value_changes_nothing_are_dropped_saying_why(override, caplog):
    """verl's example scripts set these (a fused-kernel switch, log-probs from the engine, ...): any value asks for
    what hybridrl does anyway, so the key is dropped and the reason logged."""
    from hybridrl.config.verl_defaults import VERL_ANY_VALUE

    key = override.partition("=")[0]
    with caplog.at_level(logging.WARNING, logger="hybridrl.config"):
        load_config(overrides=[override])
    assert any(f"{key}=" in r.getMessage() and VERL_ANY_VALUE[key] in r.getMessage() for r in caplog.records)


def test_verls_reward_model_server_keys_change_nothing_where_the_model_scores_on_its_own(caplog, tmp_path):
    """verl serves a scoring reward model on its own engine (reward_model.rollout.*, num_workers, use_reward_loop);
    here it runs as the reward model worker with the same scores, so with reward_model.enable and no custom reward
    function those keys are dropped with a warning. With a custom reward function (verl's generative reward model,
    which calls that server) they are refused."""
    served = ["reward_model.rollout.name=vllm", "reward_model.rollout.tensor_model_parallel_size=4",
              "reward_model.rollout.prompt_length=4096", "reward_model.num_workers=8", "reward_model.use_reward_loop=false"]
    with caplog.at_level(logging.WARNING, logger="hybridrl.config"):
        cfg = load_config(overrides=["reward_model.enable=true", "reward_model.model.path=/rm", *served],
                          validate=False)
    assert cfg.reward_model.enable
    warning = next(r.getMessage() for r in caplog.records if "configure verl's server" in r.getMessage())
    assert "reward_model.rollout.name='vllm'" in warning and "reward_model.num_workers=8" in warning
    reward = tmp_path / "reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n")
    with pytest.raises(ConfigError) as e:
        load_config(overrides=["reward_model.enable=true", "reward_model.model.path=/rm",
                               f"custom_reward_function.path={reward}", *served], validate=False)
    assert len(e.value.errors) == len(served)
    assert "a custom reward function is set (in verl it would call that server" in e.value.errors[0]


def test_a_verl_example_script_with_a_served_reward_model_loads(tiny_model_dir, caplog):
    """verl's examples/ppo_trainer/run_qwen2-7b_rm_seq_balance.sh (verl b178a3cd), its command line as written but
    for the model and data paths: PPO with a critic and a scoring reward model that verl serves on vLLM."""
    m = str(tiny_model_dir)
    line = [
        "algorithm.adv_estimator=gae", "data.train_files=['/d/gsm8k/train.parquet','/d/math/train.parquet']",
        "data.val_files=['/d/gsm8k/test.parquet','/d/math/test.parquet']", "data.train_batch_size=4096",
        "data.max_prompt_length=4096", "data.max_response_length=4096", "data.filter_overlong_prompts=True",
        "data.truncation='error'", "data.return_raw_chat=True", f"actor_rollout_ref.model.path={m}",
        "actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True", "actor_rollout_ref.actor.ppo_mini_batch_size=512",
        "actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24000",
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False", "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.5",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=24000", "critic.optim.lr=1e-5",
        "critic.model.use_remove_padding=True", f"critic.model.path={m}", "critic.model.enable_gradient_checkpointing=True",
        "critic.use_dynamic_bsz=True", "critic.ppo_max_token_len_per_gpu=98304",
        "critic.model.fsdp_config.param_offload=False", "critic.model.fsdp_config.optimizer_offload=False",
        "reward_model.enable=True", f"reward_model.model.path={m}", "reward_model.use_reward_loop=True",
        "reward_model.rollout.name=vllm", "reward_model.rollout.gpu_memory_utilization=0.8",
        "reward_model.rollout.tensor_model_parallel_size=1", "reward_model.rollout.prompt_length=8192",
        "reward_model.rollout.response_length=4096", "reward_model.num_workers=8", "algorithm.use_kl_in_reward=False",
        "trainer.critic_warmup=0", "trainer.logger=['console']", "trainer.project_name='verl_example_gsm8k'",
        "trainer.experiment_name='qwen2-7b_hybrid_rm_bsz8k_p4k_r4k_seq_packing'", "trainer.n_gpus_per_node=8",
        "trainer.val_before_train=False", "trainer.nnodes=1", "trainer.save_freq=20", "trainer.test_freq=5",
        "trainer.total_epochs=15",
    ]
    with caplog.at_level(logging.WARNING, logger="hybridrl.config"):
        cfg = load_config(overrides=line)
    assert cfg.reward_model.enable and cfg.critic.ppo_max_token_len_per_gpu == 98304
    assert cfg.actor_rollout_ref.rollout.name == "native"
    assert any("configure verl's server for the scoring reward model" in r.getMessage() for r in caplog.records)
