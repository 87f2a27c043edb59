"""broker.http.sessions: the console's session table on a fake clock."""

import pytest
from fakes import FakeClock

from broker.http.sessions import ConsoleConfig, ConsoleSessions, session_cookie
from storage.errors import ConfigError

TTL_S = 60


def sessions(clock: FakeClock, max_sessions: int = 4, secure: bool = False) -> ConsoleSessions:
    return ConsoleSessions(ConsoleConfig(session_ttl_s=TTL_S, max_sessions=max_sessions, cookie_secure=secure), clock)


def test_a_session_lives_its_ttl_from_the_login_and_not_a_millisecond_more():
    clock = FakeClock(now_ms=1_000_000)
    table = sessions(clock)
    session = table.create()
    clock.advance(TTL_S * 1000 - 1)
    assert table.valid(session)  # checking it extends nothing
    clock.advance(1)
    assert not table.valid(session)
    clock.advance(-10_000)  # (a monotonic clock never steps back; an expired session stays ended anyway)
    assert not table.valid(session) and len(table) == 0


def test_ids_are_random_url_safe_and_long():
    table = sessions(FakeClock(), max_sessions=1000)
    ids = [table.create() for _ in range(1000)]
    assert len(set(ids)) == 1000
    for session in ids:
        assert len(session) == 43 and session.replace("-", "").replace("_", "").isalnum()  # 256 bits, base64url
    assert all(table.valid(s) for s in ids)


def test_unknown_empty_and_missing_ids_are_refused():
    table = sessions(FakeClock())
    session = table.create()
    flipped = ("A" if session[0] != "A" else "B") + session[1:]
    for other in (None, "", session[:-1], session + "x", flipped):
        assert not table.valid(other)
    assert table.valid(session)


def test_at_the_cap_a_login_ends_the_oldest_session():
    clock = FakeClock()
    table = sessions(clock, max_sessions=3)
    first = [table.create() for _ in range(3)]
    newest = table.create()
    assert [table.valid(s) for s in first] == [False, True, True] and table.valid(newest)
    assert len(table) == 3


def test_expired_sessions_make_room_before_live_ones_are_dropped():
    clock = FakeClock()
    table = sessions(clock, max_sessions=2)
    old = table.create()
    clock.advance(TTL_S * 1000 // 2)
    middle = table.create()
    clock.advance(TTL_S * 1000 // 2)  # old expired, middle still half alive
    newest = table.create()
    assert not table.valid(old) and table.valid(middle) and table.valid(newest)


def test_end_is_logout():
    table = sessions(FakeClock())
    kept, ended = table.create(), table.create()
    table.end(ended)
    table.end(ended)  # twice: nothing
    table.end(None)
    assert table.valid(kept) and not table.valid(ended)


def test_the_table_holds_digests_not_ids():
    table = sessions(FakeClock())
    session = table.create()
    assert table.valid(session) and session not in repr(vars(table))


def test_cookies():
    table = sessions(FakeClock())
    assert table.set_cookie("abc") == "hg_console=abc; Path=/console; Max-Age=60; HttpOnly; SameSite=Strict"
    assert table.clear_cookie() == "hg_console=; Path=/console; Max-Age=0; HttpOnly; SameSite=Strict"
    secure = sessions(FakeClock(), secure=True)
    assert secure.set_cookie("abc").endswith("; HttpOnly; SameSite=Strict; Secure")
    assert secure.clear_cookie().endswith("; Secure")
    # a ttl below a second still gives the browser a cookie that lives
    short = ConsoleSessions(ConsoleConfig(session_ttl_s=0.5), FakeClock())
    assert "Max-Age=1;" in short.set_cookie("abc")


def test_session_cookie_reads_its_value_among_others():
    assert session_cookie("a=1; hg_console=xyz; b=2") == "xyz"
    assert session_cookie("hg_console_old=1;hg_console=") == ""
    assert session_cookie("other=hg_console") is None
    assert session_cookie("") is None


def test_repr_says_how_many_live_and_the_settings():
    clock = FakeClock()
    table = sessions(clock, max_sessions=5, secure=True)
    table.create()
    table.create()
    assert repr(table) == "ConsoleSessions(live=2, max_sessions=5, session_ttl_s=60, cookie_secure=True)"
    clock.advance(TTL_S * 1000)
    assert repr(table) == "ConsoleSessions(live=0, max_sessions=5, session_ttl_s=60, cookie_secure=True)"


@pytest.mark.parametrize(("ttl_s", "max_sessions", "flag"), [
    (0, 1, "--console-session-ttl-s"), (-1, 1, "--console-session-ttl-s"),
    (float("nan"), 1, "--console-session-ttl-s"), (float("inf"), 1, "--console-session-ttl-s"),
    (60, 0, "--max-console-sessions")])
def test_nonsense_settings_are_refused(ttl_s, max_sessions, flag):
    with pytest.raises(ConfigError, match=flag):
        ConsoleConfig(session_ttl_s=ttl_s, max_sessions=max_sessions)
