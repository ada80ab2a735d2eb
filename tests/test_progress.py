"""Progress of the long loops reaches the log file, not only a tqdm bar (i2d2.progress)."""

import logging
import re

import numpy as np
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


def test_resumed_prompt_perplexity_logs_this_runs_rate(tiny_gpt2, tmp_path, caplog, monkeypatch):
    """P_0's prompt perplexity resumes from the chunks a killed run saved; those, read back in no time, counted as
    this run's progress: the logged rate was inflated and the time left too short (generation passes them as the
    bar's initial)."""
    from i2d2 import progress
    from i2d2.prompts import score_texts

    texts = [f"Dogs can bark number {i}." for i in range(40)]
    first = score_texts(*tiny_gpt2, texts, tmp_path / "w", batch_size=4, chunk=10, progress=False)
    (tmp_path / "w" / "chunk-00003.npy").unlink()  # killed in the last chunk

    class Clock:  # one second per reading of the clock
        now = 0.0

        @classmethod
        def time(cls):
            cls.now += 1.0
            return cls.now

    monkeypatch.setattr(progress, "time", Clock)
    monkeypatch.setattr(progress, "MIN_SECONDS", 0.0)
    with caplog.at_level(logging.INFO):
        again = score_texts(*tiny_gpt2, texts, tmp_path / "w", batch_size=4, chunk=10, progress=True)
    assert np.allclose(first, again)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("prompt perplexity: ")]
    assert len(lines) == 1 and "40/40 prompts" in lines[0], lines
    rate, elapsed = re.search(r"([\d.]+) prompts/s, (\d+)s", lines[0]).groups()
    assert float(rate) * float(elapsed) == pytest.approx(10, abs=0.5)  # the 10 prompts this run scored
