"""outputs_to_dataproto: verl's rollout keys, n samples adjacent, padding and positions."""

import numpy as np
import pytest
import torch

from hybridrl.protocol import DataProto
from hybridrl.rollout.sampling_params import CompletionOutput, RequestOutput
from hybridrl.rollout.to_dataproto import outputs_to_dataproto


def prompt_batch():
    ids = torch.tensor([[0, 5, 6], [7, 8, 9]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": pos},
                               {"uid": np.array(["a", "b"], dtype=object)})


def outputs():
    return [RequestOutput(0, [5, 6], [CompletionOutput(0, [11, 12], [-0.1, -0.2], "stop"),
                                      CompletionOutput(1, [13], [-0.3], "stop")]),
            RequestOutput(1, [7, 8, 9], [CompletionOutput(0, [14, 15, 16, 17], [-1.0, -2.0, -3.0, -4.0], "length"),
                                         CompletionOutput(1, [18, 19], [-0.5, -0.6], "stop")])]


def test_keys_shapes_padding_positions():
    data = outputs_to_dataproto(prompt_batch(), outputs(), response_length=4, pad_token_id=0)
    b = data.batch
    assert list(data.non_tensor_batch["uid"]) == ["a", "a", "b", "b"]
    assert b["responses"].tolist() == [[11, 12, 0, 0], [13, 0, 0, 0], [14, 15, 16, 17], [18, 19, 0, 0]]
    assert b["response_mask"].tolist() == [[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]]
    assert b["prompts"][1].tolist() == [0, 5, 6] and b["input_ids"].shape == (4, 7)
    assert b["attention_mask"][0].tolist() == [0, 1, 1, 1, 1, 0, 0]
    assert b["position_ids"][0].tolist() == [0, 0, 1, 2, 3, 4, 5]
    assert b["rollout_log_probs"][2].tolist() == [-1.0, -2.0, -3.0, -4.0]
    assert b["rollout_log_probs"][1].tolist() == pytest.approx([-0.3, 0, 0, 0])


def test_too_long_response_raises_instead_of_clipping():
    with pytest.raises(ValueError, match="4 tokens > response_length=3"):
        outputs_to_dataproto(prompt_batch(), outputs(), response_length=3, pad_token_id=0)
