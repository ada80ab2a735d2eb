"""A minimal NegVerse run config shared by the recipe tests: three pairs (one per negation type), one affirmative
for the rule generator and one evaluation sentence, written under ``tmp_path``."""

from i2d2.config import CONF_DIR


def negverse_cfg(tmp_path, *overrides, eval_text="The dog is hungry.\n", logger="none"):
    from hydra import compose, initialize_config_dir

    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("She likes apples.\tShe doesn't like apples.\tverbal\n"
                     "Everyone came.\tNobody came.\tnon_verbal\n"
                     "The child was happy.\tThe child was unhappy.\taffixal\n")
    aff = tmp_path / "aff.txt"
    aff.write_text("The sky is blue.\n")
    ev = tmp_path / "eval.txt"
    ev.write_text(eval_text)
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=["task=negverse", "model=tiny_gpt2", f"logger={logger}",
                                           f"run_dir={tmp_path / 'run'}", f"data.pairs={pairs}",
                                           f"data.affirmatives={aff}", f"data.eval_sentences={ev}", *overrides])
