"""Readers for the downstream benchmark formats (§4.1): HotpotQA, 2WikiMultihopQA, CocoTrip, Diffen.

Each reader returns ``DownstreamExample`` rows for one task:
  * ``qa``  (HotpotQA / 2Wiki): question + the two gold evidence paragraphs -> answer (EM / F1);
  * ``qg``  (HotpotQG / 2WikiQG): the two gold paragraphs -> the question (BLEU / ROUGE-L);
  * ``sum`` (CocoTrip / Diffen): the two entity descriptions -> comparative summary (ROUGE-2 / L).

Formats (the released files, so users can point the config at their own copies):
  * hotpotqa: JSON list of {"_id", "question", "answer", "type", "context": [[title, [sent, ...]], ...],
    "supporting_facts": [[title, sent_idx], ...]}; comparison questions have type "comparison";
  * 2wiki: same layout; comparison types "comparison" and "bridge_comparison";
  * cocotrip: JSON list of {"entity_a", "entity_b", "entity_a_reviews": [...], "entity_b_reviews": [...],
    "common_summary": [...]} (the common-opinion setting; summaries are references);
  * diffen: JSONL of {"id", "entity1", "entity2", "doc1", "doc2", "summary"}.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from i2d2.io import DataError, read_json, read_jsonl

FORMATS = ("hotpotqa", "2wiki", "cocotrip", "diffen")
COMPARISON_TYPES = {"hotpotqa": ("comparison",), "2wiki": ("comparison", "bridge_comparison")}


@dataclass(frozen=True)
class DownstreamExample:
    id: str
    task: str                 # qa | qg | sum
    doc1: str
    doc2: str
    question: str = ""
    references: tuple[str, ...] = field(default=())


def _json_list(path: Path) -> list:
    data = read_json(path)
    if not isinstance(data, list):
        raise DataError(f"{path}:1: expected a JSON list of examples")
    return data


def _need(path, i, row, keys):
    if not isinstance(row, dict):
        raise DataError(f"{path}: example {i}: expected an object")
    missing = [k for k in keys if k not in row]
    if missing:
        raise DataError(f"{path}: example {i} ({row.get('_id', row.get('id', '?'))}): missing {', '.join(missing)}")


def _multihop(path: Path, fmt: str, task: str, types) -> list[DownstreamExample]:
    out = []
    for i, r in enumerate(_json_list(path)):
        _need(path, i, r, ("_id", "question", "answer", "type", "context", "supporting_facts"))
        if r["type"] not in types:
            continue
        titles = list(dict.fromkeys(t for t, _ in r["supporting_facts"]))
        paras = {t: " ".join(s.strip() for s in sents) for t, sents in r["context"]}
        gold = [paras[t] for t in titles if t in paras]
        if len(gold) < 2:
            raise DataError(f"{path}: example {i} ({r['_id']}): needs 2 gold paragraphs, found {len(gold)}")
        if len(gold) > 2:  # bridge comparisons: each entity's chain of evidence, in supporting-fact order
            half = len(gold) // 2
            gold = [" ".join(gold[:half]), " ".join(gold[half:])]
        if task == "qa":
            out.append(DownstreamExample(r["_id"], "qa", gold[0], gold[1], r["question"], (str(r["answer"]),)))
        else:
            out.append(DownstreamExample(r["_id"], "qg", gold[0], gold[1], "", (r["question"],)))
    return out


def load_downstream(path, fmt: str, task: str | None = None, types=None) -> list[DownstreamExample]:
    """Read a downstream file; ``task`` picks qa/qg for the multi-hop QA formats."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: downstream file not found")
    if fmt in ("hotpotqa", "2wiki"):
        task = task or "qa"
        if task not in ("qa", "qg"):
            raise ValueError(f"{fmt} supports tasks qa and qg, not {task!r}")
        return _multihop(path, fmt, task, tuple(types or COMPARISON_TYPES[fmt]))
    if fmt == "cocotrip":
        out = []
        for i, r in enumerate(_json_list(path)):
            _need(path, i, r, ("entity_a_reviews", "entity_b_reviews", "common_summary"))
            refs = r["common_summary"] if isinstance(r["common_summary"], list) else [r["common_summary"]]
            out.append(DownstreamExample(str(r.get("id", f"{r.get('entity_a', i)}-{r.get('entity_b', '')}")), "sum",
                                         " ".join(r["entity_a_reviews"]), " ".join(r["entity_b_reviews"]), "",
                                         tuple(refs)))
        return out
    if fmt == "diffen":
        rows = read_jsonl(path, required=("entity1", "entity2", "doc1", "doc2", "summary"))
        return [DownstreamExample(str(r.get("id", i)), "sum", r["doc1"], r["doc2"], "", (r["summary"],))
                for i, r in enumerate(rows)]
    raise ValueError(f"unknown downstream format {fmt!r}; expected one of {', '.join(FORMATS)}")
