"""GPU only: hybridrl's update and log-prob pass do not wait for the GPU once per micro-batch — the number of
host-synchronizing CUDA calls (torch's sync debug mode) made from hybridrl's own code is the same for 8
micro-batches as for 2, so the host queues the next micro-batch while the GPU runs this one. The rows start on
the host, as the workers hand them over: each micro-batch's copy to the GPU must not wait either. (transformers' SDPA
mask builder still checks a padded mask on the host once per forward; that one is not ours to remove here.)"""

import os
import traceback
import warnings

import pytest
import torch
import transformers
from _training_tiny import TINY_ACTOR_CFG, make_ppo_batch, tiny_qwen2_config
from typed_sections import optim_section

import hybridrl
from hybridrl.training import DataParallelPPOActor, build_optimizer
from hybridrl.training.micro_batches import UpdateBatches
from hybridrl.training.packed_attention import register_varlen_attention

PACKAGE = os.path.dirname(hybridrl.__file__) + os.sep
TORCH = os.path.dirname(torch.__file__) + os.sep


def _count_syncs(fn) -> int:
    """Synchronizing calls whose innermost caller outside torch is a hybridrl file."""
    ours = [0]

    def record(message, *args, **kwargs):
        if "synchronizing" in str(message):
            frames = [f.filename for f in traceback.extract_stack()
                      if not f.filename.startswith(TORCH) and not f.filename.endswith("warnings.py")]
            ours[0] += frames[-2 if frames[-1] == __file__ else -1].startswith(PACKAGE)

    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return ours[0]


def _syncs(micro: int, own_old: bool, share: bool = False, count=None) -> tuple[int, int]:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(tiny_qwen2_config(), dtype=torch.float32).cuda()
    cfg = TINY_ACTOR_CFG.with_value("entropy_coeff", 0.01)
    actor = DataParallelPPOActor(cfg, model, build_optimizer(model.parameters(), optim_section(lr=1e-4)),
                                 batches=UpdateBatches(8, micro, None), use_remove_padding=False,
                                 share_prompts=share)
    data = make_ppo_batch(batch=8, prompt_len=16, resp_len=12)  # on the host, as the workers pass the rows on
    if share:
        model.set_attn_implementation(register_varlen_attention())
    if own_old:
        data.batch.pop("old_log_probs")
    count = count or _count_syncs
    update = count(lambda: actor.update_policy(data))
    data.meta_info["micro_batch_size"] = micro
    logprob = count(lambda: actor.compute_log_prob(data))
    return update, logprob


@pytest.mark.gpu
@pytest.mark.parametrize("own_old", [False, True])
@pytest.mark.parametrize("share", [False, True])
def test_host_syncs_do_not_grow_with_micro_batches(own_old, share):
    _syncs(4, own_old, share, count=lambda fn: fn())   # warm-up, uncounted: FlexAttention compiles (inductor
    # autotunes; its kernels are not hybridrl's syncs) on the first packed forward and backward
    two, eight = _syncs(4, own_old, share), _syncs(1, own_old, share)
    assert eight == two, (eight, two)
    assert two[0] > 0   # the counter sees hybridrl's own syncs (the loss factors, the metrics, the grad norm)
