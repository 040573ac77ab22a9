"""What the document readers leave out (paper section 4.1; paper-map §2.1): one ``Stats`` per extraction, shared by
the readers (``npm.data.wikipedia``, ``npm.data.ccnews``) and ``npm.data.documents.extract_documents``, which reports
it. Its own module so that the readers and the extraction import it without importing each other."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

MAX_SKIPPED_IDS = 50


@dataclass
class Stats:
    """What a reader left out: ``counts`` by reason and the ids of the first malformed records."""

    counts: Counter = field(default_factory=Counter)
    skipped_ids: list = field(default_factory=list)

    def skip(self, record_id, where: str, reason: str) -> None:
        """Log a malformed record (``where`` = file:line or page) and count it as skipped."""
        logger.warning("%s: skipped record %s: %s", where, record_id, reason)
        self.counts["skipped"] += 1
        if len(self.skipped_ids) < MAX_SKIPPED_IDS:
            self.skipped_ids.append(str(record_id))
