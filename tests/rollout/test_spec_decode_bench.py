"""benchmarks/spec_decode.py on the tiny model on CPU: it resolves speculation through the run plan's typed section,
runs off and on, and with greedy sampling the two give the same tokens (speculation is lossless)."""

import importlib.util
import json
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "spec_decode.py"


def test_spec_decode_bench_runs_off_and_on_with_identical_greedy_tokens(tmp_path):
    spec = importlib.util.spec_from_file_location("spec_decode_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        out = tmp_path / "spec.json"
        module.main(["--tiny", "--num-prompts", "2", "--n", "2", "--prompt-len", "16", "--max-tokens", "24",
                     "--temperature", "0", "--repeat", "1", "--workdir", str(tmp_path / "work"), "--out", str(out)])
    finally:
        sys.modules.pop(spec.name, None)
    result = json.loads(out.read_text())
    assert result["speculative"]["enable"] is True
    assert result["greedy_identical"] is True
    off, on = result["off"]["runs"][0], result["on"]["runs"][0]
    assert off["generated_tokens"] == on["generated_tokens"] > 0
    assert off["spec_verify_steps"] == 0 and "decode_launch_s" in on
