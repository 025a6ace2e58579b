"""Decontamination against datatrove's n-gram filter: planted evaluation items found, near-misses and clean text kept.

    python bench/decontamination.py                    # the default corpus and plants
    python bench/decontamination.py --seed 1 --json decont.json

The corpus is real text every install has: Python's documentation topics, its standard library's modules, the
README of half the installed packages and every licence file the packages ship (MIT, BSD and Apache texts: real
boilerplate, many documents each). The evaluation items are made apart from it:

    prose        a paragraph of a README of the other half: its first sentence the question, the rest the answer
    boilerplate  such an item whose answer ends with a sentence of a licence (as items quoting famous text do)
    arithmetic   "What is a + b? <answer>c</answer>": short (matched whole), differing only in their numbers
    template     a word problem filled with numbers, 20 words: items that differ only in their numbers too

Planted in the corpus, each a document of its own (positives, which should be removed):

    verbatim     the item as it is
    formatted    case, punctuation and line breaks changed
    word_edit    one word replaced (prose items of 2n words or more, where an n-gram must survive)
    embedded     the item inside a clean document of 1,000 characters or more
    short_edit   one word replaced in an item shorter than 2n words, or in an item of a task that keeps its
                 numbers (whose keys must hold two of its numbers): reported, not expected to be found

An item whose text is in the corpus already (an n-gram of it in a clean document: package READMEs share
changelogs and boilerplate paragraphs) is left out of the items, since its documents are neither clean nor planted;
the count is printed. Near-misses (negatives, which should be kept): the same arithmetic question and word problem with other numbers,
and documents that share only a licence sentence with an item (the licence files themselves). Every other document
is clean. Recall is per kind of plant; precision is planted documents among those removed; "clean removed" is the
share of clean documents (near-misses included) removed. Ours is tasks/data/contamination.py with the pipeline's
defaults (13-grams, common above 10 documents); datatrove's `NGramsDecontIndexer`/`NGramsDecontFilter` run with
their defaults (12-grams over the answer and across question and answer) and with query n-grams too, on words
split at whitespace after its own normalisation (its English tokenizer needs spaCy). CPU seconds are the
process's, index and filter together.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "bench"))
from quality_crosscheck import package_readmes  # noqa: E402
from infra.machine import machine  # noqa: E402
from tasks.data.builtin_corpus import python_docs, stdlib_files  # noqa: E402
from tasks.data.contamination import ContaminationIndex, DocumentMatches, TaskItems, judge, words  # noqa: E402

N = 13
COMMON_DOCS = 10
LICENCE_SENTENCES = (
    "THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT NOT LIMITED "
    "TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT.",
    "Redistributions in binary form must reproduce the above copyright notice, this list of conditions and the "
    "following disclaimer in the documentation and/or other materials provided with the distribution.",
    "Unless required by applicable law or agreed to in writing, software distributed under the License is "
    "distributed on an \"AS IS\" BASIS, WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.",
)
TEMPLATE = ("A farmer has {a} cows in the north field and buys {b} more at the market on Monday morning. How many "
            "cows does the farmer have now? {c}")
FILLERS = ("river", "window", "silver", "garden", "yellow", "market", "engine", "winter")


@dataclass
class Item:
    task: str
    question: str
    answer: str

    @property
    def text(self) -> str:
        return f"{self.question} {self.answer}"


@dataclass
class Bench:
    items: list[Item] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)  # "clean", "near:<kind>" or "plant:<kind>"
    natural: int = 0  # candidate items left out because the corpus holds them already

    def add(self, text: str, kind: str) -> None:
        self.texts.append(text)
        self.kinds.append(kind)


def licence_files() -> list[str]:
    site = Path(json.__file__).parent  # any module of the interpreter: its site-packages lie beside
    roots = {Path(p) for p in sys.path if p.endswith("site-packages")} or {site}
    out = []
    for root in sorted(roots):
        for p in sorted(root.glob("*.dist-info/**/*")):
            if p.is_file() and re.match(r"(?i)licen[cs]e", p.name):
                text = p.read_text(errors="replace")
                if text.strip():
                    out.append(text)
    return out


def paragraphs(text: str) -> list[str]:
    return [re.sub(r"\s+", " ", p).strip() for p in re.split(r"\n\s*\n", text)
            if len(p.split()) >= 25 and len(re.findall(r"[.!?](?:\s|$)", p)) >= 2 and "|" not in p]


def split_item(paragraph: str) -> tuple[str, str]:
    m = re.search(r"[.!?]\s", paragraph)
    return paragraph[:m.end()].strip(), paragraph[m.end():].strip()


def natural_left_out(paragraphs: list[str], corpus: list[str]) -> tuple[list[str], int]:
    """`paragraphs` without those that share a run of N words with a document of `corpus` (plain string search over
    the normalised texts, apart from the index under test), and how many were left out."""
    text = "\n".join(" ".join(words(t, False)[0]) for t in corpus)
    kept = []
    for p in paragraphs:
        ws = words(p, False)[0]
        if not any(" ".join(ws[i:i + N]) in text for i in range(0, max(len(ws) - N, 0) + 1, 4)):
            kept.append(p)
    return kept, len(paragraphs) - len(kept)


def formatted(text: str, rng: random.Random) -> str:
    """Case, punctuation and line breaks changed; every word kept."""
    out = text.upper() if rng.random() < 0.5 else text.lower()
    out = re.sub(r"[,;:]", "", out) if rng.random() < 0.5 else out.replace(". ", "!\n")
    return re.sub(r" ", lambda m: "\n" if rng.random() < 0.1 else "  " if rng.random() < 0.1 else " ", out)


def word_edited(text: str, rng: random.Random) -> str:
    ws = text.split(" ")
    i = rng.randrange(len(ws))
    ws[i] = rng.choice(FILLERS)
    return " ".join(ws)


def build(seed: int, n_prose: int, n_arith: int, n_template: int, n_stdlib: int) -> Bench:
    rng = random.Random(seed)
    bench = Bench()
    readmes = package_readmes()
    rng.shuffle(readmes)
    half = len(readmes) // 2
    # Clean documents: real text.
    for _, _, text in python_docs():
        bench.add(text, "clean")
    for _, text in readmes[:half]:
        bench.add(text, "clean")
    for p in stdlib_files()[:n_stdlib]:
        bench.add(p.read_text(errors="replace"), "clean")
    for text in licence_files():
        bench.add(text, "near:boilerplate")
    clean = [t for t, k in zip(bench.texts, bench.kinds) if k == "clean" and len(t) >= 1000]
    # Items, apart from the corpus.
    paras = sorted({p for _, t in readmes[half:] for p in paragraphs(t)})
    rng.shuffle(paras)
    paras, bench.natural = natural_left_out(paras, bench.texts)
    prose = [Item("prose", *split_item(p)) for p in paras[:n_prose]]
    boiler = [Item("boilerplate", *split_item(p)) for p in paras[n_prose:n_prose + n_prose // 5]]
    for i, item in enumerate(boiler):
        item.answer += " " + LICENCE_SENTENCES[i % len(LICENCE_SENTENCES)]
    sums = rng.sample([(a, b) for a in range(100) for b in range(100)], n_arith * 2)
    arith = [Item("arithmetic", f"What is {a} + {b}?", f"<answer>{a + b}</answer>") for a, b in sums[:n_arith]]
    pairs = rng.sample([(a, b) for a in range(2, 300) for b in range(2, 300)], n_template * 2)
    template = [Item("template", *TEMPLATE.format(a=a, b=b, c=a + b).rsplit("? ", 1)) for a, b in pairs[:n_template]]
    for item in template:
        item.question += "?"
    bench.items = prose + boiler + arith + template
    # Plants: a quarter of each task's items, each planted one way.
    for task_items in (prose, boiler, arith, template):
        for item in rng.sample(task_items, len(task_items) // 4):
            text, n_words = item.text, len(words(item.text, True)[0])
            kind = rng.choice(["verbatim", "formatted", "word_edit", "embedded"])
            if kind == "word_edit" and (n_words < 2 * N or item.task in ("arithmetic", "template")):
                kind = "short_edit"
            if kind == "verbatim":
                bench.add(text, "plant:verbatim")
            elif kind == "formatted":
                bench.add(formatted(text, rng), "plant:formatted")
            elif kind in ("word_edit", "short_edit"):
                bench.add(word_edited(text, rng), f"plant:{kind}")
            else:
                host = rng.choice(clean)
                at = host.find("\n", len(host) // 2)
                at = at if at > 0 else len(host) // 2
                bench.add(host[:at] + "\n" + text + "\n" + host[at:], "plant:embedded")
    # Near-misses: the templates with other numbers.
    for a, b in sums[n_arith:]:
        bench.add(f"Quiz\n\nWhat is {a} + {b}? <answer>{a + b}</answer>", "near:template")
    for a, b in pairs[n_template:]:
        bench.add(TEMPLATE.format(a=a, b=b, c=a + b), "near:template")
    return bench


def ours(bench: Bench) -> tuple[set[int], float]:
    started = time.process_time()
    tasks: dict[str, list[str]] = {}
    for item in bench.items:
        tasks.setdefault(item.task, []).append(item.text)
    index = ContaminationIndex([TaskItems(k, v) for k, v in tasks.items()], N)
    matches = DocumentMatches(index)
    matches.add(bench.texts)
    common = matches.common(COMMON_DOCS)
    removed = {d for d in matches.doc_keys
               if judge(index, bench.texts[d], common, "drop", 200, 10, 200).drop}
    return removed, time.process_time() - started


def datatrove(bench: Bench, query_ngrams: bool) -> tuple[set[int], float]:
    from datatrove.data import Document
    from datatrove.pipeline.decont.n_grams import NGramsDecontConfig, NGramsDecontFilter, NGramsDecontIndexer
    from datatrove.utils.hashing import create_hash_func
    from datatrove.utils.word_tokenizers import WhitespaceTokenizer

    class SplitWords(WhitespaceTokenizer):
        def word_tokenize(self, text: str) -> list[str]:
            return text.split()

    started = time.process_time()
    config = NGramsDecontConfig(find_query_ngrams=query_ngrams)
    # The indexer's class needs lighteval to be built (its registry); its compute_hashes, datatrove's own code, is
    # called on a stand-in that holds what it reads.
    indexer = SimpleNamespace(config=config, tokenizer=SplitWords(), hash_func=create_hash_func(config.hash_config))
    hashes: dict[int, str] = {}
    for item in bench.items:
        for h in NGramsDecontIndexer.compute_hashes(indexer, item.answer, item.question):
            hashes.setdefault(h, item.task)
    filt = NGramsDecontFilter("/tmp/unused-decont-index", config=config, language=SplitWords())
    filt._index_hashes = hashes
    removed = set()
    for i, text in enumerate(bench.texts):
        verdict = filt.filter(Document(text=text, id=str(i)))
        if verdict is not True:
            removed.add(i)
    return removed, time.process_time() - started


def scores(bench: Bench, removed: set[int]) -> dict:
    kinds = sorted(set(bench.kinds))
    by_kind = {k: [i for i, kk in enumerate(bench.kinds) if kk == k] for k in kinds}
    planted = {i for i, k in enumerate(bench.kinds) if k.startswith("plant:")}
    expected = {i for i in planted if bench.kinds[i] != "plant:short_edit"}
    negatives = [i for i, k in enumerate(bench.kinds) if not k.startswith("plant:")]
    out = {"recall": {k[6:]: len(removed & set(v)) / len(v) for k, v in by_kind.items() if k.startswith("plant:")},
           "recall_expected": len(removed & expected) / max(len(expected), 1),
           "precision": len(removed & planted) / max(len(removed), 1),
           "removed": len(removed),
           "clean_removed": sum(i in removed for i in negatives) / max(len(negatives), 1),
           "negatives_removed": {k: sum(i in removed for i in v) for k, v in by_kind.items() if not k.startswith("plant:")}}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prose", type=int, default=500, help="prose items (a fifth as many boilerplate items)")
    parser.add_argument("--arithmetic", type=int, default=300)
    parser.add_argument("--template", type=int, default=200)
    parser.add_argument("--stdlib", type=int, default=400, help="standard-library modules in the corpus")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    bench = build(args.seed, args.prose, args.arithmetic, args.template, args.stdlib)
    counts = {k: bench.kinds.count(k) for k in sorted(set(bench.kinds))}
    print(f"machine: {machine()}")
    print(f"corpus: {len(bench.texts)} documents ({sum(map(len, bench.texts)) / 1e6:.1f} M characters); "
          f"items: {len(bench.items)} ({bench.natural} candidates left out, held by the corpus already); kinds: {counts}")
    results = {}
    for name, fn in (("ours", lambda: ours(bench)), ("datatrove", lambda: datatrove(bench, False)),
                     ("datatrove+query", lambda: datatrove(bench, True))):
        removed, cpu = fn()
        results[name] = scores(bench, removed) | {"cpu_s": round(cpu, 2)}
    base = results["datatrove"]["cpu_s"]
    print(f"\n| method | recall (expected plants) | " + " | ".join(f"recall {k}" for k in results["ours"]["recall"])
          + " | precision | clean removed | near-misses removed | CPU s | CPU vs datatrove |")
    print("|---" * (7 + len(results["ours"]["recall"])) + "|")
    for name, r in results.items():
        near = ", ".join(f"{k}: {v}" for k, v in r["negatives_removed"].items())
        print(f"| {name} | {r['recall_expected']:.3f} | " + " | ".join(f"{v:.3f}" for v in r["recall"].values())
              + f" | {r['precision']:.3f} | {r['clean_removed']:.2%} | {near} | {r['cpu_s']:.1f} | "
              f"{r['cpu_s'] / max(base, 1e-9):.2f}x |")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "kinds": counts, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
