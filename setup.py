"""Package layout only; the metadata lives in pyproject.toml.

conf/ (Hydra configs, word lists, cue lexicon, DeepSpeed JSONs) stays at the top of the checkout, as the design card
wants, and is installed as the package ``i2d2._conf``: in a wheel it is copied to ``i2d2/_conf/``, in an editable
install setuptools maps the name onto the checkout's conf/. ``i2d2.config.CONF_DIR`` finds it either way.
"""

from setuptools import find_packages, setup

CODE = ["i2d2", "i2d2.*", "trainers", "trainers.*", "critics", "critics.*", "callbacks", "callbacks.*"]

setup(packages=[*find_packages(include=CODE), "i2d2._conf"], package_dir={"i2d2._conf": "conf"})
