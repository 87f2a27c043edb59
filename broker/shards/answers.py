"""How every shard's answer to a command that runs on all of them becomes
the node's one answer (broker.http.commands.Where, `on_every(merge)`): a
merge takes the answers in shard order, the index of the shard the request
reached, and the request, and returns the answer to give.

    all_ok          a change every shard carries out alike (a pause, a
                    subscription, the health switch): the first answer that
                    is not a success, else the reached shard's (the others
                    answer a success as SUCCESS_ONLY: its body is not read)
    subscription    getSubscription: each shard pushes the topic's messages
                    it owns; their deliveries' health summed (the last error
                    the latest)
    schedules_page  listSchedules: every shard's page after the cursor
                    (scheduleIds in order), merged and cut to the limit
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import orjson

from ..core import params
from ..http.http_types import Response
from ..schedules.params import DEFAULT_PAGE as DEFAULT_SCHEDULE_PAGE

# (answers in shard order, the reached shard, the request's parameters) -> the node's answer
Merge = Callable[[Sequence[Response], int, params.Params], Response]


def succeeded(response: Response) -> bool:
    """An answer of code 200 (broker.http.api: the code leads the body)."""
    return response.status == 200 and b'"code":200' in response.body[:40]


def all_ok(answers: Sequence[Response], here: int, given: params.Params) -> Response:
    for response in answers:
        if not succeeded(response):
            return response
    return answers[here]


# A success as a shard answers it to the shard that fanned out a command whose merge reads
# no other shard's success but its code (the reached shard's own answer is the node's).
SUCCESS_ONLY = Response(200, b'{"code":200}')
CODE_ONLY_MERGES = frozenset({"all_ok"})


def subscription(answers: Sequence[Response], here: int, given: params.Params) -> Response:
    found = [orjson.loads(r.body) for r in answers]
    if any(f.get("code") != 200 for f in found):
        return answers[here]
    data = found[here]["data"]
    healths = [f["data"]["health"] for f in found if f["data"].get("health") is not None]
    if healths:
        health: dict[str, Any] = {"deliveries": sum(h["deliveries"] for h in healths), "failures": {},
                                  "inFlight": sum(h["inFlight"] for h in healths),
                                  "backingOff": sum(h["backingOff"] for h in healths), "lastError": None,
                                  "lastErrorTime": None}
        for h in healths:
            for kind, n in h["failures"].items():
                health["failures"][kind] = health["failures"].get(kind, 0) + n
            if h["lastErrorTime"] is not None and (health["lastErrorTime"] is None
                                                   or h["lastErrorTime"] > health["lastErrorTime"]):
                health["lastError"], health["lastErrorTime"] = h["lastError"], h["lastErrorTime"]
        data = {**data, "health": health}
    return Response(200, orjson.dumps({**found[here], "data": data}))


def schedules_page(answers: Sequence[Response], here: int, given: params.Params) -> Response:
    pages = []
    for response in answers:
        page = orjson.loads(response.body)
        if page.get("code") != 200:
            return response
        pages.append(page)
    limit = given.get("limit")
    rows = sorted((row for page in pages for row in page["schedules"]), key=lambda row: row["scheduleId"])
    cut = int(limit) if isinstance(limit, (int, str)) and str(limit).isascii() \
        and str(limit).isdigit() else DEFAULT_SCHEDULE_PAGE
    more = any(page.get("cursor") is not None for page in pages) or len(rows) > cut
    rows = rows[:cut]
    cursor = rows[-1]["scheduleId"] if more and rows else None
    return Response(200, orjson.dumps({**pages[0], "schedules": rows, "cursor": cursor}))


MERGES: dict[str, Merge] = {"all_ok": all_ok, "subscription": subscription, "schedules_page": schedules_page}
