"""Offline assets: tiny HF models with a trained byte-level BPE tokenizer, and real-shaped random models."""

from hybridrl.assets.tiny_model import ARCHS, SIZE_PRESETS, build_tiny_model, make_config, write_size_preset
from hybridrl.assets.tokenizer import CHAT_TEMPLATE, SPECIAL_TOKENS, save_tokenizer, train_tokenizer

__all__ = ["ARCHS", "CHAT_TEMPLATE", "SIZE_PRESETS", "SPECIAL_TOKENS", "build_tiny_model", "make_config",
           "save_tokenizer", "train_tokenizer", "write_size_preset"]
