"""model_factory: a saved model directory gives back the tokenizer that was saved."""

from __future__ import annotations

import torch

from grpo_pilot.engine.model_factory import build_char_tokenizer, build_model, build_tokenizer, save_model_dir

TEXT = "say a 0: repeat after me!\n"


def test_saved_char_tokenizer_loads_as_written(tmp_path):
    tok = build_char_tokenizer()
    model = build_model("examples/tiny", seed=0)
    directory = save_model_dir(model, tok, tmp_path / "m")
    loaded = build_tokenizer(str(directory))
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(TEXT)  # one token per character, spaces and newline included
    assert loaded(TEXT, add_special_tokens=False)["input_ids"] == ids
    assert loaded.decode(ids) == TEXT
    assert (loaded.eos_token_id, loaded.pad_token_id, loaded.padding_side) == (
        tok.eos_token_id,
        tok.pad_token_id,
        "left",
    )
    # the weights round-trip too: same logits from the saved directory
    again = build_model(str(directory), seed=1)
    x = torch.tensor([ids[:8]])
    with torch.no_grad():
        torch.testing.assert_close(again(x).logits, model(x).logits)
