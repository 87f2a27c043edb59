"""The Lua scripts of the Redis code, read once at import from
broker/redis/lua/<family>/<name>.lua (package data: an installed package
has them).

Each family (`backend`: RedisBroker; `dyno`: Dyno-queues; `rmq`: RMQ) has
a `common.lua` of helpers its scripts share; a script that uses them runs
as common.lua followed by its own file (Redis takes one source text per
script, so they are joined here). Every script reads only the keys it is
given in KEYS, as Redis Cluster requires; each file's first comment says
what it takes in ARGV and what it answers.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import resources
from typing import Any

LUA = resources.files(__package__) / "lua"

# What a script answers, as redis-py decodes it: a string, an integer, None
# or a list of them (nested), in the shape its file's first comment gives.
# Any: each caller unpacks the shape of its own script.
Reply = Any


def read(family: str, name: str) -> str:
    return (LUA / family / f"{name}.lua").read_text(encoding="utf-8")


def load_scripts(family: str, with_common: Iterable[str], alone: Iterable[str] = ()) -> dict[str, str]:
    """{name: source}: the scripts of `family`, those in `with_common`
    preceded by the family's common.lua, those in `alone` as they are."""
    common = read(family, "common")
    scripts = {name: common + read(family, name) for name in with_common}
    scripts.update((name, read(family, name)) for name in alone)
    return scripts
