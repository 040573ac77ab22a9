"""Batched inference answers exactly as one query at a time (paper-map §3.7, §4.1, §7.5): on 25 embedded examples of
every open-set task (BM25-restricted and unrestricted FAISS modes) and of every closed-set task, for NPM and NPM-single
and both span-score forms. The model is a small random BERT over real news text; the queries are the embedded
tasks' own inputs (npm.embedded.tasks, the demo's data).

A batch encodes its queries in length-sorted passes, so a query's vectors may differ from its vectors alone in the
last bits (padding changes the order of float sums); the answers and their scores must not differ beyond that."""

import numpy as np
import pytest

from npm.embedded.tasks import TASKS, prepare_embedded_tasks
from npm.inference.predictor import Predictor
from npm.inference.scoring import closed_set_scores
from npm.settings import Settings
from npm.tasks.registry import resolve_task, task_examples
from tests.conftest import build_tiny_corpus, lee_corpus_lines, save_tiny_bert

K = 64


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("batching")
    save_tiny_bert(root / "model", seed=0)
    paths = build_tiny_corpus(root, str(root / "model"), lee_corpus_lines()[:40])
    tasks = root / "tasks"
    prepare_embedded_tasks(tasks, max_articles=2000, max_per_task=25, seed=2022)
    return root, paths, tasks


def _examples(world, closed: bool, tokenizer):
    _, _, tasks = world
    out = []
    for name in TASKS:
        task = resolve_task(name)
        if task.closed == closed and (tasks / name).is_dir():
            out += [(ex["input"], task.is_question) for ex in task_examples(name, tasks / name, n_samples=0,
                                                                             tokenizer=tokenizer)]
    return out


def _same(batch: list[dict], one: list[dict]) -> None:
    """Equal phrases with equal scores (1e-5 relative); two phrases may swap only where their scores tie (another
    phrase of the list, or the first one below it at the last rank, scores the same within 1e-5)."""
    assert len(batch) == len(one)
    for i, (a, b) in enumerate(zip(batch, one, strict=True)):
        assert a["score"] == pytest.approx(b["score"], rel=1e-5, abs=1e-9)
        if a["text"] == b["text"]:
            assert a["occurrences"] == b["occurrences"] and a["evidence"] == b["evidence"]
        else:
            ties = [x for x in one if x["score"] == pytest.approx(b["score"], rel=1e-5)]
            assert len(ties) > 1 or i == len(one) - 1, (a, b)


@pytest.mark.parametrize("model", ["npm", "npm_single"])
@pytest.mark.parametrize("form", ["paper", "code"])
def test_batched_open_set_answers_equal_one_query_at_a_time(world, model, form):
    root, paths, _ = world
    p = Predictor(str(root / "model"), paths["ds"], model, Settings(span_score=form, k=K), bm25=paths["bm25"],
                  faiss=paths["faiss"], batch_size=16)
    examples = _examples(world, closed=False, tokenizer=p.tokenizer)
    assert len(examples) >= 125
    texts, questions = [t for t, _ in examples], [q for _, q in examples]
    for mode in ("restricted", "faiss"):
        batch = p.predict_batch(texts, top=3, mode=mode, is_question=questions)
        assert sum(bool(b) for b in batch) > len(texts) // 2
        for text, iq, answers in zip(texts, questions, batch, strict=True):
            _same(answers, p.predict(text, top=3, mode=mode, is_question=iq))


@pytest.mark.parametrize("model", ["npm", "npm_single"])
def test_batched_closed_set_scores_equal_one_query_at_a_time(world, model, tmp_path):
    root, paths, _ = world
    other = build_tiny_corpus(tmp_path, str(root / "model"), lee_corpus_lines()[40:70])
    predictors = [Predictor(str(root / "model"), d["ds"], model, Settings(k=K), faiss=d["faiss"], batch_size=32)
                  for d in (paths, other)]
    examples = _examples(world, closed=True, tokenizer=predictors[0].tokenizer)
    assert len(examples) >= 175
    texts = [t for t, _ in examples]
    words = [np.array(predictors[0].tokenizer.convert_tokens_to_ids([w])) for w in ("the", "a", "of", "and")]
    batch = np.concatenate([closed_set_scores(predictors, texts[a:a + 32], words, tau=5.0, tau_twice=True)
                            for a in range(0, len(texts), 32)])
    one = np.stack([closed_set_scores(predictors, [t], words, tau=5.0, tau_twice=True)[0] for t in texts])
    np.testing.assert_allclose(batch, one, rtol=1e-5, atol=1e-9)
    assert (batch.argmax(axis=1) == one.argmax(axis=1)).mean() >= 0.99  # near-ties may swap, nothing else
