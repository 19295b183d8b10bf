"""--speculative-token-map (the drafts' small vocabulary) on CPU, float32: with a map of every token id in
another order the MTP layer drafts exactly what it drafts without one; with a subset every draft is one of
its ids; greedy output equals plain decoding either way; bad maps are refused with the flag named."""

import json

import pytest
import torch

from hybrid_sgl.engine import Engine
from hybrid_sgl.runner.draft_vocab import load_token_map
from hybrid_sgl.runner.speculative import SpecDecoder
from hybrid_sgl.server_args import ServerArgs
from tests.test_speculative import BASE, GREEDY, PROMPTS, SPEC


def _drafting(path: str, monkeypatch, **kw) -> tuple[list[list[int]], list[list[int]], int]:
    """(outputs, every draft list proposed, vocab size) of PROMPTS with speculative decoding."""
    proposed, draft = [], SpecDecoder.draft

    def recording(self, entries):
        out = draft(self, entries)
        proposed.extend(out)
        return out

    monkeypatch.setattr(SpecDecoder, "draft", recording)
    with Engine(model_path=path, **BASE, **SPEC, **kw) as engine:
        outs = [o["output_ids"] for o in engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)]
        engine.check_integrity()
        vocab = engine.runner.config.vocab_size
    monkeypatch.setattr(SpecDecoder, "draft", draft)
    return outs, proposed, vocab


def test_a_map_of_every_token_drafts_as_the_whole_vocabulary_and_a_subset_drafts_inside_it(tiny_checkpoint,
                                                                                             monkeypatch, tmp_path):
    path = tiny_checkpoint("qwen3_5", mtp=True)
    with Engine(model_path=path, **BASE) as engine:
        plain = [o["output_ids"] for o in engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)]
    outs, drafts, vocab = _drafting(path, monkeypatch)
    assert outs == plain and drafts

    everything = torch.randperm(vocab, generator=torch.Generator().manual_seed(0))
    torch.save(everything, tmp_path / "all.pt")  # SGLang's format: torch.save of the ids
    outs_all, drafts_all, _ = _drafting(path, monkeypatch, speculative_token_map=str(tmp_path / "all.pt"))
    assert outs_all == plain and drafts_all == drafts

    subset = sorted({t for d in drafts for t in d})[::2] + list(range(3, 40))  # half the drafted ids, and others
    subset = list(dict.fromkeys(subset))
    (tmp_path / "some.json").write_text(json.dumps(subset))
    outs_some, drafts_some, _ = _drafting(path, monkeypatch, speculative_token_map=str(tmp_path / "some.json"))
    assert outs_some == plain
    assert all(t in set(subset) for d in drafts_some for t in d)
    assert drafts_some != drafts  # the ids left out were drafted before: these drafts differ


def test_bad_token_maps_are_refused_naming_the_flag(tiny_checkpoint, tmp_path):
    path = tiny_checkpoint("qwen3_5", mtp=True)
    with pytest.raises(ValueError, match="--speculative-token-map .*no such file"):
        ServerArgs(model_path=path, **BASE, **SPEC, speculative_token_map=str(tmp_path / "none.pt")).resolved()
    (tmp_path / "ok.json").write_text("[1, 2, 3]")
    with pytest.raises(ValueError, match="needs --speculative-algorithm"):
        ServerArgs(model_path=path, **BASE, speculative_token_map=str(tmp_path / "ok.json")).resolved()
    (tmp_path / "far.json").write_text("[1, 2, 1000000]")
    with pytest.raises(ValueError, match="token id 1000000 is outside the model's vocabulary"):
        Engine(model_path=path, **BASE, **SPEC, speculative_token_map=str(tmp_path / "far.json"))


@pytest.mark.parametrize("content, why", [
    ("[]", "non-empty list"), ("[1, 2, 2]", "repeat"), ('{"a": 1}', "non-empty list"), ("[1.5]", "non-empty list"),
    ("[-1]", "outside"), ("not json", "cannot be read")])
def test_token_map_files_are_checked(tmp_path, content, why):
    (tmp_path / "m.json").write_text(content)
    with pytest.raises(ValueError, match=why):
        load_token_map(str(tmp_path / "m.json"), vocab_size=100)


def test_token_map_tensors_load_as_sglang_saves_them(tmp_path):
    torch.save(torch.tensor([5, 7, 9], dtype=torch.int32), tmp_path / "t.pt")
    torch.save([4, 2], tmp_path / "l.pt")
    torch.save(torch.zeros(2, 2, dtype=torch.int64), tmp_path / "2d.pt")
    assert load_token_map(str(tmp_path / "t.pt"), 10) == [5, 7, 9]
    assert load_token_map(str(tmp_path / "l.pt"), 10) == [4, 2]
    with pytest.raises(ValueError, match="1-D integers"):
        load_token_map(str(tmp_path / "2d.pt"), 10)
