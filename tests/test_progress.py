"""Progress of the long loops reaches the log file, not only a tqdm bar (i2d2.progress)."""

import logging
import re

import pytest


def _lines(caplog, desc):
    return [r.getMessage() for r in caplog.records if re.match(rf"{re.escape(desc)}: \d+/\d+ batch(?:es)? ", r.getMessage())]


def test_perplexity_batches_log_one_line_each_tenth(tiny_gpt2, caplog, monkeypatch):
    """P_k's perplexity of the critic's test split ran 2 minutes, the probe critic's features 5, with nothing in
    train.log but the tqdm bar on the terminal."""
    from i2d2 import progress
    from i2d2.perplexity import sequence_nll

    texts = [f"Dogs can bark number {i}." for i in range(40)]
    monkeypatch.setattr(progress, "MIN_SECONDS", 0.0)
    with caplog.at_level(logging.INFO):
        sequence_nll(*tiny_gpt2, texts, batch_size=2, progress=True)  # 20 batches: a line every 2
    lines = _lines(caplog, "perplexity")
    assert [int(re.search(r": (\d+)/20", m).group(1)) for m in lines] == list(range(2, 21, 2))
    assert "(100%)" in lines[-1] and "left" in lines[-1]
    caplog.clear()
    with caplog.at_level(logging.INFO):
        sequence_nll(*tiny_gpt2, texts, batch_size=2, progress=False)  # no bar (other ranks): no lines either
    assert not _lines(caplog, "perplexity")
    monkeypatch.setattr(progress, "MIN_SECONDS", 3600.0)
    with caplog.at_level(logging.INFO):
        sequence_nll(*tiny_gpt2, texts, batch_size=2, progress=True)  # a short loop logs nothing
    assert not _lines(caplog, "perplexity")


@pytest.mark.parametrize("total", [1, 3, 10, 25])
def test_at_most_ten_lines_and_the_last_at_the_end(caplog, monkeypatch, total):
    from i2d2 import progress

    monkeypatch.setattr(progress, "MIN_SECONDS", 0.0)
    with caplog.at_level(logging.INFO):
        assert list(progress.progress(range(total), desc="loop", disable=False)) == list(range(total))
    lines = _lines(caplog, "loop")
    assert 1 <= len(lines) <= min(total, 10) and f"{total}/{total} batches" in lines[-1]
