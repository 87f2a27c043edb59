"""A topic's flow settings, pure: what they are, how a request gives them,
how they are answered and how they are kept (docs/api.md, "Flow").

    TopicSettings     one topic's settings: releaseRate, fairness,
                      maxDueAgeMillis, dedupWindowMillis, and its pauses
                      (the topic's, and each paused serial key's)
    Pause             since when, and what resume does (`OnResume`)
    parse_config      setTopicConfig's parameters, validated whole
    parse_pause       pauseTopic's and resumeTopic's parameters
    entries / rows    the settings as kept: one entry per topic and one per
                      paused key (broker.flow.file on a node's disk, the
                      Raft group's state on a cluster: broker.cluster.records);
                      entry_changes, what one change does to them

Every setting of the contract is carried out: none is stored and
ignored (a value out of its range is refused with code 400 naming it).

No I/O and no clock: a pause's time is the caller's `now_ms`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

import orjson

from storage.errors import ContractError, InvalidRequest

from ..core.params import Params, parse_topic

# --max-paused-keys' default: serial keys of one topic paused at once.
DEFAULT_MAX_PAUSED_KEYS = 1000
# --max-paused-keys-total's default: serial keys of the node paused at once.
DEFAULT_MAX_PAUSED_KEYS_TOTAL = 100_000

# The longest dedupWindowMillis: the disk store's retention of ended
# messages (storage.config), within which the id index finds them.
MAX_DEDUP_WINDOW_MS = 3 * 24 * 3600 * 1000

# The settings a topic has until set (setTopicConfig's defaults).
FAIRNESS = ("none", "fairKey")
# The highest releaseRate taken (messages a second): above it, a limit
# no node reaches limits nothing.
MAX_RELEASE_RATE = 10_000_000


class OnResume(enum.Enum):
    """What resumeTopic does with the messages that fell due while paused
    (trigger time in [pausedAt, resumedAt)): `hold` hands them out now, in
    pull order; `shift` moves each by the pause's length first; `expire`
    ends them (status 5, end reason `paused`)."""

    HOLD = "hold"
    SHIFT = "shift"
    EXPIRE = "expire"


@dataclass(frozen=True)
class Pause:
    """A pause of a topic or of one serial key: since `since_ms`, and what
    its resume does. `resume_ms` is set once a `shift` resume has begun
    (the resume's time, kept durable before the first message moves), so
    a resume cut short -- a crash, a failover, the call's client gone --
    and asked again moves (or ends: `expire`) the same range, each message
    once."""

    since_ms: int
    on_resume: OnResume = OnResume.HOLD
    resume_ms: int | None = None

    def stored(self) -> dict[str, object]:
        return {"since": self.since_ms, "onResume": self.on_resume.value, "resumeAt": self.resume_ms}

    @classmethod
    def from_stored(cls, row: Mapping[str, object]) -> Pause:
        since, resume = row["since"], row.get("resumeAt")
        if type(since) is not int or not (resume is None or type(resume) is int):
            raise ContractError(f"a pause's times are not whole numbers: {row!r}")
        return cls(since, OnResume(row["onResume"]), resume)

    def public(self) -> dict[str, object]:
        return {"pausedAt": self.since_ms, "onResume": self.on_resume.value}


@dataclass(frozen=True)
class TopicSettings:
    """One topic's settings (docs/api.md, "Flow"). A topic whose settings
    are all defaults and that has no pause is kept nowhere."""

    topic: str
    release_rate: int = 0  # messages a second handed out, 0: no limit
    fairness: str = "none"
    max_due_age_ms: int = 0
    dedup_window_ms: int = 0
    pause: Pause | None = None  # the topic's own pause
    keys: Mapping[str, Pause] = field(default_factory=dict)  # paused serial keys

    @property
    def is_default(self) -> bool:
        return (self.release_rate == 0 and self.fairness == "none" and self.max_due_age_ms == 0
                and self.dedup_window_ms == 0 and self.pause is None and not self.keys)

    def paused_json(self) -> bool | list[str]:
        """getTopicInfo's and getTopicConfig's `paused`: true when the
        topic is paused; else its paused keys, sorted; else false."""
        if self.pause is not None:
            return True
        return sorted(self.keys) if self.keys else False

    def public(self) -> dict[str, object]:
        """setTopicConfig's, getTopicConfig's, and a topic's pauseTopic's and resumeTopic's `data`."""
        return {**self._config_public(), "paused": self.paused_json(),
                "pausedKeys": [{"key": k, **self.keys[k].public()} for k in sorted(self.keys)]}

    def public_of_key(self, key: str) -> dict[str, object]:
        """A key's pauseTopic's and resumeTopic's `data`: as `public`, but
        `paused` and `pausedKeys` say that key alone (a change of one key
        answers that change, not every paused key of the topic)."""
        pause = self.keys.get(key)
        return {**self._config_public(),
                "paused": True if self.pause is not None else [key] if pause is not None else False,
                "pausedKeys": [] if pause is None else [{"key": key, **pause.public()}]}

    def _config_public(self) -> dict[str, object]:
        return {"topic": self.topic, "releaseRate": self.release_rate, "fairness": self.fairness,
                "maxDueAgeMillis": self.max_due_age_ms, "dedupWindowMillis": self.dedup_window_ms,
                "pause": None if self.pause is None else self.pause.public(), "pausedKeyCount": len(self.keys)}

    def with_config(self, config: TopicConfig) -> TopicSettings:
        return replace(self, release_rate=config.release_rate, fairness=config.fairness,
                       max_due_age_ms=config.max_due_age_ms, dedup_window_ms=config.dedup_window_ms)

    def with_pause(self, key: str | None, pause: Pause | None) -> TopicSettings:
        """The topic's pause (key None) or a key's, set (None: removed)."""
        if key is None:
            return replace(self, pause=pause)
        keys = dict(self.keys)
        if pause is None:
            keys.pop(key, None)
        else:
            keys[key] = pause
        return replace(self, keys=keys)

    def pause_of(self, key: str | None) -> Pause | None:
        return self.pause if key is None else self.keys.get(key)


# == requests ======================================================================================

@dataclass(frozen=True)
class TopicConfig:
    """setTopicConfig's parameters, each given or the topic's current value."""

    topic: str
    release_rate: int
    fairness: str
    max_due_age_ms: int
    dedup_window_ms: int


@dataclass(frozen=True)
class PauseRequest:
    """pauseTopic's or resumeTopic's parameters: the topic, one serial key
    or None (the topic), and the policy given (None: not given)."""

    topic: str
    key: str | None
    on_resume: OnResume | None
    # when it happens (a node of shards: the receiving shard's time, the
    # same on each); None: the keeper's now
    at_ms: int | None = None


def _whole(params: Params, parameter: str, current: int) -> int:
    value = params.get(parameter)
    if value is None or value == "":
        return current
    if type(value) is int:
        number = value
    elif isinstance(value, str) and value.lstrip("-").isdigit() and value.isascii() and len(value) < 19:
        number = int(value)
    else:
        raise InvalidRequest(parameter, f"must be a whole number, got {str(value)[:40]!r}")
    if number < 0:
        raise InvalidRequest(parameter, f"must be at least 0, got {number}")
    return number


def parse_config(params: Params, current: TopicSettings | None) -> TopicConfig:
    """setTopicConfig's parameters, validated whole (the first bad one
    raises InvalidRequest naming it; nothing is stored). A parameter not
    given keeps the topic's current value (a default when none is set)."""
    topic = parse_topic(params).topic
    now = current or TopicSettings(topic)
    release_rate = _whole(params, "releaseRate", now.release_rate)
    if release_rate > MAX_RELEASE_RATE:
        raise InvalidRequest("releaseRate", f"must be at most {MAX_RELEASE_RATE:,} a second (0: no limit), "
                                            f"got {release_rate}")
    fairness = params.get("fairness")
    if fairness is None or fairness == "":
        fairness = now.fairness
    if not isinstance(fairness, str) or fairness not in FAIRNESS:
        raise InvalidRequest("fairness", f"must be one of {', '.join(FAIRNESS)}, got {str(fairness)[:40]!r}")
    max_due_age_ms = _whole(params, "maxDueAgeMillis", now.max_due_age_ms)
    dedup_window_ms = _whole(params, "dedupWindowMillis", now.dedup_window_ms)
    if dedup_window_ms > MAX_DEDUP_WINDOW_MS:
        raise InvalidRequest("dedupWindowMillis", f"must be at most {MAX_DEDUP_WINDOW_MS} (3 days: as long as "
                                                  f"a node keeps an ended message), got {dedup_window_ms}")
    return TopicConfig(topic, release_rate, fairness, max_due_age_ms, dedup_window_ms)


def parse_pause(params: Params) -> PauseRequest:
    """pauseTopic's and resumeTopic's parameters: `topic`*, `key` (one
    serial key), `onResume` (hold, shift, expire)."""
    topic = parse_topic(params).topic
    key = params.get("key")
    if key is not None and key != "":
        if not isinstance(key, str):
            raise InvalidRequest("key", f"must be a string, got {type(key).__name__}")
        if len(key.encode("utf-8", "surrogatepass")) > 1024 or "\0" in key:
            raise InvalidRequest("key", "must be 1..1024 UTF-8 bytes without a NUL character")
    else:
        key = None
    given = params.get("onResume")
    on_resume = None
    if given is not None and given != "":
        try:
            on_resume = OnResume(given)
        except ValueError:
            raise InvalidRequest("onResume", f"must be hold, shift or expire, got {str(given)[:40]!r}") from None
    return PauseRequest(topic, key, on_resume)


# == as kept: entries ==============================================================================
# One entry per topic (its settings and its own pause) and one per paused
# serial key, keyed by the JSON of ["c", topic] or ["k", topic, key], so a
# pause of one key writes one small entry (a Raft command holds at most a
# few KiB: broker.cluster.records).

Entries = dict[str, bytes]


def entry_key(topic: str, key: str | None = None) -> str:
    return orjson.dumps(["c", topic] if key is None else ["k", topic, key]).decode()


# Entries changed by one change: each name with its new value, or None (removed).
Changes = dict[str, bytes | None]


def _topic_entry(s: TopicSettings) -> bytes:
    return orjson.dumps({
        "releaseRate": s.release_rate, "fairness": s.fairness, "maxDueAgeMillis": s.max_due_age_ms,
        "dedupWindowMillis": s.dedup_window_ms, "pause": None if s.pause is None else s.pause.stored()})


def entries(settings: Iterable[TopicSettings]) -> Entries:
    """Every topic's entries (a topic of defaults and no pause has none)."""
    out: Entries = {}
    for s in settings:
        if s.is_default:
            continue
        out[entry_key(s.topic)] = _topic_entry(s)
        for key, pause in s.keys.items():
            out[entry_key(s.topic, key)] = orjson.dumps(pause.stored())
    return out


def entry_changes(s: TopicSettings, key: str | None = None) -> Changes:
    """What a change of one topic's settings, or of one of its keys' pause
    (`key`), does to the entries: its topic entry as it is now (None: a
    topic of defaults and no pause keeps none), and the key's (None: not
    paused). O(1) whatever the topic's paused keys."""
    changes: Changes = {entry_key(s.topic): None if s.is_default else _topic_entry(s)}
    if key is not None:
        pause = s.keys.get(key)
        changes[entry_key(s.topic, key)] = None if pause is None else orjson.dumps(pause.stored())
    return changes


def rows(kept: Mapping[str, bytes]) -> dict[str, TopicSettings]:
    """The settings the entries keep, by topic; ContractError, a ValueError (its reason),
    for an entry no node wrote."""
    topics: dict[str, dict[str, object]] = {}
    keys: dict[str, dict[str, Pause]] = {}
    for raw_key, value in kept.items():
        try:
            name = orjson.loads(raw_key)
            row = orjson.loads(value)
        except orjson.JSONDecodeError as e:
            raise ContractError(f"an entry is not JSON: {e}") from None
        if not isinstance(name, list) or not name or not all(isinstance(n, str) for n in name):
            raise ContractError(f"an entry's name is not a list of strings: {raw_key[:80]!r}")
        if not isinstance(row, dict):
            raise ContractError(f"an entry's value is not an object: {raw_key[:80]!r}")
        try:
            if name[0] == "c" and len(name) == 2:
                topics[name[1]] = row
            elif name[0] == "k" and len(name) == 3:
                keys.setdefault(name[1], {})[name[2]] = Pause.from_stored(row)
            else:
                raise ContractError(f"an entry of unknown kind: {raw_key[:80]!r}")
        except (KeyError, TypeError) as e:
            raise ContractError(f"entry {raw_key[:80]!r} lacks a field or has a wrong one: {e!r}") from None
    out: dict[str, TopicSettings] = {}
    for topic in sorted(set(topics) | set(keys)):
        row = topics.get(topic, {})
        pause = row.get("pause")
        try:
            out[topic] = TopicSettings(
                topic, _stored_int(row, "releaseRate"), str(row.get("fairness", "none")),
                _stored_int(row, "maxDueAgeMillis"), _stored_int(row, "dedupWindowMillis"),
                None if pause is None else Pause.from_stored(pause),  # type: ignore[arg-type]
                keys.get(topic, {}))
        except (KeyError, TypeError, AttributeError) as e:
            raise ContractError(f"topic {topic[:80]!r}'s entry has a wrong field: {e!r}") from None
    return out


def _stored_int(row: Mapping[str, object], name: str) -> int:
    value = row.get(name, 0)
    if type(value) is not int:
        raise ContractError(f"{name} is not a whole number: {value!r}")
    return value
