"""What a `user` is shown of other teams: nothing. Other teams' job ids anywhere in what the api shows
(a pending reason "held behind job j…", a preemption's victims, a decision's candidates) are replaced,
whether or not such a job exists; other teams' job names are replaced in the decider's prose; operators
and admins see everything.

The decider writes its reasons for everyone; the api, which knows who asks, redacts at the edge, so no
writer has to know who will read.

A name is hidden only in what the decider wrote (a decision's reason, evidence and data, a pending
reason): text a user or their trainer wrote (a model folder's name in `job.submitted`, a trainer's
events, a status reason quoting its log) is shown as written, as hiding a word there only when another
team has a job of that name would answer a guess. There a name is hidden where it stands as a whole
word (job names are `[A-Za-z0-9][A-Za-z0-9._-]*`) and no job of the viewer's own team has it; a name that
reads as a number ("1", "0.5") is left alone, so counts in a reason stay readable.
"""

from __future__ import annotations

import re
from typing import Any

from services.api.auth import Principal
from shared.infra.job_reads import team_jobs

JOB_ID = re.compile(r"\bj[0-9a-f]{16}\b")
NAME_TOKEN = re.compile(r"(?<![A-Za-z0-9._-])[A-Za-z0-9][A-Za-z0-9._-]*")
_NUMBER = re.compile(r"^[0-9.]+$")
HIDDEN = "(another team's job)"
# Where the decider puts words about jobs: a job view's pending reasons (only the decider writes them),
# and a decision's (an audit row of source decider) reason, evidence and data.
PENDING_PROSE = frozenset({"pending_reason", "pending_reason_rules"})
DECISION_PROSE = frozenset({"reason", "evidence", "data"})


def _decider_prose(parent: dict, key: Any) -> bool:
    return key in PENDING_PROSE or (key in DECISION_PROSE and parent.get("source") == "decider")


def _walk(value: Any, prose: bool, ids: set[str], words: set[str]) -> None:
    """Collect the job ids of every string, and the name-like words of the decider's prose."""
    if isinstance(value, str):
        ids.update(JOB_ID.findall(value))
        if prose:
            for word in NAME_TOKEN.findall(value):
                words.update({word, word.rstrip("._-")})
    elif isinstance(value, dict):
        for k, v in value.items():  # a key is a name only to the code that reads it: ids hidden, no words
            _walk(k, False, ids, words)
            _walk(v, prose or _decider_prose(value, k), ids, words)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _walk(v, prose, ids, words)


def _hide_names(text: str, names: set[str]) -> str:
    def one(m: re.Match) -> str:
        word = m.group(0)
        core = word.rstrip("._-")  # a sentence's full stop is not part of the name
        return HIDDEN + word[len(core) :] if core in names or word in names else word

    return NAME_TOKEN.sub(one, text)


def _replace(value: Any, ids: set[str], names: set[str], prose: bool) -> Any:
    if isinstance(value, str):
        if prose and names:
            value = _hide_names(value, names)
        return JOB_ID.sub(lambda m: HIDDEN if m.group(0) in ids else m.group(0), value)
    if isinstance(value, dict):
        return {
            _replace(k, ids, names, False): _replace(v, ids, names, prose or _decider_prose(value, k))
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_replace(v, ids, names, prose) for v in value]
    return value


async def for_viewer(pool, who: Principal, value: Any) -> Any:
    """`value` (a view, a list of them, any JSON-like data) as `who` may see it."""
    if who.sees_all:
        return value
    ids: set[str] = set()
    words: set[str] = set()
    _walk(value, False, ids, words)
    words = {w for w in words if w and len(w) <= 63 and not _NUMBER.match(w)}
    foreign_ids: set[str] = set()
    if ids:  # only the caller's own team's ids stay; any other (another team's, or a job since deleted) is hidden
        foreign_ids = ids - await team_jobs.ids_of_team(pool, ids, who.team)
    foreign_names: set[str] = set()
    if words:
        foreign_names = await team_jobs.names_of_other_teams_only(pool, words, who.team)
    if not foreign_ids and not foreign_names:
        return value
    return _replace(value, foreign_ids, foreign_names, False)
