"""What a fuzz case is, what it must end as, and how its end is judged.

A case is made in the parent from a real sample and one change, with its oracle decided from
the change (never by asking the reader): ACCEPT (the change keeps the input valid), REFUSE (it
breaks a rule the reader must check) or EITHER (random damage whose effect cannot be told: only
crashes, hangs and memory count). A kind's `attempt` calls the reader and raises `Refused` with
the reader's message when the reader refused it the way it should (its own error type); any
other exception is a crash.
"""
import random
from dataclasses import dataclass, field

ACCEPT, REFUSE, EITHER = "accept", "refuse", "either"

# How a case ended.
ACCEPTED, REFUSED, CRASH, HANG, MEMORY = "accepted", "refused", "crash", "hang", "memory"
OUTCOMES = (ACCEPTED, REFUSED, CRASH, HANG, MEMORY)

# The failure classes a case can fall into (a case may fall into two: a crash that also wrote outside).
WRONG_ACCEPT, VALID_REFUSED, FILES_OUTSIDE = "wrong_accept", "valid_refused", "files_outside"
FAILURES = (CRASH, HANG, MEMORY, WRONG_ACCEPT, VALID_REFUSED, FILES_OUTSIDE)

# Defects known when the harness was written (all fixed since). A case that exercises one carries its
# tag; a failure of a tagged case, of a class the defect explains, is counted under that defect, so a
# report says which old defect came back (the fast sample asserts each count is 0).
KNOWN = {
    "zip-damage": ("a damaged zip (CRC, deflate data, sizes, flags, method) crashes instead of being refused",
                   (CRASH,)),
    "zip-unsafe": ("a zip with unsafe names (../, /abs, C:/, backslashes), link entries or duplicate names is "
                   "accepted", (WRONG_ACCEPT,)),
    "batch-rows": ("a batch trace whose row or request counts disagree with its workload is accepted",
                   (WRONG_ACCEPT,)),
    "lone-surrogate": ("a prompt with a lone surrogate is accepted (and breaks later)", (WRONG_ACCEPT, CRASH)),
    "scrape-other-run": ("two scrapes of different runs (another model, a restart) are subtracted",
                         (WRONG_ACCEPT,)),
    "zero-rate": ("a window with no drafts gives 0/0 rates", (CRASH,)),
}


class Refused(Exception):
    """The reader refused the input with its own error type; the message is the reader's."""


@dataclass
class Case:
    kind: str
    index: int
    change: str  # what was done to which sample, in a few words
    expect: str  # ACCEPT, REFUSE or EITHER
    source: str  # the name a refusal must mention (a file, an upload's name), "" where a reader has none
    call: str  # which entry point runs it (each kind knows its own)
    files: dict[str, bytes] = field(default_factory=dict)  # written into the working folder first
    data: bytes = b""  # handed to the entry point directly, where it takes bytes
    tag: str | None = None  # a KNOWN defect the case exercises
    options: dict = field(default_factory=dict)
    mentions: tuple[str, ...] = ()  # for readers given no name: a refusal must say one of these (where it looked)

    def names_its_source(self, message: str) -> bool:
        words = self.mentions or ((self.source,) if self.source else ())
        return not words or any(w in message for w in words)


def case_rng(seed: int, kind: str, index: int) -> random.Random:
    """Each case its own stream, so one case is made again from (seed, kind, index) alone."""
    return random.Random(f"{seed}/{kind}/{index}")


def failures_of(expect: str, outcome: str, outside: bool) -> list[str]:
    found = [outcome] if outcome in (CRASH, HANG, MEMORY) else []
    if outcome == ACCEPTED and expect == REFUSE:
        found.append(WRONG_ACCEPT)
    if outcome == REFUSED and expect == ACCEPT:
        found.append(VALID_REFUSED)
    if outside:
        found.append(FILES_OUTSIDE)
    return found


def known_class(tag: str | None, failure: str) -> str | None:
    """The KNOWN defect that explains this failure of a case with this tag, or None."""
    if tag in KNOWN and failure in KNOWN[tag][1]:
        return tag
    return None
