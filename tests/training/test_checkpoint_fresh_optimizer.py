"""A checkpoint saved before the optimizer's first step (partial rollouts' first steps, critic warm-up) changes
nothing: torch fills an empty AdamW state with a step at lr 0 to build the state dict, which would otherwise stay
(step 1, zero moments) and shrink the first real update through the bias correction, in the saving run and in a run
resumed from that checkpoint."""

import torch

from hybridrl.training.checkpoint import load_checkpoint, save_checkpoint


def _model_and_optimizer(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    return model, torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.01)


def _step(model, optimizer):
    x = torch.linspace(-1, 1, 12).reshape(3, 4)
    optimizer.zero_grad()
    model(x).pow(2).sum().backward()
    optimizer.step()


def test_saving_before_the_first_step_leaves_training_unchanged(tmp_path):
    ref_model, ref_opt = _model_and_optimizer()
    saved_model, saved_opt = _model_and_optimizer()
    save_checkpoint(tmp_path / "ckpt", saved_model, saved_opt, contents=("model", "optimizer"))
    assert not saved_opt.state   # the state dict's placeholder step is gone again
    for _ in range(2):
        _step(ref_model, ref_opt)
        _step(saved_model, saved_opt)
    for a, b in zip(ref_model.parameters(), saved_model.parameters()):
        assert torch.equal(a, b)
    assert saved_opt.state[next(saved_model.parameters())]["step"].item() == 2

    resumed_model, resumed_opt = _model_and_optimizer(seed=1)   # other weights: the checkpoint's must come back
    load_checkpoint(tmp_path / "ckpt", resumed_model, resumed_opt, contents=("model", "optimizer"))
    assert not resumed_opt.state
    fresh_model, fresh_opt = _model_and_optimizer()
    _step(resumed_model, resumed_opt)
    _step(fresh_model, fresh_opt)
    for a, b in zip(fresh_model.parameters(), resumed_model.parameters()):
        assert torch.equal(a, b)


def test_a_checkpoint_after_steps_keeps_and_restores_the_state(tmp_path):
    model, opt = _model_and_optimizer()
    _step(model, opt)
    save_checkpoint(tmp_path / "ckpt", model, opt, contents=("model", "optimizer"))
    assert not (tmp_path / "ckpt" / "optim" / "FRESH").exists()
    other, other_opt = _model_and_optimizer(seed=1)
    load_checkpoint(tmp_path / "ckpt", other, other_opt, contents=("model", "optimizer"))
    assert other_opt.state[next(other.parameters())]["step"].item() == 1
    _step(model, opt)
    _step(other, other_opt)
    for a, b in zip(model.parameters(), other.parameters()):
        assert torch.equal(a, b)
