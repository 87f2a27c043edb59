"""The message as every answer and every push shows it: camellia's
DelayMsg and hourglass's extensions (docs/api.md, "The message, its
statuses, and the codes"). getMsg, the pulls, the sends' answers, the
listings and the push bodies (broker.push.pusher) all build it here."""

from __future__ import annotations

from storage.entry import Message

from .leases import delivery_id
from .recurrence import add_run_fields


def delay_msg(m: Message) -> dict[str, object]:
    """camellia's DelayMsg, plus the extensions `priority`, `tag` and `key`
    (and a schedule's run's `scheduleId` and `scheduledTime`, and the
    trace context `traceparent` and `tracestate` of a message sent with
    them, `fairKey` of a message sent with one, `redriveCount` of a
    message a redriveMsgs job put back, `endReason` of one a resume's
    `expire` ended, and `deliveryId` of one a pull hands over, only then)."""
    d: dict[str, object] = {"topic": m.topic, "msgId": m.msg_id, "msg": m.msg, "produceTime": m.produce_ms,
                            "triggerTime": m.trigger_ms, "expireTime": m.trigger_ms + m.ttl_ms,  # (m.expire_ms)
                            "maxRetry": m.max_retry,
                            "retry": m.retry, "status": int(m.status), "priority": m.priority, "tag": m.tag,
                            "key": m.key}
    if m.traceparent:
        d["traceparent"] = m.traceparent
        if m.tracestate:
            d["tracestate"] = m.tracestate
    if m.fair_key:
        d["fairKey"] = m.fair_key
    if m.redrive_count:
        d["redriveCount"] = m.redrive_count
    if m.end_reason:
        d["endReason"] = m.end_reason
    if m.delivery:
        d["deliveryId"] = delivery_id(m.delivery)
    return add_run_fields(d) if "@" in m.msg_id else d
