"""A long LLM evaluation on a device is paced, not guessed: each llm_runner `nll` command stops before the item
that would likely pass its budget (a share of the device command's time limit) and the rest goes in further
commands, whose results join into the one a single command gives. Shown on the published SmolLM2-135M-Instruct
GGUF of the corpus, on the emulated sm8650's CPU (the pacing is the runner's, whatever the backend)."""

from __future__ import annotations

import posixpath

import numpy as np
import pytest

from harness.llm.device import device_nll
from harness.runner.base import remote_model_path


@pytest.mark.timeout(900)
def test_an_nll_past_its_budget_goes_on_in_further_commands_with_the_same_result(smollm2_import, sm8650_runner):
    from tokenizers import Tokenizer

    files = smollm2_import
    tokenizer = Tokenizer.from_file(str(files.tokenizer))
    text = " ".join(files.prompts[:6])
    ids = np.asarray(tokenizer.encode(text * 3).ids, dtype=np.int32)
    windows = ids[:3 * 32].reshape(3, 32)
    forced = [(tokenizer.encode(p).ids + [1, 2, 3], len(tokenizer.encode(p).ids)) for p in files.prompts[:2]]
    args = (sm8650_runner, files.prefill, windows, "cpu", forced, files.decode)
    try:
        whole = device_nll(*args)
        paced = device_nll(*args, budget_s=0.001)  # every item past the budget: one per command, the first always runs
    finally:  # the session's emulated device keeps no 1.2 GB of float32 graphs for the tests after this one
        for graph in (files.prefill, files.decode):
            sm8650_runner.transport.remove(posixpath.dirname(remote_model_path(graph)))
    assert whole["commands"] == 1 and whole["remaining"] == {"windows": 0, "sequences": 0}
    # one item per command: the 3 windows, then the 2 sequences (none after a window: the budget is spent)
    assert paced["commands"] == 5 and paced["remaining"] == {"windows": 0, "sequences": 0}
    assert [w["nll"] for w in paced["windows"]] == pytest.approx([w["nll"] for w in whole["windows"]], rel=1e-6)
    assert paced["token_count"] == whole["token_count"] == 3 * 31
    assert paced["perplexity"] == pytest.approx(whole["perplexity"], rel=1e-6)
    assert [s["top1"] for s in paced["forced"]["sequences"]] == [s["top1"] for s in whole["forced"]["sequences"]]
    assert len(paced["forced"]["sequences"]) == 2 and all(len(s["top1"]) == 4 for s in paced["forced"]["sequences"])
