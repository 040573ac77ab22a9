"""REPLUG's Table 1 and Figure 4 in our world, from ``npm-repro replug eval-lm``'s results (docs/paper-map.md §R3).

* ``lm_table``: bits per byte of the plain LM, REPLUG at each k and k random documents, with the 95 % interval over
  resampled texts and the gain over the plain LM; beside them the paper's GPT-2 Small row (117 M parameters, the
  paper's closest LM to the embedded default's SmolLM2-135M; Pile bits per byte, REPLUG with 10 documents).
* ``k_figure``: bits per byte against k for REPLUG and random documents, the plain LM as a line (the paper's
  Figure 4 shape: random documents are no better than none, retrieved ones improve with k).
"""

from __future__ import annotations

import os

from npm.report.figures import _pyplot, save_figure
from npm.report.frame import lm_eval_frame, load_lm_eval, plain
from npm.report.tables import Table, columns_note

# Shi et al. 2023, Table 1, GPT-2 Small (117M): Pile bits per byte; REPLUG ensembles 10 documents.
PAPER_GPT2_SMALL = {"lm": (1.33, None), "replug": (1.26, 5.3), "replug_lsr": (1.21, 9.0)}
NAMES = {"lm": "LM", "replug": "+ REPLUG", "replug_lsr": "+ REPLUG LSR", "random_docs": "+ random documents",
         "concat": "+ documents concatenated"}


COLUMNS = ["System", "k", "Bits/byte", "95% interval", "Gain %", "Gain % interval", "Perplexity", "Bits/byte (paper)",
           "Gain % (paper)"]
# What each column holds: the footer's "Columns:" line (npm.report.tables.columns_note).
COLUMN_DOCS = {"System": "the plain LM, or the LM with retrieved (REPLUG, REPLUG LSR) or random documents",
               "k": "documents per window (0: none)",
               "Bits/byte": "the LM's negative log2-likelihood of the texts per UTF-8 byte, lower is better",
               "95% interval": "of Bits/byte, over resampled texts",
               "Gain %": "relative drop of Bits/byte against the plain LM",
               "Gain % interval": "of Gain %, paired over resampled texts",
               "Perplexity": "per LM token", "Bits/byte (paper)": "REPLUG paper's GPT-2 Small row (Pile)",
               "Gain % (paper)": "its gain over GPT-2 Small alone"}


def lm_table(path: str | os.PathLike) -> Table:
    """The table from the rows of ``npm.report.results`` (:func:`npm.report.frame.lm_eval_rows`), one row per system
    and k in the file's order; the file gives the notes' setting (LM, retriever, corpus, texts)."""
    results = load_lm_eval(path)
    frame = lm_eval_frame(path, results)
    wide = frame.pivot(index=["system", "k"], columns="metric", values=["value", "ci_low", "ci_high"])
    top_k = frame.groupby("system")["k"].max()
    rows = []
    for system, k in frame[["system", "k"]].drop_duplicates().itertuples(index=False):
        cell = wide.loc[(system, k)]

        def get(field, metric, cell=cell):
            return plain(cell.get((field, metric)))

        k = plain(k)
        # the paper's REPLUG rows ensemble 10 documents: shown beside our largest k
        paper_bpb, paper_gain = PAPER_GPT2_SMALL.get(system, (None, None)) if k == top_k[system] else (None, None)
        rows.append({"_system": f"{system}@{k}", "System": NAMES.get(system, system), "k": str(k),
                     "Bits/byte": get("value", "bpb"),
                     "95% interval": f"[{get('ci_low', 'bpb'):.3f}, {get('ci_high', 'bpb'):.3f}]",
                     "Gain %": get("value", "gain_pct") if k else None,
                     "Gain % interval": (f"[{get('ci_low', 'gain_pct'):.2f}, {get('ci_high', 'gain_pct'):.2f}]"
                                         if k else None),
                     "Perplexity": get("value", "perplexity"), "Bits/byte (paper)": paper_bpb,
                     "Gain % (paper)": paper_gain})
    notes = [columns_note("replug_lm", COLUMNS, docs=COLUMN_DOCS),
             f"LM {results['lm']}; retriever {results['retriever']} over {results.get('corpus') or 'the corpus'} "
             f"({results['corpus_blocks']} blocks); {results['n_texts']} texts, {results['n_bytes']} bytes, "
             f"{results['n_windows']} windows.",
             "Intervals: 95 % over 1,000 seeded resamples of the texts. Paper: REPLUG Table 1, GPT-2 Small (117M) on "
             "the Pile with 10 documents (REPLUG and REPLUG LSR), shown beside our largest k."]
    return Table(name="replug_lm", title="REPLUG language modelling: bits per byte (lower is better)",
                 columns=COLUMNS, rows=rows, notes=notes,
                 md_digits={"Bits/byte": 4, "Bits/byte (paper)": 2, "Gain %": 2})


def k_figure(path: str | os.PathLike, out: str | os.PathLike) -> dict:
    """Gain in bits per byte over the plain LM (%, with the paired 95 % interval over resampled texts) against k, for
    REPLUG, REPLUG LSR and random documents; 0 = no retrieval. Paired gains, because the texts' own difficulty makes
    the absolute bits-per-byte intervals much wider than the differences between systems."""
    results = load_lm_eval(path)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    drawn = {}
    for system, style in (("replug", "o-"), ("replug_lsr", "^-"), ("random_docs", "s--")):
        pts = sorted((r["k"], r["gain_pct"], r["gain_pct_ci95"]) for r in results["rows"] if r["system"] == system)
        if pts:
            ks, ys, ci = zip(*pts, strict=True)
            err = [[y - c[0] for y, c in zip(ys, ci, strict=True)], [c[1] - y for y, c in zip(ys, ci, strict=True)]]
            ax.errorbar(ks, ys, yerr=err, fmt=style, capsize=3, label=NAMES[system].lstrip("+ "))
            drawn[system] = dict(zip(ks, ys, strict=True))
    ax.axhline(0.0, color="grey", linestyle=":", label="no retrieval")
    ks = sorted({r["k"] for r in results["rows"] if r["k"]})
    ax.set_xticks(ks)
    ax.set_xlabel("documents ensembled (k)")
    ax.set_ylabel("bits-per-byte gain over the LM (%)")
    ax.set_title("REPLUG Figure 4 shape")
    ax.legend(fontsize=8)
    save_figure(fig, out)
    return drawn
