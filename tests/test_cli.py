"""The hybridrl CLI: config show/check exit codes, train dispatch, plugin registration and failures."""

import signal
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml

from hybridrl import cli
from hybridrl.trainer import main_ppo

SEED = str(Path(__file__).resolve().parents[1] / "examples" / "seed_6gpu.yaml")


def test_config_check_seed_prints_both_meshes(capsys):
    assert cli.main(["config", "check", SEED]) == 0
    out = capsys.readouterr().out
    assert "[[0, 1], [2, 3], [4, 5]]" in out and "[0, 1, 2, 3, 4, 5]" in out


def test_config_check_summary_names_the_missing_plan_and_paths_in_one_report(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HYBRIDRL_HOME", str(tmp_path))  # the demo never ran here: its model and data are absent
    assert cli.main(["config", "check", SEED]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{SEED}: valid"
    model = tmp_path / "demo" / "runs" / "sft" / "huggingface"
    assert lines[1].startswith(f"memory plan: none: actor_rollout_ref.model.path='{model}' has no config.json")
    assert lines[2].startswith("missing or unusable: 3 path(s)")
    assert lines[3].startswith(f"  - actor_rollout_ref.model.path='{model}' does not exist")
    assert lines[4].startswith("  - data.train_files: [") and lines[5].startswith("  - data.val_files: [")
    assert all("`hybridrl train` with no arguments builds it there" in line for line in lines[3:6])
    assert "data.val_files=null turns validation off" in lines[5]
    assert lines[6] == "world size      6 workers on CPU"


def write_prompts(path: Path, rows: int = 1) -> None:
    """A prompt file of `rows` equal rows in the verl schema."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"data_source": "arith", "prompt": [{"role": "user", "content": "1+1"}],
                                          "reward_model": {"ground_truth": "2"}}] * rows), path)


def test_config_check_summary_states_the_planned_peak(capsys, tiny_model_dir, tmp_path):
    data = tmp_path / "train.parquet"
    write_prompts(data, rows=256)  # one batch of the default data.train_batch_size
    assert cli.main(["config", "check", f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files={data}",
                     "data.val_files=null", "--gpu-memory-gb", "80"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "defaults + overrides: valid"
    assert lines[1].startswith("memory plan: peak ") and lines[1].endswith("of 80.0 GiB (a 80 GiB GPU): fits")
    assert lines[2] == "world size      8 (1 node(s) x 8 GPUs)"  # nothing missing: no such block


def test_config_check_bad_config_exits_1_with_the_key(capsys):
    assert cli.main(["config", "check", SEED, "data.train_batch_size=50"]) == 1
    assert "'data.train_batch_size'" in capsys.readouterr().err
    assert cli.main(["config", "check", "/nonexistent/c.yaml"]) == 1
    assert "/nonexistent/c.yaml" in capsys.readouterr().err


def test_config_check_for_cuda_on_a_machine_without_one_says_how(capsys, tiny_model_dir, tmp_path):
    data = tmp_path / "train.parquet"
    data.write_bytes(b"")
    args = ["config", "check", f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files={data}",
            "data.val_files=null", "trainer.device=cuda"]
    if __import__("torch").cuda.is_available():
        return
    assert cli.main(args) == 1
    err = capsys.readouterr().err
    assert "'trainer.device' = cuda but this process sees no CUDA device" in err and "--gpu-memory-gb N" in err
    assert "Traceback" not in err


def test_config_check_names_the_gpu_for_its_peaks(capsys, tiny_model_dir, tmp_path):
    data = tmp_path / "train.parquet"
    data.write_bytes(b"")
    base = ["config", "check", f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files={data}",
            "data.val_files=null", "actor_rollout_ref.rollout.speculative.enable=true", "--gpu-memory-gb", "141"]
    assert cli.main([*base, "--gpu-name", "NVIDIA H200"]) == 0
    out = capsys.readouterr().out
    assert "device          NVIDIA H200, 141.0 GiB per GPU" in out and "within half NVIDIA H200's ridge point" in out
    assert cli.main(base) == 0
    assert "no known peaks for a 141 GiB GPU" in capsys.readouterr().out


def test_config_show_prints_resolved_yaml_with_overrides(capsys):
    assert cli.main(["config", "show", "--config", SEED, "data.max_prompt_length=100"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["actor_rollout_ref"]["rollout"]["prompt_length"] == 100
    assert shown["actor_rollout_ref"]["rollout"]["name"] == "native"


def test_train_dispatch(monkeypatch):
    seen = {}
    monkeypatch.setattr(main_ppo, "run", lambda config: seen.setdefault("config", config))
    assert cli.main(["train", "--config", SEED, "trainer.total_epochs=2"]) == 0
    assert seen["config"].trainer.total_epochs == 2
    demo = types.ModuleType("hybridrl.trainer.demo")
    demo.run_demo = lambda args: seen.setdefault("demo", args)
    monkeypatch.setitem(sys.modules, "hybridrl.trainer.demo", demo)
    assert cli.main(["train"]) == 0
    assert seen["demo"].config is None and seen["demo"].overrides == []


def test_main_ppo_validates_then_calls_run_ppo(monkeypatch, capsys):
    fake = types.ModuleType("hybridrl.trainer.launch")
    calls = []
    fake.run_ppo = lambda config: calls.append(config) or {"ok": True}
    monkeypatch.setitem(sys.modules, "hybridrl.trainer.launch", fake)
    assert main_ppo.main(["--config", SEED]) == 0
    assert len(calls) == 1  # the layout is checked here; the run plan is printed by run_ppo once Ray is up
    assert main_ppo.main(["--config", SEED, "actor_rollout_ref.rollout.tensor_model_parallel_size=4"]) == 1
    assert len(calls) == 1 and "tensor_model_parallel_size" in capsys.readouterr().err


def test_plugins_register_and_failures_are_visible(monkeypatch, capsys):
    good = types.ModuleType("fake_good_cli")

    def register(sub):
        p = sub.add_parser("hello")
        p.set_defaults(func=lambda args: print("hello ran") or 0)

    good.register = register
    monkeypatch.setitem(sys.modules, "fake_good_cli", good)
    monkeypatch.setattr(cli, "_PLUGINS", [("fake_good_cli", "good"), ("hybridrl.no_such_module_xyz", "broken")])
    assert cli.main(["hello"]) == 0
    assert "hello ran" in capsys.readouterr().out
    assert cli.main(["broken", "--anything"]) == 2
    err = capsys.readouterr().err
    assert "hybridrl.no_such_module_xyz failed to import" in err and "ModuleNotFoundError" in err
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "(unavailable: hybridrl.no_such_module_xyz failed to import)" in capsys.readouterr().out


@pytest.mark.slow
def test_console_entry_point_subprocess():
    proc = subprocess.run([sys.executable, "-m", "hybridrl.cli", "config", "check", SEED,
                           "actor_rollout_ref.rollout.gpu_memory_utilization=2"], capture_output=True, text=True)
    assert proc.returncode == 1 and "gpu_memory_utilization" in proc.stderr


def test_bench_names_point_at_existing_scripts():
    from pathlib import Path

    from hybridrl.benchmarks_cli import SCRIPTS

    root = Path(__file__).resolve().parent.parent / "benchmarks"
    assert {"grpo", "rollout", "decode", "logprob", "plot"} <= set(SCRIPTS)
    assert all((root / script).exists() for script in SCRIPTS.values())


def test_an_error_that_stops_a_run_prints_its_message_without_a_traceback(capsys, monkeypatch):
    from hybridrl.rewards.error_guard import RewardErrorLimitError
    from hybridrl.trainer import main_ppo

    def run(config):
        raise RewardErrorLimitError("step 3: 9 of 16 samples failed, over reward_model.max_error_fraction=0.5")

    monkeypatch.setattr(main_ppo, "run", run)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}   # the run installs its own
    try:
        assert cli.main(["train", "trainer.total_training_steps=1"]) == 1
        err = capsys.readouterr().err
        assert "hybridrl: error: step 3: 9 of 16 samples failed" in err and "Traceback" not in err
        assert main_ppo.main(["trainer.total_training_steps=1"]) == 1
        assert "error: step 3: 9 of 16" in capsys.readouterr().err
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
