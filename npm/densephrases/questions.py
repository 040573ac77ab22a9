"""The question DensePhrases encodes for an NPM-style open-set input (Lee et al. 2021, section 7.2; docs/paper-map.md
§D1.5), shared by the evaluation (``npm.densephrases.evaluate``) and the query-side fine-tuning data
(``npm.embedded.rc.cloze_questions``), which import it from here rather than from each other."""

from __future__ import annotations

from npm.baselines.lm import question_text, task_family
from npm.tasks.templates import MASK_PLACEHOLDER as MASK


def task_question(task: str, text: str) -> str:
    """The question of one open-set input of ``task`` (its "<mask>" form): NQ, TriviaQA and KAMEL keep their question;
    a cloze (LAMA, TempLAMA) or translation input is its text with the mask removed ("The capital of Greece is"), a
    format that phrase training never sees and that query-side fine-tuning can learn (paper 7.2, slot filling)."""
    if task_family(task) == "question":
        return question_text(text)
    return " ".join(text.replace(MASK, " ").split()).rstrip(" .?!:")
