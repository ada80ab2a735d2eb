"""Lightning callbacks and plotting helpers shared by the trainers (critic, discriminators, LM fine-tuning)."""

from callbacks.plots import log_png, plot_pr_curves, plot_score_histogram  # noqa: F401
