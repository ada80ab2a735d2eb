#!/usr/bin/env bash
# Builds .whl/ (git-ignored): the Python packages this project needs beyond what the lent GPU machine's image holds,
# for its Python 3.12. The image has PyTorch, Lightning, transformers, peft, accelerate, sentence-transformers,
# torchmetrics, scikit-learn, pyarrow ...; it lacks Hydra/OmegaConf, DeepSpeed, datasets, pydantic and a few small
# ones, and nothing can be fetched there. The list was found by running experiment=smoke and the DeepSpeed trainer
# tests with only the image's packages and these importable (names from the device tool's KINDS.md).
# The model-weight packages (Gemma, MiniLM, spaCy) are too large to carry: GPU checks use the tiny models.
#
#   PYTHON=.venv/bin/python bash scripts/gpu_wheelhouse.sh     # here, where the package registry is reachable
#   then on the device: bash scripts/gpu_checks.sh ... with carry [".whl"] (see there)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
mkdir -p .whl
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" -d .whl \
  hydra-core==1.3.8 omegaconf==2.3.1 datasets==4.8.5 dill==0.4.1 multiprocess==0.70.19 hjson==3.1.0 \
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 inflect==7.6.0 \
  more-itertools==11.2.1 typeguard==4.6.1 jaraco.functools==4.6.0 rapidfuzz==3.14.6 portalocker==4.4.2 \
  tabulate==0.10.0 wcwidth==0.9.4 pandas==2.3.3 pytz==2025.2 tzdata==2025.2 \
  typing-extensions==4.16.0 fsspec==2026.2.0  # pydantic 2.14 needs typing-extensions >= 4.16; datasets fsspec <= 2026.2
# sdist-only on PyPI: built here into pure-Python wheels (DeepSpeed compiles its ops just in time on the GPU; the
# build imports torch, hence no build isolation)
DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w .whl antlr4-python3-runtime==4.9.3 deepspeed==0.19.8
du -sh .whl
