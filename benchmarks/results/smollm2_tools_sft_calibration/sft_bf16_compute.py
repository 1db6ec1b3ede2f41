"""`hybridrl sft` with FSDP's compute dtype forced to bf16, as on a GPU (a CPU run computes in fp32): the
calibration of examples/smollm2_tools's SFT warm-up in the precision a GPU run sees.

    python sft_bf16_compute.py bf16 KEY=VALUE ...   (fp32: the plain CPU run)
"""
import sys
import types

import torch

import hybridrl.training.fsdp as fsdp
from hybridrl.trainer.sft_trainer import _cli

_apply = fsdp.apply_fsdp


def _bf16_compute(model, mesh, param_dtype=None, reduce_dtype=None, **kw):
    return _apply(model, mesh, param_dtype=torch.bfloat16, reduce_dtype=torch.float32, **kw)


if __name__ == "__main__":
    if sys.argv[1] == "bf16":
        fsdp.apply_fsdp = _bf16_compute
    _cli(types.SimpleNamespace(config=None, overrides=sys.argv[2:]))
