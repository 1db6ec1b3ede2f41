"""`hybridrl bench list` / `bench run`: every scenario is listed, points at scripts and records that exist, and a run
writes manifest.json (commit, device, versions, command, per-command config) beside its outputs."""

import json
import sys
from pathlib import Path

from hybridrl import benchmarks_cli, cli

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from scenario_kit import Cmd, Scenario  # noqa: E402

MANIFEST_KEYS = {"scenario", "command", "git", "device", "versions", "commands", "placeholders", "record"}


def test_list_shows_every_scenario(capsys):
    assert cli.main(["bench", "list"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == list(benchmarks_cli.load_scenarios())


def test_scenarios_point_at_existing_scripts_and_records():
    for s in benchmarks_cli.load_scenarios().values():
        assert s.commands and s.what and s.device
        if s.record:
            assert (ROOT / "benchmarks" / "results" / s.record).exists(), (s.name, s.record)
        for cmd in s.commands:
            for arg in cmd.argv:
                if arg.startswith(("benchmarks/", "examples/", "tests/")) and "{" not in arg:
                    assert (ROOT / arg).exists(), (s.name, arg)


def test_run_writes_outputs_and_manifest(tmp_path, monkeypatch):
    tiny = Scenario("tiny", "writes one file", "cpu", None, (
        Cmd(("python", "-c", "import os, sys; open(sys.argv[1], 'w').write(os.environ['WHO'])", "{out}/hello.txt"),
            (("WHO", "{work}"),), "hello.log"),))
    monkeypatch.setattr(benchmarks_cli, "load_scenarios", lambda: {"tiny": tiny})
    out = tmp_path / "out"
    assert cli.main(["bench", "run", "tiny", "--out", str(out), "--work", str(tmp_path / "w")]) == 0
    assert (out / "hello.txt").read_text() == str(tmp_path / "w")
    m = json.loads((out / "manifest.json").read_text())
    assert MANIFEST_KEYS <= set(m) and m["commands"][0]["rc"] == 0 and (out / "hello.log").exists()
    assert m["versions"]["python"] and "torch" in m["versions"] and "ray" in m["versions"]
    assert m["command"].startswith("hybridrl bench run tiny --out") and "dirty" in m["git"]


def test_dry_run_expands_a_real_scenario_without_running(tmp_path):
    out = tmp_path / "dry"
    assert cli.main(["bench", "run", "long-tail-1.5b", "--out", str(out), "--dry-run"]) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert MANIFEST_KEYS <= set(m) and m["dry_run"] and m["git"]["commit"]
    (c,) = m["commands"]
    assert c["argv"][1:4] == ["benchmarks/long_tail.py", "--preset", "qwen2.5-1.5b"] and "rc" not in c
    assert f"{out}/defaults.json" in c["argv"] and sorted(p.name for p in out.iterdir()) == ["manifest.json"]


def test_failed_command_fails_the_run(tmp_path, monkeypatch):
    bad = Scenario("bad", "exits 3", "cpu", None, (Cmd(("python", "-c", "raise SystemExit(3)")),))
    monkeypatch.setattr(benchmarks_cli, "load_scenarios", lambda: {"bad": bad})
    assert cli.main(["bench", "run", "bad", "--out", str(tmp_path)]) == 1
    assert json.loads((tmp_path / "manifest.json").read_text())["commands"][0]["rc"] == 3


def test_overrides_are_found_inside_variants():
    argv = ["--variants", "a:x.y=1;x.z=bf16,b", "k.v=2", "--out", "f.json"]
    assert benchmarks_cli.bench_manifest.overrides(argv) == ["x.y=1", "x.z=bf16", "k.v=2"]


def _waiting_for_each_other(n: int) -> Scenario:
    """n commands that each mark their start, then wait (up to 20 s) for every other one to have started: they all
    pass only when run at once."""
    code = ("import os, sys, time; d, i, n = sys.argv[1], sys.argv[2], int(sys.argv[3]); "
            "open(os.path.join(d, 'start' + i), 'w').close(); t = time.time()\n"
            "while len([f for f in os.listdir(d) if f.startswith('start')]) < n:\n"
            "    time.sleep(0.05)\n"
            "    if time.time() - t > 20: sys.exit(1)")
    setup = Cmd(("python", "-c", "import sys, time; time.sleep(0.5); open(sys.argv[1], 'w').close()",
                 "{out}/ready"), (), "setup.log", setup=True)
    check = "assert os.path.exists(os.path.join(d, 'ready')), 'ran before the setup command ended'\n"
    return Scenario("meet", "commands that meet", "cpu", None, (setup, *(
        Cmd(("python", "-c", code.replace("t = time.time()\n", "t = time.time()\n" + check), "{out}", str(i),
             str(n)), (), f"meet{i}.log") for i in range(n))), parallel=True)


def test_parallel_runs_the_setup_first_then_the_commands_at_once_each_into_its_log(tmp_path, monkeypatch):
    monkeypatch.setattr(benchmarks_cli, "load_scenarios", lambda: {"meet": _waiting_for_each_other(3)})
    assert cli.main(["bench", "run", "meet", "--out", str(tmp_path), "--parallel", "3"]) == 0
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m["parallel"] == 3 and [c["rc"] for c in m["commands"]] == [0, 0, 0, 0]
    assert all((tmp_path / f"meet{i}.log").exists() for i in range(3))


def test_parallel_is_refused_for_scenarios_not_marked_parallel_and_must_be_positive(tmp_path, capsys):
    import pytest

    assert cli.main(["bench", "run", "long-tail-1.5b", "--out", str(tmp_path), "--parallel", "2"]) == 2
    assert "runs its commands one at a time" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["bench", "run", "long-tail-1.5b", "--out", str(tmp_path), "--dry-run", "--parallel", "0"])


def test_parallel_scenarios_plan_each_run_for_a_share_of_the_gpu():
    for s in benchmarks_cli.load_scenarios().values():
        if s.parallel:
            runs = [c for c in s.commands if not c.setup]
            assert runs and all(any(a.startswith("trainer.gpu_memory_gb=") for a in c.argv) for c in runs), s.name
