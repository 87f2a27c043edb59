"""importMsgBatch's body (broker.core.params.parse_import_batch_body):
sendMsgBatch's, strict always, each message's status and retry kept,
validated whole with the message's index named."""

from __future__ import annotations

import json

import pytest

from broker.core.bodies import BodyLimits
from broker.core.params import Defaults, parse_import_batch_body
from storage.errors import InvalidRequest

NOW = 1_800_000_000_000


def parse(*msgs: dict) -> tuple:
    body = json.dumps({"topic": "t", "strictIdempotence": False, "msgs": list(msgs)}).encode()
    return parse_import_batch_body(body, limits=BodyLimits(), now_ms=NOW, make_id=lambda: "made",
                                   defaults=Defaults(), max_msg_bytes=1 << 20)


def test_each_message_keeps_its_status_and_retry_and_the_batch_is_strict():
    sends = parse({"msgId": "a", "msg": "x"}, {"msgId": "b", "msg": "x", "maxRetry": 3, "retry": 2, "status": 3},
                  {"msgId": "c", "msg": "x", "maxRetry": 3, "retry": 4, "status": 6},
                  {"msgId": "d", "msg": "x", "status": 5, "strictIdempotence": False})
    assert [s.kept for s in sends] == [None, (1, 2), (6, 4), (5, 0)]
    assert all(s.strict for s in sends)


@pytest.mark.parametrize(("item", "named"), [
    ({"status": 4}, "msgs[1].status"), ({"status": 7}, "msgs[1].status"), ({"status": "x"}, "msgs[1].status"),
    ({"retry": 4, "maxRetry": 3}, "msgs[1].retry"), ({"retry": 5, "maxRetry": 3, "status": 6}, "msgs[1].retry"),
    ({"retry": -1}, "msgs[1].retry")])
def test_a_bad_status_or_retry_is_a_400_naming_it(item, named):
    with pytest.raises(InvalidRequest, match=named.replace("[", r"\[").replace("]", r"\]")):
        parse({"msgId": "a", "msg": "x"}, {"msgId": "b", "msg": "x", **item})
