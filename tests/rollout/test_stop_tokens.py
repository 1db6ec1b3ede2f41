"""The engine's stop tokens: the tokenizer's eos, then the other eos ids the model's generation_config.json lists
(as vLLM stops on them); without that file, the tokenizer's eos alone."""

from transformers import AutoTokenizer

from hybridrl.rollout.factory import stop_token_ids


def test_generation_config_eos_ids_join_the_tokenizers(tiny_model_dir, tmp_path):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    listed = [tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]  # the tiny model's file
    ids = stop_token_ids(str(tiny_model_dir), tok)
    assert ids[0] == tok.eos_token_id and sorted(ids) == sorted(set(listed) | {tok.eos_token_id})
    assert len(ids) == len(set(ids)) >= 2
    bare = tmp_path / "no_generation_config"
    bare.mkdir()
    tok.save_pretrained(bare)
    assert stop_token_ids(str(bare), tok) == (tok.eos_token_id,)
