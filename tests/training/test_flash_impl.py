"""Which FlashAttention a varlen call runs (`HYBRIDRL_FLASH`, models/varlen_attention.py): the choice rules and the
call FlashAttention-4 receives, with its entry point and the device's capability stubbed (no GPU here)."""

import pytest
import torch

from hybridrl.models import varlen_attention as va


@pytest.fixture
def fake_fa4(monkeypatch):
    """FlashAttention-4 'installed' on a 'CUDA' device of the given capability; records its calls."""
    calls = []

    def fn(q, k, v, **kwargs):
        calls.append((q, k, v, kwargs))
        return q * 2, None

    def install(major=9, importable=True, version=va.FA4_CHECKED_VERSIONS[0]):
        va._fa4.cache_clear()
        va._fa4_unfit.cache_clear()
        monkeypatch.setattr(va, "_fa4", lambda: (fn, None) if importable else (None, "flash_attn.cute does not import"))
        monkeypatch.setattr(va, "_fa4_version", lambda: version)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, 0))
        return calls

    yield install
    va._fa4_unfit.cache_clear()


CUDA = torch.device("cuda")


@pytest.mark.parametrize("major,head_dim,importable,want", [
    (9, 128, True, "fa4"), (9, 64, True, "fa4"), (9, 256, True, "fa4"), (9, 192, True, "fa4"),
    (8, 128, True, "fa2"), (12, 128, True, "fa2"), (9, 100, True, "fa2"), (9, 512, True, "fa2"),
    (9, 128, False, "fa2"),
    # head dims where its dq came out wrong on an H100
    (9, 8, True, "fa2"), (9, 16, True, "fa2"), (9, 48, True, "fa2"), (9, 80, True, "fa2"),
    # Blackwell: gradients never checked here, so auto keeps FlashAttention-2
    (10, 64, True, "fa2"), (10, 256, True, "fa2")])
def test_auto_runs_fa4_only_where_its_gradients_were_checked(fake_fa4, monkeypatch, major, head_dim, importable,
                                                            want):
    fake_fa4(major, importable)
    monkeypatch.setenv("HYBRIDRL_FLASH", "auto")
    assert va.flash_impl(CUDA, head_dim) == want


def test_an_unchecked_fa4_release_runs_only_when_forced(fake_fa4, monkeypatch):
    fake_fa4(9, version="4.0.1")
    monkeypatch.setenv("HYBRIDRL_FLASH", "auto")
    assert va.flash_impl(CUDA, 128) == "fa2"
    assert "flash-attn-4 4.0.1: its gradients were checked with 4.0.0b40 only" in va._fa4_unfit(CUDA, 128)
    monkeypatch.setenv("HYBRIDRL_FLASH", "fa4")
    assert va.flash_impl(CUDA, 128) == "fa4"


@pytest.mark.parametrize("major,head_dim,want", [(10, 64, "fa4"), (10, 256, "fa4"), (9, 128, "fa4")])
def test_fa4_forced_runs_where_its_own_checks_take_the_head_dim(fake_fa4, monkeypatch, major, head_dim, want):
    fake_fa4(major)
    monkeypatch.setenv("HYBRIDRL_FLASH", "fa4")
    assert va.flash_impl(CUDA, head_dim) == want


@pytest.mark.parametrize("major,head_dim,reason", [(9, 16, "head_dim 16 .*its dq was wrong"),
                                                   (10, 192, "head_dim 192 .*10.x"), (10, 136, "head_dim 136")])
def test_fa4_forced_at_a_head_dim_it_gets_wrong_or_refuses_is_refused(fake_fa4, monkeypatch, major, head_dim,
                                                                     reason):
    fake_fa4(major)
    monkeypatch.setenv("HYBRIDRL_FLASH", "fa4")
    with pytest.raises(RuntimeError, match=f"HYBRIDRL_FLASH=fa4: FlashAttention-4 cannot run here: {reason}"):
        va.flash_impl(CUDA, head_dim)


@pytest.mark.parametrize("major,importable", [(9, True), (9, False), (8, True), (10, True)])
def test_the_default_is_fa2_even_where_fa4_could_run(fake_fa4, monkeypatch, major, importable):
    """FlashAttention-4 is opt-in: inside the GRPO step no run measured it faster (module notes)."""
    fake_fa4(major, importable)
    monkeypatch.delenv("HYBRIDRL_FLASH", raising=False)
    assert va.flash_impl(CUDA, 128) == "fa2"


def test_fa2_forced_never_asks_for_fa4(fake_fa4, monkeypatch):
    fake_fa4(9)
    monkeypatch.setenv("HYBRIDRL_FLASH", "fa2")
    assert va.flash_impl(CUDA, 128) == "fa2"


@pytest.mark.parametrize("major,importable,reason", [(8, True, "compute capability 8.x"),
                                                     (9, False, "does not import")])
def test_fa4_forced_where_it_cannot_run_is_refused_with_the_reason(fake_fa4, monkeypatch, major, importable, reason):
    fake_fa4(major, importable)
    monkeypatch.setenv("HYBRIDRL_FLASH", "fa4")
    with pytest.raises(RuntimeError, match=f"HYBRIDRL_FLASH=fa4: FlashAttention-4 cannot run here: .*{reason}"):
        va.flash_impl(CUDA, 128)


def test_a_cpu_tensor_never_takes_fa4(fake_fa4, monkeypatch):
    fake_fa4(9)
    monkeypatch.setenv("HYBRIDRL_FLASH", "auto")
    assert va.flash_impl(torch.device("cpu"), 128) == "fa2"


def test_unknown_flash_choice_is_refused_naming_the_variable_and_the_choices(monkeypatch):
    monkeypatch.setenv("HYBRIDRL_FLASH", "fa3")
    with pytest.raises(ValueError, match=r"HYBRIDRL_FLASH='fa3'.*fa2, fa4, auto"):
        va.flash_impl(CUDA, 128)


def test_fa4_gets_grouped_heads_as_they_are_causal_with_the_segments(fake_fa4, monkeypatch):
    calls = fake_fa4(9)
    monkeypatch.delenv("HYBRIDRL_FLASH", raising=False)
    monkeypatch.setattr(va, "flash_impl", lambda device, head_dim: "fa4")   # CPU tensors standing in for CUDA ones
    q, k = torch.randn(5, 6, 8), torch.randn(7, 2, 8)
    cu_q, cu_k = torch.tensor([0, 2, 5], dtype=torch.int32), torch.tensor([0, 3, 7], dtype=torch.int32)
    out = va.varlen_causal_attention(q, k, k, cu_q, cu_k, 3, 4, None)
    assert torch.equal(out, q * 2)
    (got_q, got_k, got_v, kwargs), = calls
    assert got_q is q and got_k is k and got_v is k
    assert kwargs == dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=3, max_seqlen_k=4,
                          softmax_scale=8 ** -0.5, causal=True)


def test_fa4_makes_the_packed_path_available_without_torchs_varlen_op(fake_fa4, monkeypatch):
    fake_fa4(9)
    monkeypatch.setattr(va, "_varlen", lambda: None)   # a torch without torch.nn.attention.varlen
    monkeypatch.setenv("HYBRIDRL_FLASH", "fa2")
    assert not va.flash_available(CUDA, torch.bfloat16, 128)
    monkeypatch.setenv("HYBRIDRL_FLASH", "fa4")
    assert va.flash_available(CUDA, torch.bfloat16, 128)
    assert not va.flash_available(CUDA, torch.float32, 128)
