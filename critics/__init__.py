"""Critic: a supervised valid/invalid classifier for generated knowledge (train, score, choose δ)."""
