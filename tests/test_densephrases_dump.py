"""The phrase dump, its FAISS index and the Python API (npm.densephrases.dump, .searcher; paper-map §D1.4-§D1.5):
the stored rows are the phrase encoder's vectors, the filter keeps at least a token per passage, an index is read
only with its own dump and phrase encoder, a dump too small for the index is a clear error, and a search answers with
the exact surface text of a phrase and its passage."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from npm.data.blocks import build_blocks, load_blocks, pad_blocks
from npm.densephrases.dump import DumpPassages, PhraseDump, build_index, dump_phrases, load_index
from npm.densephrases.model import DensePhrases
from npm.io import atomic_dir, write_jsonl
from tests.conftest import WORDPIECE, code_max_context, code_windows, save_tiny_bert
from tests.test_densephrases_search import DOCS


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("dump")
    write_jsonl(root / "docs.jsonl", [{"id": f"d{i}", "units": [t, t.upper()]} for i, t in enumerate(DOCS)])
    build_blocks(root / "docs.jsonl", root / "blocks.npz", WORDPIECE, max_seq_length=32)
    for name, seed in (("model", 0), ("other", 1)):
        with atomic_dir(root / name) as tmp:
            DensePhrases.from_encoder(save_tiny_bert(root / f"enc_{name}", seed=seed)).save(tmp)
    blocks = [str(root / "blocks.npz")]
    meta = dump_phrases(root / "model", blocks, root / "dump", progress=False, dump_passages=DumpPassages("blocks"))
    build_index(root / "dump", root / "flat.faiss")
    return {"root": root, "blocks": blocks, "meta": meta}


def test_the_dump_stores_the_phrase_encoders_vectors_of_every_non_special_token(world):
    from npm.densephrases.dump import DumpPassages

    arrays = load_blocks(world["blocks"][0])
    dump_phrases(world["root"] / "model", world["blocks"], world["root"] / "dump_blocks", progress=False,
                 dump_passages=DumpPassages("blocks"))
    dump = PhraseDump(world["root"] / "dump_blocks")
    special = (arrays["flags"] & 8) != 0
    assert dump.meta["rows"] == int((~special).sum()) == len(dump.token) and dump.meta["kept_share"] == 1.0
    assert dump.token[:].tolist() == np.flatnonzero(~special).tolist()
    model = DensePhrases.load(world["root"] / "model").eval()
    offsets = arrays["block_offsets"]
    ids, att = pad_blocks(arrays["input_ids"], offsets, np.array([2]), int(offsets[3] - offsets[2]))
    with torch.inference_mode():
        alone = model.phrase_vectors(torch.as_tensor(ids), torch.as_tensor(att))[0].numpy()
    rows = np.flatnonzero((dump.token[:] >= offsets[2]) & (dump.token[:] < offsets[3]))
    assert np.allclose(np.asarray(dump.vectors[rows], np.float32), alone[dump.token[rows] - offsets[2]], atol=2e-3)


def test_the_filter_keeps_a_subset_and_a_token_of_every_passage(world):
    model = DensePhrases.load(world["root"] / "model")
    model.filter_trained = True  # as `densephrases train` with lambda_filter > 0 marks it
    with atomic_dir(world["root"] / "model_filter") as tmp:
        model.save(tmp)
    meta = dump_phrases(world["root"] / "model_filter", world["blocks"], world["root"] / "filtered",
                        filter_threshold=1e9, progress=False)
    dump = PhraseDump(world["root"] / "filtered")
    n_passages = len(load_blocks(world["blocks"][0])["block_doc"])
    assert meta["rows"] == n_passages == len(set(dump.tokens.passage[:].tolist()))  # nothing passes: one per passage


def test_the_filter_refuses_a_filter_head_that_was_never_trained(world):
    """An untrained head's logits would drop tokens at random (train.lambda_filter = 0 leaves it at its init)."""
    with pytest.raises(ValueError, match=r"filter head was never trained.*lambda_filter"):
        dump_phrases(world["root"] / "model", world["blocks"], world["root"] / "random_filter", filter_threshold=1.0,
                     progress=False)
    assert not (world["root"] / "random_filter").exists()


def test_an_index_is_read_only_with_its_own_dump_and_phrase_encoder(world):
    root = world["root"]
    dump = PhraseDump(root / "dump")
    assert load_index(root / "flat.faiss", dump, root / "model").ntotal == dump.meta["rows"]
    with pytest.raises(ValueError, match="another phrase encoder"):
        load_index(root / "flat.faiss", dump, root / "other")
    dump_phrases(root / "other", world["blocks"], root / "dump_other", progress=False)
    with pytest.raises(ValueError, match="built from another phrase dump"):
        load_index(root / "flat.faiss", PhraseDump(root / "dump_other"))
    with pytest.raises(ValueError, match=r"phrase dump .*dump \(\d+ vectors\).*use factory 'Flat'"):
        build_index(root / "dump", root / "pq.faiss", factory="OPQ8,IVF4,PQ8")  # far too few vectors for PQ
    assert not (root / "pq.faiss").exists()
    ivf = build_index(root / "dump", root / "ivf.faiss", factory="IVF4,SQ4")
    assert ivf["nlist_requested"] == 4 > ivf["nlist"]  # cut to the lists 39 vectors each can train
    assert ivf["bytes_per_vector"] < 32 * 2  # 4-bit codes: smaller than the fp16 rows


def test_search_answers_with_exact_surface_phrases_and_their_passages(world):
    from npm.densephrases.searcher import PhraseSearcher
    from npm.model import load_tokenizer

    root = world["root"]
    searcher = PhraseSearcher(root / "model", root / "dump", root / "flat.faiss")
    tok = load_tokenizer(WORDPIECE)
    ids = load_blocks(world["blocks"][0])["input_ids"]
    results = searcher.search(["What is the capital of Greece?", "Where is the Parthenon?"], k=8, max_words=3,
                              top_n=5)
    assert len(results) == 2 and all(1 <= len(r) <= 5 for r in results)
    for phrases in results:
        assert [p["score"] for p in phrases] == sorted((p["score"] for p in phrases), reverse=True)
        assert len({p["text"] for p in phrases}) == len(phrases)  # de-duplicated by text
        for p in phrases:
            ti, tj = (int(searcher.dump.token[r]) for r in p["rows"])
            assert p["text"] in p["context"] and p["doc"].startswith("d")
            assert p["text"].lower().replace(" ", "") == tok.decode(ids[ti:tj + 1]).replace(" ", "")
            assert len(p["text"].split()) <= 3 or p["text"].count(" ") < 3
    with pytest.raises(ValueError, match="has no text"):
        searcher.search(["  "])


def test_query_side_fine_tuning_moves_only_the_query_encoders_and_learns(world, tmp_path):
    import hashlib

    from npm.densephrases.query_ft import marginal_nll, query_finetune
    from npm.densephrases.searcher import PhraseSearcher

    root = world["root"]
    digest = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in
              [root / "flat.faiss", root / "dump" / "shard0" / "vectors.f16", root / "dump" / "shard0" / "token.npy"]}
    train = [{"question": "What is the capital of Greece?", "answers": ["Athens"]},
             {"question": "Which city is the capital of France?", "answers": ["Paris"]},
             {"question": "What does photosynthesis convert?", "answers": ["sunlight"]}]
    summary = query_finetune(root / "model", root / "dump", root / "flat.faiss", train, tmp_path / "qft", dev=train,
                             k=40, max_words=3, epochs=6, batch_size=3, lr=3e-3, seed=0, progress=False)
    assert summary["dev_em_best"] > summary["dev_em_before"]  # it learns to find the answers in the index
    before, after = DensePhrases.load(root / "model"), DensePhrases.load(tmp_path / "qft")
    for part in ("phrase", "filter_head"):  # the phrase side: bit-identical
        b, a = getattr(before, part).state_dict(), getattr(after, part).state_dict()
        assert all(torch.equal(v, a[k]) for k, v in b.items())
    moved = after.query_start.state_dict()
    assert any(not torch.equal(v, moved[k]) for k, v in before.query_start.state_dict().items())
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in digest} == digest  # dump and index untouched
    PhraseSearcher(tmp_path / "qft", root / "dump", root / "flat.faiss")  # the same phrase side: the index serves it
    # the objective by hand: -log (e^1 + e^3) / (e^1 + e^2 + e^3)
    got = marginal_nll(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([True, False, True]))
    assert float(got) == pytest.approx(-np.log((np.e + np.e ** 3) / (np.e + np.e ** 2 + np.e ** 3)))


def test_the_code_s_query_side_fine_tuning_freezes_the_word_embeddings_and_decays_the_other_weights(world, tmp_path):
    """objective code = the original's train-query: its AdamW decays the weights by 0.01 but not biases and LayerNorm,
    and the query encoders' word embeddings stay frozen; paper: every query parameter, no decay. With its search
    (candidates and dev EM, at dev_k), scored from the index's codes, it trains end to end."""
    from npm.densephrases.evaluate import open_domain
    from npm.densephrases.query_ft import query_finetune, query_optimizer
    from npm.densephrases.searcher import PhraseSearcher

    root = world["root"]
    model = DensePhrases.load(root / "model")
    everything = [p for enc in (model.query_start, model.query_end) for p in enc.parameters()]
    optimizer, params = query_optimizer(model, 1e-3, "paper")
    assert len(params) == len(everything) and optimizer.param_groups[0]["weight_decay"] == 0.0
    optimizer, params = query_optimizer(model, 1e-3, "code")
    words = [enc.get_input_embeddings().weight for enc in (model.query_start, model.query_end)]
    assert not any(w.requires_grad for w in words) and not any(p is w for p in params for w in words)
    assert len(params) == len(everything) - 2
    decayed, flat = optimizer.param_groups
    assert (decayed["weight_decay"], flat["weight_decay"]) == (0.01, 0.0)
    assert all(p.ndim == 1 for p in flat["params"]) and all(p.ndim == 2 for p in decayed["params"])

    train = [{"question": "what is the capital of greece?", "answers": ["Athens"]}]  # truecased as it is read
    dev = [{"question": q, "answers": ["Athens", "Paris"]} for q in ("What is the capital of Greece?",
                                                                     "Which city is the capital of France?")]
    summary = query_finetune(root / "model", root / "dump", root / "flat.faiss", train, tmp_path / "qft", dev=dev,
                             k=40, max_words=3, epochs=2, batch_size=1, lr=3e-3, objective="code", search_form="code",
                             dev_k=4, truecase="package", seed=0, progress=False,
                             vectors="index")  # the code's whole train-query
    assert [e["skipped"] for e in summary["epochs"]] == [0, 0] and summary["truecased"] == {"train": 1, "dev": 0}
    # the best epoch is chosen by the EM the code's evaluation gives, at dev_k starts and ends
    searcher = PhraseSearcher(root / "model", root / "dump", root / "flat.faiss", vectors="index")
    assert summary["dev_k"] == 4
    assert summary["dev_em_before"] == open_domain(searcher, dev, 4, 3, search_form="code")["em"]
    searcher = PhraseSearcher(tmp_path / "qft", root / "dump", root / "flat.faiss", vectors="index")
    assert summary["dev_em_best"] == open_domain(searcher, dev, 4, 3, search_form="code")["em"]
    before, after = DensePhrases.load(root / "model"), DensePhrases.load(tmp_path / "qft")
    for part in ("query_start", "query_end"):
        b, a = getattr(before, part), getattr(after, part)
        assert torch.equal(b.get_input_embeddings().weight, a.get_input_embeddings().weight)
        assert any(not torch.equal(v, a.state_dict()[k]) for k, v in b.state_dict().items())


def _original_groups(searcher, blocks_path, q_start, q_end, k, max_words):
    """``MIPS.search_phrase`` of the original code (densephrases/index.py at 9583883, with ``return_idxs``) written out
    again on the dump: a document is a segment (one paragraph), its rows in dump order, ``f2o_start`` each row's
    whitespace word counted from the passage text (SQuAD's ``doc_tokens``); each retrieved start scans the next L rows
    of its document for the best end whose word is at most L words on, each retrieved end the L rows up to it for the
    best start, invalid ones masked at -1e9, ``np.argmax``; a group whose best is masked is dropped; the groups in
    the code's order (each rank's start group, then its end group). Returns per question the (start, end) rows, each
    group's whole-word answer text and its score (FAISS's score of the retrieved row plus its partner's)."""
    import re

    arrays = load_blocks(blocks_path, text=True)
    dump = searcher.dump
    token, segment, passage = dump.token[:], dump.tokens.segment[:], dump.tokens.passage[:]
    text = arrays["text"].tobytes().decode()

    def passage_text(r):
        b = int(passage[r])
        return text[int(arrays["text_offsets"][b]):int(arrays["text_offsets"][b + 1])]

    def word_spans(r):  # (start, end) characters of the passage's whitespace words
        return [m.span() for m in re.finditer(r"\S+", passage_text(r))]

    def f2o(r):  # the word of row r: the last word starting at or before its first character
        start = int(arrays["token_spans"][token[r], 0])
        return sum(a <= start for a, _ in word_spans(r)) - 1

    docs = {int(s): np.flatnonzero(segment == s) for s in np.unique(segment)}
    h = np.asarray(searcher.vectors[np.arange(len(token))], dtype=np.float32)
    out = []
    for qs, qe in zip(q_start, q_end, strict=True):
        d_s, top_s = searcher.index.search(qs[None], k)
        d_e, top_e = searcher.index.search(qe[None], k)
        groups = []
        ranks = zip(top_s[0], d_s[0], top_e[0], d_e[0], strict=True)  # each rank's start group, then its end group
        for r, own, q, forward in [g for s_, d, e, f in ranks for g in ((s_, d, qe, True), (e, f, qs, False))]:
            rows = docs[int(segment[r])]
            local = int(np.flatnonzero(rows == r)[0])
            words = [f2o(x) for x in rows]
            scores, partners = [], []
            for i in (range(max_words) if forward else range(max_words - 1, -1, -1)):
                other = local + i if forward else local - i
                a, b = (local, other) if forward else (other, local)
                ok = 0 <= other < len(rows) and 0 <= words[b] - words[a] <= max_words
                scores.append(float(h[rows[other]] @ q) if ok else -1e9)
                partners.append(int(rows[other]) if ok else -1)
            best = int(np.argmax(scores))
            if scores[best] > -1e5:
                i, j = (int(r), partners[best]) if forward else (partners[best], int(r))
                spans = word_spans(i)
                a, e = spans[f2o(i)][0], spans[f2o(j)][1]
                groups.append(((i, j), passage_text(i)[a:e], float(own) + scores[best]))
        out.append(groups)
    return out


def test_the_code_s_candidates_are_the_original_search_phrase_groups(world):
    """``search_form: code`` (``PhraseSearcher.code_candidates``, ``npm.densephrases.search.code_partners``, whole-word
    texts) against an independent transcription of the original's ``MIPS.search_phrase``: the same 2 k groups, in
    the code's order, with the same answer texts, on a dump whose retrieved rows include pieces inside a
    word and punctuation marks (which the phrase search of eq. 10 skips)."""
    from npm.densephrases.searcher import PhraseSearcher

    root = world["root"]
    searcher = PhraseSearcher(root / "model", root / "dump", root / "flat.faiss")
    rng = np.random.default_rng(0)
    d = searcher.dump.meta["hidden_size"]
    q_start, q_end = (rng.standard_normal((4, d)).astype(np.float32) for _ in range(2))
    k, max_words = 12, 2
    got = searcher.code_candidates(q_start, q_end, k, max_words)
    want = _original_groups(searcher, world["blocks"][0], q_start, q_end, k, max_words)
    retrieved = np.concatenate([pairs.reshape(-1) for pairs in got])
    tokens = searcher.dump.tokens
    assert not tokens.word_start[retrieved].all()  # the whole-word mapping is exercised
    for pairs, groups in zip(got, want, strict=True):
        assert pairs.tolist() == [list(ij) for ij, _, _ in groups]
        assert [searcher.phrase(i, j, 0.0, whole_words=True)["text"] for i, j in pairs.tolist()] == \
            [t for _, t, _ in groups]


def test_the_code_s_search_answers_with_the_original_search_s_best_group(world):
    """``search_form: code`` (``PhraseSearcher.search``, ``code_ranked``) against the transcription of the original's
    ``MIPS.search`` as its evaluation reads it: the groups sorted by score (Python's stable sort), the top one's
    whole-word text is the answer; a question whose groups all fail has none. The eq. 10 search answers differently
    on some question, or the switch would not be needed."""
    from npm.densephrases.searcher import PhraseSearcher

    root = world["root"]
    searcher = PhraseSearcher(root / "model", root / "dump", root / "flat.faiss")
    questions = ["What is the capital of Greece?", "Which city is the capital of France?",
                 "What does photosynthesis convert?", "Who wrote the play?", "Where is the Parthenon?"]
    k, max_words = 6, 2
    q_start, q_end = searcher.encode(questions)
    want = []
    for groups in _original_groups(searcher, world["blocks"][0], q_start, q_end, k, max_words):
        ranked = sorted(groups, key=lambda g: -g[2])
        want.append((ranked[0][1], ranked[0][2]) if ranked else None)
    got = searcher.search(questions, k, max_words, top_n=1, search_form="code")
    assert [(f[0]["text"], pytest.approx(f[0]["score"], abs=1e-4)) if f else None for f in got] == want
    paper = searcher.search(questions, k, max_words, top_n=1)
    assert [f[0]["text"] if f else None for f in paper] != [w[0] if w else None for w in want]
    with pytest.raises(ValueError, match="refine_factor"):
        searcher.search(questions, k, max_words, refine_factor=2, search_form="code")


def test_the_code_s_query_loss_is_the_original_train_query_over_its_padded_groups(world):
    """objective code over candidates code = the original's ``train_query`` (densephrases/encoder.py): logits over
    the 2 k groups padded with zero vectors, -log of the softmax mass on the groups whose answer matches, clamped at
    1e-7, for the phrase, start and end logits, summed; a question with no match gives None."""
    from npm.densephrases.query_ft import batch_losses
    from npm.densephrases.searcher import PhraseSearcher
    from npm.tasks.metrics import exact_match

    root = world["root"]
    searcher = PhraseSearcher(root / "model", root / "dump", root / "flat.faiss")
    encoders = (searcher.model.query_start.eval(), searcher.model.query_end.eval())
    k, max_words = 12, 2
    qs, qe = searcher.encode(["What is the capital of Greece?"])
    groups = _original_groups(searcher, world["blocks"][0], qs, qe, k, max_words)[0]
    answer = groups[0][1]
    questions = [{"question": "What is the capital of Greece?", "answers": [answer]},
                 {"question": "What is the capital of Greece?", "answers": ["no such phrase here"]}]
    with torch.no_grad():
        got = batch_losses(searcher, questions, k, max_words, "code", "code", encoders)
    assert got[1] is None
    h = np.asarray(searcher.vectors[np.arange(len(searcher.dump.token))], dtype=np.float64)
    start = np.zeros(2 * k)
    end = np.zeros(2 * k)
    target = np.zeros(2 * k, dtype=bool)
    for g, ((i, j), text, _) in enumerate(groups):
        start[g], end[g], target[g] = h[i] @ qs[0], h[j] @ qe[0], exact_match(text, [answer])

    def nll(logits):
        p = np.exp(logits - logits.max())
        return -np.log(np.clip((p / p.sum())[target].sum(), 1e-7, 1))

    assert float(got[0]) == pytest.approx(nll(start + end) + nll(start) + nll(end), rel=1e-4)


def test_the_registry_system_answers_each_input_with_the_top_phrase_of_its_question(world):
    """System `densephrases` of npm.evaluation.systems: an NPM-style input is asked as its question and answered
    by the searcher's top phrase, the same one `PhraseSearcher.search` returns for that question."""
    from types import SimpleNamespace

    from npm.densephrases.searcher import PhraseSearcher
    from npm.evaluation.systems import Inputs, get
    from npm.settings import DensePhrasesSettings, Settings

    root = world["root"]
    system = get("densephrases")
    assert system.needs(closed=False) == ("phrase_dump", "phrase_index") and not system.applies(True, "agn")
    settings = Settings(phrase_k=8, phrase_max_words=3)
    scorer = system.load(system, Inputs(checkpoint=str(root / "model"), phrase_dump=[str(root / "dump")],
                                        phrase_index=[str(root / "flat.faiss")], corpus="toy"), settings)
    examples = [{"id": "a", "input": "What is the capital of Greece? The answer is: <mask>.", "answers": ["Athens"]},
                {"id": "b", "input": "The Parthenon stands in <mask> .", "answers": ["Athens"]}]
    out = scorer.open_set(SimpleNamespace(name="nq"), examples[:1], None)
    cloze = scorer.open_set(SimpleNamespace(name="lama_trex"), examples[1:], None)
    direct = PhraseSearcher(root / "model", root / "dump", root / "flat.faiss",
                            precision=DensePhrasesSettings.precision).search(
        ["What is the capital of Greece?", "The Parthenon stands in"], k=8, max_words=3, top_n=1)
    assert out["answers"] + cloze["answers"] == [d[0]["text"] for d in direct]
    assert [r["question"] for r in out["records"] + cloze["records"]] == ["What is the capital of Greece?",
                                                                          "The Parthenon stands in"]
    assert scorer.info["corpus_tokens"] == world["meta"]["tokens"] and scorer.info["phrase_k"] == 8
    with pytest.raises(ValueError, match="one --phrase-dump and one --phrase-index"):
        system.load(system, Inputs(checkpoint=str(root / "model"), phrase_dump=[str(root / "dump")] * 2,
                                   phrase_index=[str(root / "flat.faiss")] * 2), settings)


def test_the_registry_row_searches_as_the_densephrases_table_s_evaluations(world):
    """The knowledge tables' DensePhrases row takes config densephrases's search keys (`npm-repro evaluate
    --search-form --vectors --truecase --refine-factor --precision`, Inputs.phrase_search): its answers are those
    of `densephrases evaluate`'s search with the same keys, over the truecased questions, and its metrics record
    them."""
    from types import SimpleNamespace

    from npm.cli import build_parser
    from npm.densephrases.searcher import PhraseSearcher
    from npm.evaluation.systems import Inputs, get
    from npm.settings import Settings

    root = world["root"]
    keys = {"search_form": "code", "vectors": "index", "truecase": "package", "refine_factor": 1, "precision": "fp32"}
    system, settings = get("densephrases"), Settings(phrase_k=8, phrase_max_words=3)
    scorer = system.load(system, Inputs(checkpoint=str(root / "model"), phrase_dump=[str(root / "dump")],
                                        phrase_index=[str(root / "flat.faiss")], corpus="toy", phrase_search=keys),
                         settings)
    examples = [{"id": "a", "input": "what is the capital of greece?", "answers": ["Athens"]},
                {"id": "b", "input": "Where is the Parthenon?", "answers": ["Athens"]}]
    out = scorer.open_set(SimpleNamespace(name="nq"), examples, None)
    asked = [r["question"] for r in out["records"]]
    assert asked == ["What is the capital of Greece?", "Where is the Parthenon?"] and out["metrics"]["truecased"] == 1
    direct = PhraseSearcher(root / "model", root / "dump", root / "flat.faiss", precision="fp32",
                            vectors="index").search(asked, k=8, max_words=3, top_n=1, search_form="code")
    assert out["answers"] == [d[0]["text"] for d in direct]
    assert {k: scorer.info[k] for k in keys} == keys
    args = build_parser().parse_args(["evaluate", "--task", "nq", "--system", "densephrases", "--checkpoint", "m",
                                      "--search-form", "code", "--truecase", "package"])
    assert (args.search_form, args.truecase, args.vectors, args.precision) == ("code", "package", "dump", "bf16")


def test_the_table_has_the_papers_parts_from_evaluate_results(world, tmp_path):
    """`densephrases evaluate` results -> results/tables/densephrases.csv: reading comprehension and the negatives
    rows ({p}, D_small) from each negatives model's rc.json, before / after query-side fine-tuning, and per index
    its size, build time, EM (re-ranked and index-only) and queries/s; a note names the code's search and the
    questions truecased."""
    import csv

    from npm.cli import main
    from npm.densephrases.rc import write_squad
    from npm.report.densephrases import densephrases_table

    root = world["root"]
    write_jsonl(tmp_path / "nq.jsonl", [{"question": "What is the capital of Greece?", "answers": ["Athens"]},
                                         {"question": "where is the parthenon?", "answers": ["Athens"]}])
    rc = [{"id": f"r{n}", "title": f"t{n}", "context": text, "question": f"Which city is named in {n}?",
           "answers": ["Athens"], "answer_start": [text.index("Athens")]} for n, text in enumerate(DOCS[:2])]
    write_squad(tmp_path / "rc.json", rc, "test")
    write_squad(tmp_path / "pool.json", [{**rc[0], "id": "p", "context": DOCS[2] + " Athens.",
                                          "answer_start": [len(DOCS[2]) + 1]}], "test")
    build_index(root / "dump", tmp_path / "ivf.faiss", "IVF2,Flat", nprobe=2)
    runs = {("pre_batch", "Flat"): root / "flat.faiss", ("pre_batch", "IVF2_Flat"): tmp_path / "ivf.faiss",
            ("pre_batch_qft", "Flat"): root / "flat.faiss"}
    paths = []
    for (variant, name), index in runs.items():
        paths.append(tmp_path / "eval" / variant / f"{name}.json")
        assert main(["densephrases", "evaluate", "--checkpoint", str(root / "model"), "--dump", str(root / "dump"),
                     "--index", str(index), "--questions", str(tmp_path / "nq.jsonl"), "--k", "8", "--max-words",
                     "3", "--refine-factor", "2" if name == "IVF2_Flat" else "1", "--out", str(paths[-1]),
                     *(["--search-form", "code", "--truecase", "package"] if variant.endswith("_qft") else [])]) == 0
    for variant in ("pre_batch", "in_batch"):
        paths.append(tmp_path / "eval" / variant / "rc.json")
        assert main(["densephrases", "evaluate", "--checkpoint", str(root / "model"), "--rc", str(tmp_path / "rc.json"),
                     "--d-small-pool", str(tmp_path / "pool.json"), "--max-passage-tokens", "32",
                     "--out", str(paths[-1])]) == 0
    small = json.loads(paths[-1].read_text())["rc_d_small"]
    assert small["passages"] == 3 and small["n"] == 2 and 0 <= small["own_passage"] <= 100
    table = densephrases_table(paths)
    parts = {(r["Part"], r["Row"], r["Column"]) for r in table.rows}
    assert {("reading comprehension", "DensePhrases", "EM"), ("reading comprehension", "random span", "F1"),
            ("negatives", "in-batch", "EM {p}"), ("negatives", "+ pre-batch", "EM D_small"),
            ("query-side fine-tuning", "before", "EM@1 nq"), ("query-side fine-tuning", "after", "EM@1 nq"),
            ("index", "Flat", "bytes per vector"), ("index", "IVF2,Flat", "queries/s (CPU)"),
            ("index", "IVF2,Flat", "EM@1 nq (not re-ranked)")} <= parts
    assert ("index", "Flat", "EM@1 nq (not re-ranked)") not in parts  # no re-ranking there
    (after,) = [r for r in table.rows if r["Row"] == "after"]  # the note says how it searched and what it truecased
    assert "as the original code searches" in after["Note"] and "lowercased questions truecased: 1" in after["Note"]
    assert not any(r["Part"] == "index" and r["Row"] == "in-batch" for r in table.rows)
    neg = {(r["Row"], r["Column"]): r for r in table.rows if r["Part"] == "negatives"}
    assert neg[("+ pre-batch", "EM D_small")]["Paper"] == 60.4 and 0 <= neg[("in-batch", "EM {p}")]["Ours"] <= 100
    alone = densephrases_table([p for p in paths if "in_batch" not in str(p)])  # the demo: one trained variant
    assert {r["Column"] for r in alone.rows if r["Part"] == "negatives"} == {"EM {p}", "EM D_small"}
    assert main(["report", "densephrases", "--metrics", *map(str, paths), "--out", str(tmp_path / "t.csv")]) == 0
    columns = next(n for n in table.notes if n.startswith("Columns:"))
    assert all(f"**{c}**" in columns for c in table.columns) and columns in (tmp_path / "t.md").read_text()
    assert any("seeded sample of evaluation.max_examples" in n for n in table.notes)  # why Table 8's EM differs
    assert len(list(csv.DictReader(open(tmp_path / "t.csv")))) == len(table.rows)
    with pytest.raises(FileNotFoundError, match="densephrases evaluate"):
        densephrases_table([tmp_path / "eval" / "none" / "Flat.json"])


@pytest.fixture(scope="module")
def evaluations(world, tmp_path_factory):
    """Real `densephrases evaluate` results: open-domain over the Flat index and reading comprehension."""
    from npm.cli import main
    from npm.densephrases.rc import write_squad

    root, out = world["root"], tmp_path_factory.mktemp("evaluations")
    write_jsonl(out / "nq.jsonl", [{"question": "What is the capital of Greece?", "answers": ["Athens"]}])
    rc = [{"id": f"r{n}", "title": f"t{n}", "context": text, "question": f"Which city is named in {n}?",
           "answers": ["Athens"], "answer_start": [text.index("Athens")]} for n, text in enumerate(DOCS[:2])]
    write_squad(out / "rc.json", rc, "test")
    assert main(["densephrases", "evaluate", "--checkpoint", str(root / "model"), "--dump", str(root / "dump"),
                 "--index", str(root / "flat.faiss"), "--questions", str(out / "nq.jsonl"), "--k", "8",
                 "--max-words", "3", "--out", str(out / "Flat.json")]) == 0
    assert main(["densephrases", "evaluate", "--checkpoint", str(root / "model"), "--rc", str(out / "rc.json"),
                 "--max-passage-tokens", "32", "--out", str(out / "rc.json")]) == 0
    return {name: json.loads((out / f"{name}.json").read_text()) for name in ("Flat", "rc")}


def test_evaluate_truecases_the_lowercased_questions_and_records_what_it_asked(world, tmp_path):
    """`evaluate --truecase` (the code's --truecase, npm.densephrases.truecase): an all-lowercase question is asked
    truecased, a cased one as given; the results record each question asked, how many were truecased, and the search
    form."""
    from npm.cli import main

    root = world["root"]
    write_jsonl(tmp_path / "nq.jsonl", [{"question": "what is the capital of greece ?", "answers": ["Athens"]},
                                        {"question": "Which city is the capital of France?", "answers": ["Paris"]}])
    assert main(["densephrases", "evaluate", "--checkpoint", str(root / "model"), "--dump", str(root / "dump"),
                 "--index", str(root / "flat.faiss"), "--questions", str(tmp_path / "nq.jsonl"), "--k", "8",
                 "--max-words", "3", "--truecase", "package", "--search-form", "code",
                 "--out", str(tmp_path / "Flat.json")]) == 0
    result = json.loads((tmp_path / "Flat.json").read_text())["open"]["nq"]
    assert [p["question"] for p in result["predictions"]] == ["What is the capital of Greece?",
                                                              "Which city is the capital of France?"]
    assert (result["truecased"], result["truecase"], result["search_form"]) == (1, "package", "code")


@pytest.mark.parametrize("name, part, metric, step", [
    ("Flat", "open.nq", "queries_per_s", "rule densephrases_evaluate"),
    ("Flat", "open.nq", "em", "rule densephrases_evaluate"),
    ("Flat", "index", "build_seconds", "rule densephrases_index"),
    ("rc", "rc", "f1", "rule densephrases_evaluate_rc"),
    ("rc", "rc_d_small", "passages", "rule densephrases_evaluate_rc"),
])
def test_the_table_refuses_a_results_file_without_a_metric_it_shows(evaluations, tmp_path, capsys, name, part, metric,
                                                                    step):
    """A metric the table shows that is missing from a results file (one written by an older version, or edited) is
    one error naming the file, the metric and the step that writes it, not an empty cell."""
    from npm.cli import main
    from npm.report.densephrases import densephrases_table

    results = json.loads(json.dumps(evaluations[name]))
    node = results
    for key in part.split("."):
        node = node[key]
    del node[metric]
    path = tmp_path / "eval" / "pre_batch" / f"{name}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(results))
    with pytest.raises(ValueError) as error:
        densephrases_table([path])
    assert str(path) in str(error.value) and f"{part}.{metric}" in str(error.value) and step in str(error.value)
    assert main(["report", "densephrases", "--metrics", str(path), "--out", str(tmp_path / "t.csv")]) == 1
    assert f"{part}.{metric}" in capsys.readouterr().err and not (tmp_path / "t.csv").exists()


def test_a_dump_made_shard_by_shard_equals_the_one_shard_dump_of_the_same_blocks(world):
    """A corpus in two blocks files, dumped one job per shard (`dump --shard`, then `combine`), reads back as the
    dump of the same blocks in one file: the same vectors, the same phrase table (global token, passage and segment
    ids), the same counts; the index reads the shards' files."""
    from npm.cli import main

    root = world["root"]
    for name, docs in (("half0", DOCS[:2]), ("half1", DOCS[2:])):
        write_jsonl(root / f"{name}.jsonl", [{"id": f"{name}{i}", "units": [t, t.upper()]} for i, t in enumerate(docs)])
        build_blocks(root / f"{name}.jsonl", root / f"{name}.npz", WORDPIECE, max_seq_length=32)
    halves = [load_blocks(root / f"half{k}.npz") for k in (0, 1)]
    whole = load_blocks(world["blocks"][0])
    assert np.concatenate([h["input_ids"] for h in halves]).tolist() == whole["input_ids"].tolist()  # same blocks
    for k in (0, 1):
        assert main(["densephrases", "dump", "--checkpoint", str(root / "model"), "--blocks",
                     str(root / f"half{k}.npz"), "--out", str(root / "sharded"), "--shard", str(k),
                     "--precision", "fp32"]) == 0
    assert not (root / "sharded" / "meta.json").exists()  # readers wait for the combine step
    assert main(["densephrases", "combine", "--dump", str(root / "sharded"), "--shards", "2"]) == 0
    one, two = PhraseDump(root / "dump"), PhraseDump(root / "sharded")
    assert [s["rows"] for s in two.meta["shards"]] == [len(np.load(root / "sharded" / f"shard{k}" / "token.npy"))
                                                         for k in (0, 1)]
    assert len(one.meta["shards"]) == 1 and len(two.meta["shards"]) == 2
    for key in ("rows", "tokens", "hidden_size", "bytes", "phrase_side", "kept_share"):
        assert two.meta[key] == one.meta[key], key
    assert np.allclose(two.vectors[:].astype(np.float32), one.vectors[:].astype(np.float32), atol=2e-3)
    assert two.token[:].tolist() == one.token[:].tolist()
    for name, values in one.tokens.arrays().items():
        assert two.tokens.arrays()[name][:].tolist() == values[:].tolist(), name
    rows = np.array([[len(two.token) - 1, 0], [3, len(two.token) // 2]])  # any shape, across the shard boundary
    assert two.token[rows].tolist() == one.token[:][rows].tolist()
    record = build_index(root / "sharded", root / "sharded.faiss")
    assert record["shards"] == [[str(root / "sharded" / f"shard{k}" / "vectors.f16"), s["rows"]]
                                for k, s in enumerate(two.meta["shards"])]
    assert load_index(root / "sharded.faiss", two, root / "model").ntotal == one.meta["rows"]


@pytest.mark.parametrize("max_tokens,stride", [(8, 4), (8, 6), (12, 3), (130, 100), (512, 500)])
def test_units_windows_are_the_code_s_windows_and_a_token_belongs_to_its_max_context_window(max_tokens, stride):
    from npm.densephrases.dump import unit_windows

    rng = np.random.default_rng(max_tokens + stride)
    lengths = rng.integers(1, 3 * max_tokens, size=12).tolist() + [max_tokens - 2, max_tokens - 1, 1]
    flags = np.concatenate([np.r_[8, np.zeros(n, np.uint8), 8] for n in lengths]).astype(np.uint8)
    positions, offsets, owner, unit = unit_windows(flags, max_tokens, stride)
    expected_positions, expected_owner, first = [], [], 1
    for n in lengths:
        spans = code_windows(n, max_tokens, stride)
        for k, (start, length) in enumerate(spans):
            expected_positions += [first + start + t for t in range(length)]
            expected_owner += [code_max_context(spans, start + t) == k for t in range(length)]
        first += n + 2
    assert positions.tolist() == expected_positions and owner.tolist() == expected_owner
    assert len(offsets) - 1 == sum(len(code_windows(n, max_tokens, stride)) for n in lengths)
    assert sorted(positions[owner].tolist()) == np.flatnonzero(flags == 0).tolist()  # each token owned once
    starts = np.cumsum([1] + [n + 2 for n in lengths[:-1]])
    assert unit.tolist() == [[a, a + n - 1] for a, n in zip(starts.tolist(), lengths, strict=True)
                             for _ in code_windows(n, max_tokens, stride)]


def test_a_units_dump_encodes_each_text_unit_alone_in_its_windows(world, tmp_path):
    """`dump --dump-passages units`: the same rows and phrase table as the blocks dump, each token's
    vector the phrase encoder's over ``[CLS] window [SEP]`` of its own unit (its max-context window), recorded in
    the meta; the shards of a dump agree on it, and an index of another dump is refused."""
    from npm.densephrases.dump import DumpPassages, combine_shards, dump_shard, shard_dir, unit_windows

    root = world["root"]
    blocks = load_blocks(world["blocks"][0])
    model = DensePhrases.load(root / "model").eval()
    dump_phrases(root / "model", world["blocks"], tmp_path / "blocks", progress=False,
                 dump_passages=DumpPassages("blocks"))
    plain = PhraseDump(tmp_path / "blocks")
    for max_tokens, stride in ((128, 100), (8, 4)):  # whole units; windows of 6 tokens every 4
        passages = DumpPassages("units", max_tokens, stride)
        out = tmp_path / f"units{max_tokens}"
        meta = dump_phrases(root / "model", world["blocks"], out, progress=False, dump_passages=passages)
        assert meta["dump_passages"] == {"form": "units", "max_tokens": max_tokens, "stride": stride}
        units = PhraseDump(out)
        assert units.token[:].tolist() == plain.token[:].tolist() and meta["rows"] == plain.meta["rows"]
        for name, values in plain.tokens.arrays().items():
            assert units.tokens.arrays()[name][:].tolist() == values[:].tolist(), name
        positions, offsets, owner, unit = unit_windows(blocks["flags"], max_tokens, stride)
        expected = np.zeros((len(blocks["input_ids"]), model.hidden_size), np.float32)
        for w in range(len(offsets) - 1):
            rows = positions[offsets[w]:offsets[w + 1]]
            ids = blocks["input_ids"][np.r_[unit[w, 0] - 1, rows, unit[w, 1] + 1]]
            with torch.inference_mode():
                h = model.phrase_vectors(torch.as_tensor(ids[None]), torch.ones(1, len(ids), dtype=torch.long))
            own = owner[offsets[w]:offsets[w + 1]]
            expected[rows[own]] = h[0, 1:-1].numpy()[own]
        assert np.allclose(np.asarray(units.vectors[:], np.float32), expected[units.token[:]], atol=2e-3)
    assert np.diff(offsets).max() == 6 and len(offsets) - 1 > len(np.unique(unit, axis=0))  # units of 2+ windows
    assert not np.allclose(np.asarray(units.vectors[:], np.float32), np.asarray(plain.vectors[:], np.float32),
                           atol=1e-2)  # a block of two units is read as one passage; each unit alone differs
    with pytest.raises(ValueError, match="built from another phrase dump"):
        load_index(root / "flat.faiss", units)
    dump_shard(root / "model", world["blocks"][0], shard_dir(tmp_path / "mixed", 0), progress=False,
               dump_passages=DumpPassages("units", 8, 4))
    dump_shard(root / "model", world["blocks"][0], shard_dir(tmp_path / "mixed", 1), progress=False,
               dump_passages=DumpPassages("blocks"))
    with pytest.raises(ValueError, match="shard1: its dump_passages .* differs from shard0's"):
        combine_shards(tmp_path / "mixed", 2)
    with pytest.raises(ValueError, match="dump_max_tokens 512 exceeds the phrase encoder's 128 positions"):
        dump_shard(root / "model", world["blocks"][0], tmp_path / "long", progress=False,
                   dump_passages=DumpPassages("units", 512, 500))
    with pytest.raises(ValueError, match="stride must be 1 to 6, got 7"):
        DumpPassages("units", 8, 7)


def test_a_dump_without_all_its_shards_or_with_a_foreign_shard_is_refused(world, tmp_path):
    from npm.densephrases.dump import combine_shards, dump_shard, shard_dir

    root = world["root"]
    dump_shard(root / "model", world["blocks"][0], shard_dir(tmp_path, 0), progress=False)
    with pytest.raises(FileNotFoundError, match=r"shard1: shard 1 of the phrase dump .* --shard 1"):
        combine_shards(tmp_path, 2)
    dump_shard(root / "other", world["blocks"][0], shard_dir(tmp_path, 1), progress=False)
    with pytest.raises(ValueError, match="shard1: its phrase_side .* differs from shard0's"):
        combine_shards(tmp_path, 2)
    assert not (tmp_path / "meta.json").exists()


def test_the_index_build_refuses_an_index_that_does_not_fit_the_jobs_memory_before_training(world, capsys):
    """`densephrases index --mem-mb`: NPM's check (npm.datastore.faiss_index.check_memory) before any training, the
    refusal naming the index's size, this rule and config key, and a smaller choice; nothing is written."""
    import re

    from npm.cli import main

    root = world["root"]  # ~5,000 vectors of dimension 32: index, training sample and a chunk need over 1 MB
    write_jsonl(root / "many.jsonl", [{"id": f"m{n}", "units": [t, t.upper()]} for n in range(60) for t in DOCS])
    build_blocks(root / "many.jsonl", root / "many.npz", WORDPIECE, max_seq_length=32)
    dump_phrases(root / "model", [str(root / "many.npz")], root / "many", progress=False)
    assert main(["densephrases", "index", "--dump", str(root / "many"), "--out", str(root / "small.faiss"),
                 "--factory", "IVF4,SQ4", "--mem-mb", "1"]) == 1
    assert re.search(r"error: phrase dump .*\(\d+ vectors\): a 'IVF\d,SQ4' index over [\d,]+ vectors .* needs about "
                     r".* densephrases_index:mem_mb=.*config densephrases.index \(e.g. 'IVF4096",
                     capsys.readouterr().err)
    assert not (root / "small.faiss").exists() and not (root / "small.faiss.json").exists()
    record = build_index(root / "many", root / "fits.faiss", factory="IVF4,SQ4", mem_mb=1000)
    assert 0 < record["index_bytes_estimate"] <= record["memory_needed_bytes"] < 0.9 * 1000 * 1_000_000


def test_a_dry_run_of_the_paper_config_plans_one_dump_job_per_blocks_shard(tmp_path):
    """config/paper.yaml's `densephrases` section: rule densephrases_dump once per blocks shard of the corpus, one
    densephrases_combine over them, the index (with its memory check) and the SQuAD / NQ files placed by hand."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parent.parent
    paper = yaml.safe_load((root / "config" / "paper.yaml").read_text())
    shards = paper["sources"][paper["densephrases"]["corpus"]]["shards"]
    out = subprocess.run([str(Path(sys.executable).parent / "snakemake"), "results/tables/densephrases.csv", "-n",
                          "-p", "--cores", "1", "--directory", str(tmp_path), "-s", str(root / "Snakefile"),
                          "--configfile", str(root / "config" / "paper.yaml")], cwd=root, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    dumps = sorted(re.findall(r"--out data/densephrases/dump/pre_batch/enwiki --shard (\d+) .*--dump-passages units "
                              r"--dump-max-tokens 512 --dump-stride 500", out.stdout), key=int)
    assert dumps == [str(k) for k in range(shards)] and shards > 1
    assert out.stdout.count("densephrases combine --dump data/densephrases/dump/pre_batch/enwiki --shards "
                            f"{shards} ") == 1
    assert re.search(r"densephrases index --dump data/densephrases/dump/pre_batch/enwiki .*--factory IVF1048576,SQ4 .*"
                     r"--mem-mb \d+", out.stdout)
    assert "data/raw/squad/train-v1.1.json does not exist; place it there by hand" in out.stdout


def test_a_compressed_index_of_the_phrase_edges_is_smaller_by_its_recorded_ratio_and_searched_alone(world, tmp_path):
    """The compressed route (config densephrases.compressed): `densephrases trim` keeps the tokens that can begin or
    end a phrase, the index of that dump is built from a factory string, and `evaluate --vectors index` retrieves and
    scores the phrases from the index's codes alone: the trimmed dump's vectors deleted, it still answers; over a
    lossless (Flat) index and every row retrieved it finds the phrases and scores of the untrimmed dump; the table's
    row records the index's size against the untrimmed fp16 dump and its EM as index only."""
    from npm.cli import main
    from npm.densephrases.rc import write_squad
    from npm.densephrases.search import search
    from npm.densephrases.searcher import PhraseSearcher
    from npm.report.densephrases import densephrases_table

    root = world["root"]
    write_jsonl(tmp_path / "many.jsonl", [{"id": f"m{n}", "units": [t, t.upper()]} for n in range(40) for t in DOCS])
    build_blocks(tmp_path / "many.jsonl", tmp_path / "many.npz", WORDPIECE, max_seq_length=32)
    full = dump_phrases(root / "model", [str(tmp_path / "many.npz")], tmp_path / "dump", progress=False)
    assert main(["densephrases", "trim", "--dump", str(tmp_path / "dump"), "--out", str(tmp_path / "trimmed")]) == 0
    whole, trimmed = PhraseDump(tmp_path / "dump"), PhraseDump(tmp_path / "trimmed")
    edges = np.flatnonzero(whole.tokens.word_start[:] | whole.tokens.word_end[:])
    assert 0 < trimmed.meta["rows"] == len(edges) < full["rows"] == trimmed.meta["tokens"]
    assert trimmed.meta["token_filter"] == "edges" and trimmed.token[:].tolist() == whole.token[edges].tolist()
    assert np.array_equal(trimmed.vectors[:], whole.vectors[edges])
    for name, values in trimmed.tokens.arrays().items():
        assert values[:].tolist() == whole.tokens.arrays()[name][edges].tolist(), name

    # lossless: Flat over the trimmed dump, every row retrieved, scored from the index = the untrimmed dump's search
    build_index(tmp_path / "dump", tmp_path / "flat.faiss")
    build_index(tmp_path / "trimmed", tmp_path / "trimmed_flat.faiss")
    untrimmed = PhraseSearcher(root / "model", tmp_path / "dump", tmp_path / "flat.faiss")
    alone = PhraseSearcher(root / "model", tmp_path / "trimmed", tmp_path / "trimmed_flat.faiss", vectors="index")
    qs, qe = untrimmed.encode(["What is the capital of Greece?", "Where is the Parthenon?"])
    for a, b in zip(search(untrimmed.index, whole.vectors, whole.tokens, qs, qe, full["rows"], 3, top_n=20),
                    search(alone.index, alone.vectors, trimmed.tokens, qs, qe, full["rows"], 3, top_n=20),
                    strict=True):
        assert whole.token[a[0]].tolist() == trimmed.token[b[0]].tolist()
        assert np.allclose(a[1], b[1], atol=1e-4)

    # compressed: PCA + 4-bit codes, read back and searched with the trimmed dump's vectors gone
    record = build_index(tmp_path / "trimmed", tmp_path / "small.faiss", "PCA8,SQ4")
    assert record["index_bytes"] == (tmp_path / "small.faiss").stat().st_size
    ratio = full["bytes"] / record["index_bytes"]
    assert ratio > 8  # 4 bytes per kept token and a 1 KB transform, against 64 bytes per token
    for shard in trimmed.meta["shards"]:
        (tmp_path / "trimmed" / shard["path"] / "vectors.f16").unlink()
    with pytest.raises(FileNotFoundError):
        PhraseSearcher(root / "model", tmp_path / "trimmed", tmp_path / "small.faiss")  # the fp16 scores need them
    found = PhraseSearcher(root / "model", tmp_path / "trimmed", tmp_path / "small.faiss", vectors="index").search(
        ["What is the capital of Greece?"], k=8, max_words=3, top_n=3)
    assert 1 <= len(found[0]) <= 3 and all(p["text"] in p["context"] for p in found[0])

    write_jsonl(tmp_path / "nq.jsonl", [{"question": "What is the capital of Greece?", "answers": ["Athens"]}])
    rc = [{"id": f"r{n}", "title": f"t{n}", "context": text, "question": f"Which city is named in {n}?",
           "answers": ["Athens"], "answer_start": [text.index("Athens")]} for n, text in enumerate(DOCS[:2])]
    write_squad(tmp_path / "rc.json", rc, "test")
    out = tmp_path / "eval" / "pre_batch" / "compressed.json"
    assert main(["densephrases", "evaluate", "--checkpoint", str(root / "model"), "--dump", str(tmp_path / "trimmed"),
                 "--index", str(tmp_path / "small.faiss"), "--vectors", "index", "--questions",
                 str(tmp_path / "nq.jsonl"), "--rc", str(tmp_path / "rc.json"), "--d-small-index", "SQ8", "--k", "8",
                 "--max-words", "3", "--max-passage-tokens", "32", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["open"]["nq"]["vectors"] == "index" and results["dump"]["token_filter"] == "edges"
    small = results["rc_d_small_index"]
    assert small["passages"] == 2 and small["n"] == 2 and 0 < small["kept"] < small["tokens"]
    assert 0 <= small["em"] <= 100 and 0 <= small["flat_em"] <= 100 and small["ratio"] > 1
    rows = {(r["Row"], r["Column"]): r for r in densephrases_table([out]).rows if r["Part"] == "index"}
    assert rows[("PCA8,SQ4, phrase edges", "times smaller than the fp16 dump")]["Ours"] == round(ratio, 2)
    assert rows[("PCA8,SQ4, phrase edges", "bytes per vector")]["Ours"] == round(
        record["index_bytes"] / full["rows"], 1)
    assert "codes alone" in rows[("PCA8,SQ4, phrase edges", "EM@1 nq (index only)")]["Note"]
    assert rows[("PCA8,SQ4, phrase edges", "EM RC D_small (index only)")]["Ours"] == round(small["em"], 2)
    assert ("PCA8,SQ4, phrase edges", "EM@1 nq") not in rows


def test_a_filtered_trim_keeps_the_edges_its_trained_filter_head_keeps_and_the_best_of_each_passage(world, tmp_path,
                                                                                                   capsys):
    """config compressed_filter_threshold: of the phrase edges, those whose start- or end-filter logit (the model's
    head over the dump's fp16 vectors) exceeds the threshold, and the best edge of a passage where none does; only
    with the dump's own model, and only once its head was trained."""
    from npm.cli import main

    root = world["root"]
    model = DensePhrases.load(root / "model")
    model.filter_trained = True
    with atomic_dir(tmp_path / "model") as tmp:
        model.save(tmp)
    dump_phrases(tmp_path / "model", world["blocks"], tmp_path / "dump", progress=False)
    whole = PhraseDump(tmp_path / "dump")
    edges = np.flatnonzero(whole.tokens.word_start[:] | whole.tokens.word_end[:])
    head = model.filter_head
    with torch.no_grad():
        best = head(torch.as_tensor(np.asarray(whole.vectors[edges], np.float32))).max(-1).values.numpy()
    threshold = float(np.quantile(best, 0.7))
    expect = set(edges[best > threshold].tolist())
    passage = whole.tokens.passage[edges]
    for p in np.unique(passage):
        if not expect & set(edges[passage == p].tolist()):
            expect.add(int(edges[passage == p][np.argmax(best[passage == p])]))
    assert main(["densephrases", "trim", "--dump", str(tmp_path / "dump"), "--out", str(tmp_path / "trimmed"),
                 "--checkpoint", str(tmp_path / "model"), "--compressed-filter-threshold", str(threshold)]) == 0
    trimmed = PhraseDump(tmp_path / "trimmed")
    rows = np.flatnonzero(np.isin(whole.token[:], trimmed.token[:]))
    assert rows.tolist() == sorted(expect) and 0 < len(rows) < len(edges)
    assert set(trimmed.tokens.passage[:].tolist()) == set(passage.tolist())  # every passage keeps an edge
    assert trimmed.meta["token_filter"] == f"edges, filter > {threshold:g}"
    assert np.array_equal(trimmed.vectors[:], whole.vectors[rows])
    for model_dir, message in ((root / "model", "its filter head was never trained"),
                               (root / "other", "did not make the phrase dump")):
        assert main(["densephrases", "trim", "--dump", str(tmp_path / "dump"), "--out", str(tmp_path / "bad"),
                     "--checkpoint", str(model_dir), "--compressed-filter-threshold", "0"]) == 1
        assert message in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
