"""DensePhrases as a system of the evaluation registry (``npm.evaluation.systems``, row "DensePhrases" of the
open-set knowledge tables; docs/paper-map.md §D1.5): each open-set input is asked as a question
(``npm.densephrases.evaluate.task_question``) and answered by the top phrase of the corpus's phrase index, searched as
the DensePhrases table's open-domain evaluations search (config ``densephrases``: ``search_form``, ``vectors``,
``truecase``, ``refine_factor``, ``precision``: ``Inputs.phrase_search``, the defaults where absent)."""

from __future__ import annotations

from npm.densephrases.evaluate import task_question
from npm.densephrases.truecase import truecase_records
from npm.settings import DensePhrasesSettings, options


class DensePhrasesScorer:
    def __init__(self, system, inputs, settings):
        from npm.densephrases.searcher import PhraseSearcher  # deferred: npm.densephrases.searcher loads torch

        if len(inputs.phrase_dump) != 1 or len(inputs.phrase_index) != 1:
            raise ValueError(f"{system.name} reads one corpus: give one --phrase-dump and one --phrase-index "
                             f"(got {len(inputs.phrase_dump)} and {len(inputs.phrase_index)})")
        self.settings = settings
        self.search = DensePhrasesSettings(**inputs.phrase_search)
        self.searcher = PhraseSearcher(inputs.checkpoint, inputs.phrase_dump[0], inputs.phrase_index[0],
                                       device=inputs.device, precision=self.search.precision,
                                       vectors=self.search.vectors)
        self.tokenizer = self.searcher.model.tokenizer
        meta = self.searcher.dump.meta
        self.info = {"model": str(inputs.checkpoint), "corpus": inputs.corpus, "corpus_tokens": meta["tokens"],
                     "retrieval": f"phrase index {inputs.phrase_index[0]}",
                     "device": str(self.searcher.device),
                     "parameters": int(sum(p.numel() for p in self.searcher.model.parameters())),
                     "phrase_k": settings.phrase_k, "phrase_max_words": settings.phrase_max_words,
                     **{f.name: getattr(self.search, f.name) for f in options(DensePhrasesSettings, "registry")}}

    def open_set(self, task, examples, progress=None):
        given = [task_question(task.name, ex["input"]) for ex in examples]
        asked, truecased = truecase_records(self.search.truecase, [{"question": q} for q in given])
        questions = [r["question"] for r in asked]
        found = self.searcher.search(questions, self.settings.phrase_k, self.settings.phrase_max_words, top_n=1,
                                     refine_factor=self.search.refine_factor, search_form=self.search.search_form)
        if progress:
            progress(len(examples))
        records = [{"question": q, "phrase_score": f[0]["score"] if f else None, "doc": f[0]["doc"] if f else None}
                   for q, f in zip(questions, found, strict=True)]
        return {"answers": [f[0]["text"] if f else "" for f in found], "records": records,
                "metrics": {"truecased": truecased}}
