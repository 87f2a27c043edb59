"""`Store` is a façade over parts it owns (the table in storage/store.py):
no base class, each part a plain class kept as a private field that
`open` builds, and the state two parts share held by one part that both
are handed."""

import pytest

from storage.applying import Applier
from storage.entry import MS_PER_HOUR
from storage.hour_table import HourTable
from storage.id_index import IdIndex
from storage.pending import Pending
from storage.placement import Placement
from storage.reading import Reader
from storage.refile import Refiler
from storage.retention import Retention
from storage.store import NewMessage, Store

NOW = 490_000 * MS_PER_HOUR + 5_000
PARTS = {"_hours": HourTable, "_pending": Pending, "_applier": Applier, "_reader": Reader,
         "_placement": Placement, "_refiler": Refiler, "_retention": Retention}


def fields(part):
    """An object's fields by name: its __dict__, or, where mypyc compiled
    its class (the compiled run of `bash .ci/run`), the attributes the
    class declares, which it keeps in slots of its own."""
    declared = getattr(type(part), "__mypyc_attrs__", None)
    if declared is None:
        return vars(part)
    return {name: getattr(part, name) for name in declared if hasattr(part, name)}


@pytest.fixture
def store(tmp_path):
    store = Store.open(str(tmp_path), now_ms=NOW)
    yield store
    store.close()


def test_the_store_inherits_nothing():
    assert Store.__mro__ == (Store, object)


@pytest.mark.parametrize("part", PARTS.values(), ids=lambda cls: cls.__name__)
def test_every_part_is_a_plain_class(part):
    assert part.__mro__ == (part, object)


def test_open_builds_every_part_as_a_field(store):
    assert {name: type(fields(store).get(name)) for name in PARTS} == PARTS


def test_the_shared_state_is_one_object_every_part_is_handed(store):
    shared = {HourTable: store._hours, Pending: store._pending, IdIndex: store.ids}
    for name in PARTS:
        for field, value in fields(fields(store)[name]).items():
            for kind, the_one in shared.items():
                if isinstance(value, kind):
                    if value is store.keys:  # the key index: an IdIndex too, the store's one (storage.key_index)
                        continue
                    assert value is the_one, f"{name}.{field} is a {kind.__name__} of its own"


def test_the_store_works_through_its_parts_after_a_reopen(tmp_path):
    """Recovery replays through the parts the store then serves with."""
    with Store.open(str(tmp_path), now_ms=NOW) as store:
        store.send([NewMessage("t", "a", "x", NOW, NOW + 1_000, 60_000, 3)], NOW)
        store.commit()
    with Store.open(str(tmp_path), now_ms=NOW) as store:
        assert store.get("t", "a").msg == "x"
        assert store.send([NewMessage("t", "a", "y", NOW, NOW, 60_000, 3)], NOW)[0].outcome.value == "duplicate"
