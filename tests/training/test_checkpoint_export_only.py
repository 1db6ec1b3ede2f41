"""Export-only checkpoints (verl's save_contents=['hf_model']): the weights as a from_pretrained directory, and a
resume from such a checkpoint stops, naming it."""

import pytest
import torch
import transformers
from _training_tiny import tiny_qwen2_config

from hybridrl.trainer.resume_check import ResumeConfigError, check_resumable
from hybridrl.training.checkpoint import save_checkpoint, saved_contents


def test_an_export_only_checkpoint_holds_the_weights_and_is_no_resume_point(tmp_path):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(tiny_qwen2_config(), dtype=torch.float32)
    save_checkpoint(tmp_path / "step" / "actor", model, contents=("hf_model",))
    assert not (tmp_path / "step" / "actor" / "model").exists() and saved_contents(tmp_path / "step" / "actor") == {
        "hf_model"}
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "step" / "actor" / "huggingface",
                                                                 dtype=torch.float32)
    ids = torch.randint(3, 300, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():   # written in bf16 (the export's dtype): equal up to that rounding
        torch.testing.assert_close(exported(ids).logits, model(ids).logits, atol=0.05, rtol=0.05)
    with pytest.raises(ResumeConfigError, match=r"its actor was saved with 'actor_rollout_ref.actor.checkpoint."
                                                r"contents' = \['hf_model'\], without 'model'"):
        check_resumable(tmp_path / "step", ["actor"])
    save_checkpoint(tmp_path / "full" / "actor", model, contents=("model", "hf_model"))
    check_resumable(tmp_path / "full", ["actor", "critic"])   # a role without metadata (no critic) passes
