"""storage.entry: the message tuple's `with_state` is `_replace` of its
status and retry, and the status lookup decodes every status."""

from hypothesis import given
from hypothesis import strategies as st

from storage.entry import STATUS_BY_VALUE, Location, Message, Status

messages = st.builds(Message, st.text(max_size=5), st.text(max_size=5), st.text(max_size=5), st.integers(),
                     st.integers(), st.integers(), st.integers(), st.integers(), st.text(max_size=3),
                     st.sampled_from(Status), st.integers(0, 255), st.builds(Location, st.integers(), st.integers()),
                     st.text(max_size=3))


@given(messages, st.sampled_from(Status), st.integers(0, 255))
def test_with_state_is_replace_of_status_and_retry(message, status, retry):
    changed = message.with_state(status, retry)
    assert changed == message._replace(status=status, retry=retry)
    assert type(changed) is Message and changed.status is status


def test_every_status_decodes_by_its_number_and_nothing_else_does():
    assert all(STATUS_BY_VALUE[int(s)] is s for s in Status)
    assert set(STATUS_BY_VALUE) == set(range(1, 8))
