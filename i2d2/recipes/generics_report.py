"""Per-iteration report of the I2D2 loop: markdown file + tracker metrics/tables/images.

What one iteration reports (i2d2.txt §3.3, §3.4, A.1.7):
  * prompts used, generations made, constraint-satisfaction rate;
  * the critic: test-split AP (beside the surface-only floor and the LM-perplexity ranker), δ from the dev split,
    precision/recall at δ on test with the counts kept, the invariance-probe shift;
  * the generator's *critic-accepted rate before filtering* — the share of all generations with critic score
    > δ (the paper's 45% → 58% → 62% measure); with human labels for this iteration's generations (imported
    into the run's labels store) also their human-judged accuracy;
  * kept fraction after the filter (critic, constraints, de-duplication);
  * diversity: Self-BLEU on a sample and the mark-and-recapture (Chapman) unique-population estimate;
  * samples, and the precision-recall curves of every iteration so far on one plot (Figure 7).
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections import defaultdict
from pathlib import Path
from typing import Collection, Mapping, Sequence

import numpy as np

from critics.surface import floor_warning, margin_text
from critics.train import LOGGED_NAMES as CRITIC_LOGGED_NAMES
from i2d2.io import read_jsonl, write_json, write_text
from i2d2.metrics import chapman_estimate, self_bleu

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- diversity

def _norm(text: str) -> str:
    """Case, hyphens, punctuation and spacing folded (i2d2.filtering.dedupe_key)."""
    from i2d2.filtering import dedupe_key

    return dedupe_key(text)


def mark_recapture(rows: Sequence[Mapping], fraction: float = 0.3, bleu_threshold: float = 0.85, seed: int = 0,
                   text_key: str = "statement", concept_key: str = "concept") -> dict:
    """Unique-population estimate of a corpus by mark and recapture (i2d2.txt A.1.7).

    Two independent random captures of ``fraction`` of the corpus each. An item of the second capture is a
    recapture when its BLEU against the first capture's items *of the same concept* exceeds
    ``bleu_threshold`` (0.85 in the paper; scaled 0-1). Chapman's estimator then gives the number of unique
    generics, over the whole corpus and per concept (the paper reports the per-concept mean).
    """
    from sacrebleu.metrics import BLEU

    n = len(rows)
    if n == 0:
        return {"population": 0.0, "per_concept_mean": 0.0, "n_first": 0, "n_second": 0, "recaptured": 0,
                "n_concepts": 0}
    rng = np.random.default_rng(seed)
    size = max(1, int(round(fraction * n)))
    first = rng.choice(n, size=size, replace=False)
    second = rng.choice(n, size=size, replace=False)
    bleu = BLEU(effective_order=True)

    def identify(i: int, registries: list[dict], own: dict, prefix: str) -> str:
        """The individual row i is: a known one (same text, or BLEU > threshold with one of the same concept)
        from ``registries`` in order, else a new one registered in ``own``."""
        concept, text = str(rows[i].get(concept_key, "")), _norm(rows[i][text_key])
        for reg in registries:
            known = reg.get(concept, [])
            for t, key in known:
                if t == text:
                    return key
            if known:
                scores = [bleu.sentence_score(text, [t]).score / 100.0 for t, _ in known]
                best = int(np.argmax(scores))
                if scores[best] > bleu_threshold:
                    return known[best][1]
        key = f"{prefix}{i}"
        own.setdefault(concept, []).append((text, key))
        return key

    marked: dict[str, list] = {}
    first_keys = [identify(int(i), [marked], marked, "m") for i in first]
    unmarked: dict[str, list] = {}
    second_keys, per_concept_second = [], defaultdict(list)
    for j in second:
        key = identify(int(j), [marked, unmarked], unmarked, "u")
        second_keys.append(key)
        per_concept_second[str(rows[int(j)].get(concept_key, ""))].append(key)
    per_concept_first = defaultdict(list)
    for i, key in zip(first, first_keys):
        per_concept_first[str(rows[int(i)].get(concept_key, ""))].append(key)
    est = chapman_estimate(first_keys, second_keys)
    per_concept = [chapman_estimate(per_concept_first.get(c, []), per_concept_second.get(c, []))
                   for c in set(per_concept_first) | set(per_concept_second)]
    first_list = sorted(set(first_keys))
    return {"population": float(est), "per_concept_mean": float(np.mean(per_concept)),
            "n_first": len(first_list), "n_second": len(set(second_keys)),
            "recaptured": len(set(first_list) & set(second_keys)), "n_concepts": len(per_concept)}


def diversity(texts_rows: Sequence[Mapping], sample: int = 200, seed: int = 0, fraction: float = 0.3,
              bleu_threshold: float = 0.85) -> dict:
    """Self-BLEU on a random sample (lower = more diverse) + mark-and-recapture estimates."""
    rng = np.random.default_rng(seed)
    idx = rng.permutation(len(texts_rows))[:sample]
    texts = [texts_rows[i]["statement"] for i in idx]
    mnr = mark_recapture(texts_rows, fraction, bleu_threshold, seed)
    return {"self_bleu": self_bleu(texts), "self_bleu_n": len(texts), "unique_estimate": mnr["population"],
            "unique_per_concept": mnr["per_concept_mean"], "mnr": mnr,
            "distinct_fraction": len({_norm(r["statement"]) for r in texts_rows}) / max(1, len(texts_rows))}


# ----------------------------------------------------------------------------- human labels

def human_labels(store_rows: Sequence[Mapping]) -> dict[str, int]:
    """normalised statement -> 0/1 from rows loaded with critics.data.load_annotations (field ``y``)."""
    return {_norm(r["statement"]): int(r["y"]) for r in store_rows if r.get("y") is not None}


def human_eval(rows: Sequence[Mapping], labels: Mapping[str, int], delta: float,
               test_concepts: Collection[str] | None = None) -> dict | None:
    """Accuracy of the generator (before the critic) on the labelled generations, and the critic's PR on those of
    its ``test_concepts`` (None: all): the loop's critic trains on the labels store too, so a labelled generation of
    another concept may be one it was fitted on (train) or chose δ with (dev). Concepts compare as the split groups
    them (``critics.data.concept_key``: "Dog" is split.json's "dog")."""
    from critics.data import concept_key

    test_keys = None if test_concepts is None else {concept_key(c) for c in test_concepts}
    hits = [(labels[_norm(r["statement"])], float(r["critic_score"]),
             test_keys is None or concept_key(str(r.get("concept", ""))) in test_keys)
            for r in rows if _norm(r["statement"]) in labels
            and r.get("critic_score") is not None]  # unfinished: never scored
    if not hits:
        return None
    y = np.array([h[0] for h in hits])
    test = np.array([h[2] for h in hits], dtype=bool)
    y_test, s_test = y[test], np.array([h[1] for h in hits])[test]
    keep = s_test > delta
    return {"n_labelled": len(hits), "human_accuracy": float(y.mean()), "n_labelled_test_concepts": int(test.sum()),
            "human_precision_at_delta": float(y_test[keep].mean()) if keep.any() else None,
            "y": y_test.tolist(), "scores": s_test.tolist()}


# ----------------------------------------------------------------------------- PR curves of all iterations

def pr_data(iter_dir: Path) -> tuple[str, list[int], list[float]] | None:
    """The PR data an iteration saved: human-labelled generations if any, else the critic's validation set."""
    p = Path(iter_dir) / "report" / "pr_data.json"
    if not p.exists():
        return None
    d = json.loads(p.read_text())
    return d["source"], d["y"], d["scores"]


def plot_all_iterations(run_dir: Path, upto: int, out_path: Path) -> dict:
    """Figure 7: one PR curve per iteration 0..upto that has PR data; returns {curve name: AP}."""
    from callbacks.plots import plot_pr_curves

    curves = {}
    for k in range(upto + 1):
        d = pr_data(Path(run_dir) / f"iter_{k}")
        if d is None:
            continue
        source, y, s = d
        curves[f"iteration {k} ({source}, n={len(y)})"] = (y, s)
    if not curves:
        return {}
    return plot_pr_curves(curves, out_path, title="I2D2 iterations: critic precision-recall")


# ----------------------------------------------------------------------------- markdown

def _fmt(v, digits: int = 3) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:.{digits}f}"
    return str(v)


def _esc(s) -> str:
    # a generation's control characters (a stray \x13 from a byte-level tokenizer) show as escapes, not blanks
    s = str(s).replace("|", "\\|").replace("\n", " ")
    return re.sub(r"[\x00-\x1f\x7f]", lambda m: f"\\x{ord(m.group()):02x}", s)


def history(run_dir: Path, upto: int) -> list[dict]:
    out = []
    for k in range(upto + 1):
        p = Path(run_dir) / f"iter_{k}" / "report" / "metrics.json"
        if p.exists():
            out.append(json.loads(p.read_text()))
    return out


# the columns of the table of all iterations (report.md and the tracker's report/iterations)
HISTORY_COLUMNS = ("iteration", "n_generations", "constraint_satisfaction_rate", "critic_ap", "delta", "accepted_rate",
                   "heldout_accuracy", "kept_fraction", "self_bleu_kept", "heldout_self_bleu", "unique_estimate")

# where the filter's δ came from (metrics' delta_source) -> its row in the report
_DELTA_LABEL = {"dev": "δ — chosen on the dev split", "critic.delta": "δ — set by critic.delta (not chosen on data)",
                "task.filter.delta": "δ — set by task.filter.delta (not chosen on data)"}


def render_markdown(m: Mapping, samples: Mapping[str, Sequence[Mapping]], hist: Sequence[Mapping],
                    pr_png: str | None) -> str:
    k = m["iteration"]
    lines = [f"# I2D2 iteration {k}", "",
             f"Generator P_{k}: `{m['generator']}` → fine-tuned P_{k + 1}: `{m.get('next_model', '–')}`", "",
             "| measure | value |", "|---|---|"]
    shifts = [v for v in (m.get("critic_probe_shift"), m.get("critic_probe_shift_read")) if v is not None]
    if shifts and max(shifts) > 0.1:
        lines[-2:-2] = [f"> **Warning: the critic's probe shift is {_fmt(m.get('critic_probe_shift'))} over all rewrite "
                        f"pairs, {_fmt(m.get('critic_probe_shift_read'))} over the pairs it reads as two texts (> 0.1): "
                        "meaning-preserving rewrites move its score, so it partly judges wording, not truth** "
                        "(critic/probe_scores.jsonl).", ""]
    below_floor = floor_warning(m.get("critic_ap"), m.get("critic_surface_ap"))
    if below_floor:
        lines[-2:-2] = [f"> **Warning: {below_floor}** (critic/metrics.json).", ""]
    rows = [
        ("prompts", m["n_prompts"]), ("generations", m["n_generations"]),
        ("constraint satisfaction rate", m["constraint_satisfaction_rate"]),
        ("critic", f"`{m['critic_model']}`" + (f" (reused from iteration {m['critic_reused_from']})"
                                               if m.get("critic_reused_from") is not None else "")),
        ("critic AP — test split", m["critic_ap"]),
        (f"surface-only floor AP — test split (critic must beat it by ≥ {margin_text(m.get('critic_surface_ap'))})",
         m.get("critic_surface_ap")),
        ("LM-perplexity AP — test split", m.get("critic_ap_perplexity")),
        (_DELTA_LABEL.get(m.get("delta_source", "dev"), "δ"), m["delta"]),
        ("critic precision / recall at δ — test split (kept / labelled)",
         f"{_fmt(m.get('critic_precision'))} / {_fmt(m.get('critic_recall'))} "
         f"({_fmt(m.get('critic_n_kept_test'))} / {_fmt(m.get('critic_n_test'))})"),
        ("probe shift, mean abs Δ score under rewrites — probes.jsonl (must be < 0.1)", m.get("critic_probe_shift")),
        ("probe shift over the pairs the critic reads as two texts (a canonicalised adverb is one text)",
         m.get("critic_probe_shift_read")),
        ("probe AP — probes.jsonl", m.get("critic_probe_ap")),
        ("critic-accepted rate before filtering (score > δ) — a critic proxy, not accuracy", m["accepted_rate"]),
        ("human-judged accuracy of this iteration's labelled generations (labels store)", m.get("human_accuracy")),
        ("**person-judged accuracy, held-out concepts (blind)**",
         "–" if m.get("heldout_accuracy") is None else
         f"{_fmt(m['heldout_accuracy'])} (95 % CI {_fmt(m.get('heldout_ci95_low'))}–{_fmt(m.get('heldout_ci95_high'))}, "
         f"n={m.get('heldout_n_labelled')})"),
        ("held-out generations: critic-accepted rate (proxy) / Self-BLEU",
         f"{_fmt(m.get('heldout_critic_accepted_rate_proxy'))} / {_fmt(m.get('heldout_self_bleu'))}"),
        ("kept fraction (critic, constraints, repeated list items, de-dup, per-frame and per-concept caps)", m["kept_fraction"]),
        ("kept statements", m["n_kept"]),
        # metrics.json from before the sample sizes were recorded (re-rendered by annotate import --blind): all
        # generations' sample was task.report.self_bleu_sample then, not the kept sample's size
        *([(f"Self-BLEU of kept (a sample of {_fmt(m.get('self_bleu_kept_n'))})", m.get("self_bleu_kept")),
           (f"Self-BLEU of all generations (a sample of {_fmt(m.get('self_bleu_all_n'))}, the kept sample's size)",
            m.get("self_bleu_all"))] if m.get("self_bleu_all_n") is not None else
          [("Self-BLEU of kept (sample)", m.get("self_bleu_kept")),
           ("Self-BLEU of all generations (sample)", m.get("self_bleu_all"))]),
        ("unique kept generics, MnR Chapman estimate", m.get("unique_estimate")),
        ("… per concept (mean)", m.get("unique_per_concept")),
        # the fit's train_loss is its last epoch's mean (trainers.lm_finetune), not its final step's loss
        ("fine-tuning: examples / steps / mean loss of the last epoch",
         f"{m.get('finetune_n_train')} / {m.get('finetune_steps')} / {_fmt(m.get('finetune_loss'))}"),
    ]
    lines += [f"| {a} | {_fmt(b)} |" for a, b in rows]
    if len(hist) > 1:
        lines += ["", "## All iterations", "",
                  "| iteration | generations | constraint sat. | critic AP (test) | δ | accepted rate (critic proxy) "
                  "| person-judged accuracy, held-out (blind) | kept (fraction) | Self-BLEU kept | Self-BLEU held-out "
                  "| unique (MnR) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for h in hist:  # kept: the count beside its fraction (a bare "kept" column of fractions read as counts)
            cells = [_fmt(h.get(c)) for c in HISTORY_COLUMNS]
            cells[HISTORY_COLUMNS.index("kept_fraction")] = f"{_fmt(h.get('n_kept'))} ({_fmt(h.get('kept_fraction'))})"
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", "Person-judged accuracy comes from `python -m i2d2.annotate export --blind` / `import --blind` "
                  "(held-out concepts, no scores or iterations shown); `annotate accuracy` recomputes it after labelling."]
    # most generations first, as by_prompt_form orders them: metrics.json stores them with sorted keys, so a report
    # re-rendered from it (annotate import --blind) listed them alphabetically
    forms = dict(sorted((m.get("by_form") or {}).items(), key=lambda kv: -(kv[1].get("generations") or 0)))
    held = {r["form"]: r for r in m.get("heldout_by_form") or []}
    if forms or held:
        lines += ["", "## Prompt forms", "",
                  "| form | prompts | generations | constraints met | critic-accepted (proxy) | kept | held-out: "
                  "person-judged accuracy (95 % CI, n) |", "|---|---|---|---|---|---|---|"]
        for form in list(forms) + [f for f in held if f not in forms]:
            f, h = forms.get(form, {}), held.get(form, {})
            acc = "–" if h.get("accuracy") is None else (f"{_fmt(h['accuracy'])} ({_fmt(h.get('ci95_low'))}–"
                                                        f"{_fmt(h.get('ci95_high'))}, n={h.get('n_labelled')})")
            lines.append(f"| {form} | {_fmt(f.get('prompts'))} | {_fmt(f.get('generations'))} | "
                         f"{_fmt(f.get('satisfied_rate'))} | {_fmt(f.get('accepted_rate'))} | {_fmt(f.get('kept'))} "
                         f"| {acc} |")
        lines += ["", "The forms' measured yields that chose the default order: "
                  "`i2d2/data/annotations/prompt_form_yield.json` (README: I2D2 prompts)."]
    if pr_png:
        lines += ["", "## Precision-recall, all iterations", "", f"![PR curves]({pr_png})",
                  "", "Curves use human labels of that iteration's generations of the critic's test concepts where "
                  "the run's labels store has them, otherwise the critic's test split (labelled generations of "
                  "concepts it never trained on)."]
    for title, rows_ in samples.items():
        lines += ["", f"## {title}", "", "| critic score | constraints | statement |", "|---|---|---|"]
        lines += [f"| {r['critic_score']:.3f} | {'✓' if r.get('all_satisfied') else '✗'} | {_esc(r['statement'])} |"
                  for r in rows_]
    return "\n".join(lines) + "\n"


def _distinct(rows: Sequence[Mapping]) -> list[Mapping]:
    seen, out = set(), []
    for r in rows:
        key = _norm(r["statement"])
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def by_prompt_form(kept: Sequence[Mapping], dropped: Sequence[Mapping], delta: float | None) -> dict:
    """This iteration's generations per prompt form (goal prompts as ``goal``): prompts, generations, the share
    meeting every constraint (a form whose clauses the decoder misses shows here, not in the overall rate), the
    critic-accepted share (score > δ: a proxy) and how many were kept. A form's yield that a person judged is the
    held-out table (``heldout_by_form``, filled in by ``annotate import --blind``)."""
    out: dict[str, dict] = {}
    for r, kept_ in [(r, True) for r in kept] + [(r, False) for r in dropped]:
        f = out.setdefault(str(r.get("form") or "–"), {"prompts": set(), "generations": 0, "satisfied": 0,
                                                       "with_sat": 0, "accepted": 0, "kept": 0})
        f["prompts"].add(r.get("prompt_id"))
        f["generations"] += 1
        f["with_sat"] += int("all_satisfied" in r)  # generations without constraint columns: unknown, not 0
        f["satisfied"] += int(bool(r.get("all_satisfied")))
        f["accepted"] += int(delta is not None and r.get("critic_score") is not None and r["critic_score"] > delta)
        f["kept"] += int(kept_)
    return {form: {"prompts": len(f["prompts"]), "generations": f["generations"], "kept": f["kept"],
                   "satisfied_rate": f["satisfied"] / f["with_sat"] if f["with_sat"] else None,
                   "accepted_rate": f["accepted"] / f["generations"] if delta is not None else None}
            for form, f in sorted(out.items(), key=lambda kv: -kv[1]["generations"])}


def pick_samples(kept: Sequence[Mapping], dropped: Sequence[Mapping], n: int = 10, seed: int = 0) -> dict:
    """Sample tables (distinct statements): best and random kept, critic-rejected nearest δ and lowest."""
    rng = np.random.default_rng(seed)
    kept = _distinct(kept)
    rejected = _distinct([r for r in dropped if r.get("drop_reason", "critic") == "critic"])
    top = sorted(kept, key=lambda r: -r["critic_score"])[:n]
    rand = [kept[i] for i in sorted(rng.permutation(len(kept))[:n].tolist())]
    near = sorted(rejected, key=lambda r: -r["critic_score"])[:n]
    worst = sorted(rejected, key=lambda r: r["critic_score"])[:n]
    out = {f"Top kept generations ({len(kept)} distinct kept)": top, "Random kept generations": rand}
    if len(rejected) <= n:  # the two rejected tables would show the same rows
        return {**out, f"Rejected by the critic (all {len(rejected)} distinct)": near}
    return {**out, f"Rejected by the critic, closest to δ ({len(rejected)} distinct)": near,
            "Rejected by the critic, lowest score": worst}


# the report's numbers that a stage of the same run logs under its own name: the report does not log them again
# (a second name for one quantity), its report.md and metrics.json keep them
LOGGED_BY_STAGE = {
    "n_prompts": "generation/n_prompts", "n_generations": "generation/n_generations",
    "constraint_satisfaction_rate": "generation/constraint_satisfaction_rate", "prompts_per_s": "generation/prompts_per_s",
    "delta": "filter/delta", "n_kept": "filter/n_kept", "kept_fraction": "filter/kept_fraction",
    "heldout_n_generations": "heldout/n_generations",
    **{f"critic_{k}": f"critic/{CRITIC_LOGGED_NAMES.get(k, k)}" for k in (
        "ap", "ap_perplexity", "delta", "dev_precision", "n_test", "n_test_concepts", "surface_ap", "surface_auc_gap",
        "probe_shift", "probe_shift_read", "probe_ap")},
}
# the report's own numbers measured on labelled rows, logged as report/<split>_<key> (<stage>/<split>_<what>, as
# critic/ logs them): the critic's test split at the filter's δ, and the labelled generations of its test concepts
LOGGED_NAMES = {k: f"test_{k}" for k in ("critic_precision", "critic_recall", "human_precision_at_delta")} | {
    "critic_n_kept_test": "test_critic_n_kept"}


def write_report(iter_dir: Path, run_dir: Path, metrics: Mapping, kept: Sequence[Mapping],
                 dropped: Sequence[Mapping], pr: Mapping, tracker=None, n_samples: int = 10, seed: int = 0) -> dict:
    """Write ``iter_dir/report/{metrics.json, pr_data.json, pr_curves.png}`` and ``iter_dir/report.md``."""
    iter_dir, run_dir = Path(iter_dir), Path(run_dir)
    rdir = iter_dir / "report"
    metrics = {**metrics, "by_form": by_prompt_form(kept, dropped, metrics.get("delta"))}
    write_json(rdir / "pr_data.json", pr)
    write_json(rdir / "metrics.json", dict(metrics))
    aps = plot_all_iterations(run_dir, int(metrics["iteration"]), rdir / "pr_curves.png")
    samples = pick_samples(kept, dropped, n_samples, seed)
    write_json(rdir / "samples.json", list(samples.items()))  # re-rendered by refresh_heldout_accuracy, in order
    hist = history(run_dir, int(metrics["iteration"]))
    md = render_markdown(metrics, samples, hist, "report/pr_curves.png" if aps else None)
    write_text(iter_dir / "report.md", md)
    if tracker is not None:
        tracker.log_metrics({f"report/{LOGGED_NAMES.get(k, k)}": v for k, v in metrics.items()
                             if k not in LOGGED_BY_STAGE and isinstance(v, (int, float)) and not isinstance(v, bool)
                             and v is not None and not (isinstance(v, float) and math.isnan(v))},
                            step=int(metrics["iteration"]))
        cols = ["sample", "critic_score", "all_satisfied", "prompt", "generation", "concept"]
        tracker.log_table("report/samples", cols, [[t, r["critic_score"], r.get("all_satisfied"), r.get("prompt"),
                                                    r.get("generation"), r.get("concept")]
                                                   for t, rs in samples.items() for r in rs])
        if hist:  # the markdown table's columns (it had the labels store's human_accuracy, not the blind held-out one)
            hcols = [*HISTORY_COLUMNS[:7], "n_kept", *HISTORY_COLUMNS[7:]]
            tracker.log_table("report/iterations", hcols, [[h.get(c) for c in hcols] for h in hist])
        fcols = ["form", "prompts", "generations", "satisfied_rate", "accepted_rate", "kept"]
        tracker.log_table("report/prompt_forms", fcols, [[f, *(v[c] for c in fcols[1:])]
                                                         for f, v in metrics["by_form"].items()])
        if aps:
            tracker.log_image("report/pr_curves_all_iterations", rdir / "pr_curves.png")
    return {"report": str(iter_dir / "report.md"), "pr_aps": aps}


HELDOUT_KEYS = {"heldout_accuracy": "accuracy", "heldout_n_labelled": "n_labelled", "heldout_ci95_low": "ci95_low",
                "heldout_ci95_high": "ci95_high"}


def refresh_heldout_accuracy(run_dir: Path) -> list[Path]:
    """Put the person-judged held-out accuracy into every finished iteration's ``report/metrics.json`` and
    re-render its ``report.md`` (same samples and plot): the labels arrive (``annotate import --blind``) after
    the iterations wrote their reports. Returns the reports rewritten. The run's W&B record is left as it was
    (its run has ended); a resumed iteration logs the accuracy with its report."""
    from i2d2.annotation import heldout_accuracy

    run_dir = Path(run_dir)
    acc = {int(r["iteration"]): r for r in heldout_accuracy(run_dir)}
    by_form: dict[int, list] = {}
    for r in heldout_accuracy(run_dir, by="form"):
        by_form.setdefault(int(r["iteration"]), []).append(r)
    metrics = {}
    for k in sorted(acc):  # every iteration's numbers first: a report's table of all iterations reads them
        path = run_dir / f"iter_{k}" / "report" / "metrics.json"
        if path.exists():
            metrics[k] = {**json.loads(path.read_text()), **{key: acc[k][src] for key, src in HELDOUT_KEYS.items()},
                          "heldout_by_form": by_form.get(k, [])}
            write_json(path, metrics[k])
    out = []
    for k, m in metrics.items():
        it_dir = run_dir / f"iter_{k}"
        samples_path = it_dir / "report" / "samples.json"
        if not samples_path.exists():
            log.warning("%s: no report/samples.json (written before this version): report/metrics.json has the "
                        "accuracy, report.md is re-rendered when the iteration is resumed", it_dir)
            continue
        pr_png = "report/pr_curves.png" if (it_dir / "report" / "pr_curves.png").exists() else None
        md = render_markdown(m, dict(json.loads(samples_path.read_text())), history(run_dir, k), pr_png)
        out.append(write_text(it_dir / "report.md", md))
    return out


def load_rows(path: Path) -> list[dict]:
    return read_jsonl(path) if Path(path).exists() else []
