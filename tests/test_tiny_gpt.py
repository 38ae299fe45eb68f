"""tiny_gpt: tokenizer, splits, the hand-written backward, training determinism and the bundle."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
from pydoc_data.topics import topics

from harness.llm.gpt import GptConfig, GptWeights, forward, random_weights
from harness.zoo import tiny_gpt

TINY = GptConfig(vocab=17, context=8, prefill_ar=4, layers=2, heads=2, hidden=8, mlp=16)


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_gpt.train_tokenizer()


@pytest.fixture(scope="module")
def splits() -> tuple[str, str]:
    return tiny_gpt.text_splits()


def _tiny_ids(n: int = 400, seed: int = 0) -> np.ndarray:
    """A learnable toy stream: a fixed cycle over the vocabulary with 10% random tokens."""
    rng = np.random.default_rng(seed)
    ids = np.arange(n) * 5 % TINY.vocab
    noise = rng.random(n) < 0.1
    ids[noise] = rng.integers(0, TINY.vocab, noise.sum())
    return ids


def _perturbed(config: GptConfig, dtype: type, seed: int = 1) -> GptWeights:
    """Random weights with non-trivial LayerNorm parameters and biases (so every gradient is exercised)."""
    rng = np.random.default_rng(seed)
    params = {k: (v + rng.standard_normal(v.shape) * 0.3).astype(dtype)
              for k, v in tiny_gpt._to_params(random_weights(config, seed=0, scale=0.3)).items()}
    return tiny_gpt._from_params(config, params)


# --------------------------------------------------------------------------- tokenizer and text


def test_tokenizer_is_deterministic_and_round_trips(tokenizer, splits):
    assert tiny_gpt.train_tokenizer().to_str() == tokenizer.to_str()
    assert tokenizer.get_vocab_size() == tiny_gpt.VOCAB_SIZE == 1024
    assert tokenizer.token_to_id(tiny_gpt.EOT_TOKEN) == tiny_gpt.EOT_ID
    heldout = splits[1]
    ids = tiny_gpt.encode(tokenizer, heldout)
    assert tokenizer.decode(ids.tolist(), skip_special_tokens=False) == heldout
    n_topics = len(tiny_gpt.split_topics()[1])
    assert int((ids == tiny_gpt.EOT_ID).sum()) == n_topics  # one EOT after each topic, nowhere else
    odd = "naïve → 数学 \t\x00 tabs\n\n  spaces  ✓"  # bytes the training text may never contain
    assert tokenizer.decode(tokenizer.encode(odd).ids) == odd


def test_tokenizer_json_loads_as_a_standard_file(tokenizer, tmp_path):
    from tokenizers import Tokenizer

    path = tmp_path / "tokenizer.json"
    path.write_text(tokenizer.to_str())
    loaded = Tokenizer.from_file(str(path))
    data = json.loads(path.read_text())
    assert data["model"]["type"] == "BPE"
    assert data["pre_tokenizer"]["type"] == "ByteLevel" and data["decoder"]["type"] == "ByteLevel"
    assert [t["content"] for t in data["added_tokens"] if t["special"]] == [tiny_gpt.EOT_TOKEN]
    text = "The assert statement<|endoftext|>x"
    assert loaded.encode(text).ids == tokenizer.encode(text).ids
    assert tiny_gpt.EOT_ID in loaded.encode(text).ids


def test_splits_are_disjoint_and_deterministic(splits):
    train_names, heldout_names = tiny_gpt.split_topics()
    assert not set(train_names) & set(heldout_names)
    assert sorted(train_names + heldout_names) == sorted(topics)
    assert len(heldout_names) == 8 and heldout_names == sorted(heldout_names)
    assert tiny_gpt.text_splits() == splits
    train, heldout = splits
    eot = tiny_gpt.EOT_TOKEN
    assert train == "".join(t + eot for t in tiny_gpt._topic_texts(train_names))
    assert heldout == "".join(t + eot for t in tiny_gpt._topic_texts(heldout_names))


def test_prompts_start_heldout_topics_and_are_short(tokenizer, splits):
    prompts = tiny_gpt.prompts(tokenizer)
    assert prompts == tiny_gpt.prompts()
    assert len(prompts) == 16  # two per held-out topic: its start, and its text from past the middle
    topics = tiny_gpt._topic_texts(tiny_gpt.split_topics()[1])
    for k, prompt in enumerate(prompts):
        topic = topics[k // 2]
        assert (topic.startswith(prompt) if k % 2 == 0 else topic.find(prompt) >= len(topic) // 2)
        assert not prompt[-1].isspace() and not prompt[0].isspace()
        assert tiny_gpt.PROMPT_MIN_TOKENS <= len(tokenizer.encode(prompt).ids) <= tiny_gpt.PROMPT_MAX_TOKENS
        assert prompt in splits[1]


# --------------------------------------------------------------------------- forward and backward


def test_training_forward_matches_the_reference_forward():
    config = GptConfig()
    weights = random_weights(config, seed=3)
    ids = np.random.default_rng(0).integers(0, config.vocab, size=(3, config.context))
    logits = tiny_gpt.batch_forward(weights, ids)
    assert logits.dtype == np.float32 and logits.shape == (3, config.context, config.vocab)
    for row in range(3):
        np.testing.assert_allclose(logits[row], forward(weights, ids[row]), rtol=0, atol=1e-5)
    short = ids[:, :37]  # shorter sequences: the same function on a prefix
    np.testing.assert_allclose(tiny_gpt.batch_forward(weights, short)[1], forward(weights, short[1]), rtol=0, atol=1e-5)


def test_training_forward_matches_on_trained_like_weights():
    weights = _perturbed(TINY, np.float32)
    ids = np.random.default_rng(2).integers(0, TINY.vocab, size=(2, TINY.context))
    for row in range(2):
        np.testing.assert_allclose(tiny_gpt.batch_forward(weights, ids)[row], forward(weights, ids[row]),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layers", [1, 2])
def test_backward_matches_finite_differences(layers):
    config = GptConfig(**{**{f.name: getattr(TINY, f.name) for f in fields(TINY)}, "layers": layers})
    weights = _perturbed(config, np.float64)
    rng = np.random.default_rng(4)
    inputs = rng.integers(0, config.vocab, size=(3, config.context))
    targets = rng.integers(0, config.vocab, size=(3, config.context))
    params, config_ = tiny_gpt._to_params(weights), weights.config
    _, grads = tiny_gpt._loss_and_grads(params, config_, inputs, targets)
    assert set(grads) == set(params)
    used_tokens = np.unique(inputs)
    step = 1e-6
    for name, value in params.items():
        assert grads[name].shape == value.shape
        for _ in range(4):
            index = np.unravel_index(rng.integers(value.size), value.shape)
            if name == "tok_emb":  # a row that occurs in the input (the others' gradients are 0)
                index = (rng.choice(used_tokens), index[1])
            saved = value[index]
            value[index] = saved + step
            plus, _ = tiny_gpt._loss_and_grads(params, config_, inputs, targets)
            value[index] = saved - step
            minus, _ = tiny_gpt._loss_and_grads(params, config_, inputs, targets)
            value[index] = saved
            numeric, analytic = (plus - minus) / (2 * step), grads[name][index]
            assert abs(numeric - analytic) <= 1e-6 + 1e-5 * abs(numeric), (name, index, numeric, analytic)


def test_public_loss_and_grads_are_float32_weights():
    weights = _perturbed(TINY, np.float32)
    ids = _tiny_ids(TINY.context + 1)
    loss, grads = tiny_gpt.loss_and_grads(weights, ids[None, :-1], ids[None, 1:])
    assert np.isfinite(loss) and isinstance(grads, GptWeights)
    assert all(g.dtype == np.float32 for g in tiny_gpt._to_params(grads).values())


# --------------------------------------------------------------------------- training and evaluation


def _short_train(seed: int = 0, steps: int = 60):
    return tiny_gpt.train(TINY, _tiny_ids(), seed=seed, steps=steps, batch_size=4, seq_len=TINY.context,
                          learning_rate=1e-2, warmup_steps=5)


def test_training_is_deterministic():
    (first, summary), (second, again) = _short_train(steps=15), _short_train(steps=15)
    for name, value in tiny_gpt._to_params(first).items():
        assert value.dtype == np.float32
        np.testing.assert_array_equal(value, tiny_gpt._to_params(second)[name], err_msg=name)
    assert summary.losses == again.losses
    other, _ = _short_train(seed=1, steps=15)
    assert not np.array_equal(other.lm_head, first.lm_head)


def test_short_training_lowers_loss_and_perplexity():
    ids = _tiny_ids()
    weights, summary = _short_train(steps=120)
    assert summary.steps == 120 and len(summary.losses) == 120
    assert summary.final_loss < 0.6 * summary.initial_loss
    untrained = tiny_gpt.perplexity(random_weights(TINY, seed=0), ids, window=TINY.context)
    trained = tiny_gpt.perplexity(weights, ids, window=TINY.context)
    assert trained < 0.5 * untrained
    assert trained < tiny_gpt.unigram_perplexity(ids, ids, TINY.vocab)


def test_perplexity_scores_every_token_but_the_first_once():
    weights = _perturbed(TINY, np.float32)
    ids = _tiny_ids(23)
    nll = sum(tiny_gpt._nll_sum(forward(weights, ids[s:min(s + 5, 22)]), ids[s + 1:min(s + 6, 23)])
              for s in range(0, 22, 5))
    assert tiny_gpt.perplexity(weights, ids, window=5) == pytest.approx(np.exp(nll / 22), rel=1e-12)
    assert tiny_gpt.perplexity(weights, ids, window=1) > 0  # no context at all, still defined
    with pytest.raises(ValueError):
        tiny_gpt.perplexity(weights, ids, window=TINY.context + 1)


def test_learning_rate_warms_up_then_decays():
    rates = [tiny_gpt.learning_rate_at(s, 100, peak=1.0, warmup=10) for s in range(100)]
    assert rates[9] == 1.0 and rates[0] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(rates[9:], rates[10:]))
    assert rates[-1] == pytest.approx(tiny_gpt.MIN_LR_FRACTION, abs=1e-3)


def test_weights_round_trip_exactly(tmp_path: Path):
    weights = _perturbed(TINY, np.float32)
    path = tmp_path / "w.npz"
    tiny_gpt.save_weights(weights, path)
    first = path.read_bytes()
    loaded = tiny_gpt.load_weights(path)
    assert loaded.config == TINY
    for name, value in tiny_gpt._to_params(weights).items():
        np.testing.assert_array_equal(tiny_gpt._to_params(loaded)[name], value)
        assert tiny_gpt._to_params(loaded)[name].dtype == value.dtype
    tiny_gpt.save_weights(loaded, path)
    assert path.read_bytes() == first  # byte-reproducible
    assert [p.name for p in tmp_path.iterdir()] == ["w.npz"]  # no temp files left


@pytest.mark.slow
def test_build_bundle(tiny_gpt_bundle: Path):  # the zoo's build_bundle, trained once per session (tests/conftest.py)
    out = tiny_gpt_bundle
    data = json.loads((out / "summary.json").read_text())
    names = {p.name for p in out.iterdir()}
    assert set(data["files"]) <= names and not [n for n in names if n.endswith(".tmp")]  # beside the exported graphs
    assert data["eot_id"] == tiny_gpt.EOT_ID and data["vocab"] == 1024
    assert 1_000_000 < data["parameters"] < 1_100_000
    assert data["heldout_perplexity"] < 100
    assert data["heldout_perplexity"] < 0.5 * data["unigram_heldout_perplexity"]
    weights = tiny_gpt.load_weights(out / "weights.npz")
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    heldout_ids = np.asarray(tokenizer.encode((out / "heldout.txt").read_text()).ids)
    assert tiny_gpt.perplexity(weights, heldout_ids) == pytest.approx(data["heldout_perplexity"], rel=1e-9)
    assert json.loads((out / "prompts.json").read_text()) == tiny_gpt.prompts(tokenizer)
