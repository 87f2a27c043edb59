"""broker.cluster.routes: which API paths a node refuses to forward (a dot
segment, which the URL library would remove on the way to the leader);
tests/integration/test_cluster_auth.py sends them to a real cluster."""

import pytest
from yarl import URL

from broker.cluster.routes import has_dot_segment
from broker.http.paths import PREFIX


@pytest.mark.parametrize("path", [
    PREFIX + "../../_cluster/snapshot", PREFIX + "./sendMsg", PREFIX + "%2e%2e/x", PREFIX + ".%2E/x",
    PREFIX + "%2E/sendMsg", PREFIX + "x/..", PREFIX + "x/.",
])
def test_dot_segments_however_spelled(path):
    assert has_dot_segment(path)
    assert URL("http://leader:1" + path).raw_path != path  # what forwarding would have sent instead


@pytest.mark.parametrize("path", [PREFIX + "sendMsg", PREFIX + "...", PREFIX + "..;/x", PREFIX + "%252e%252e/x",
                                  PREFIX + "a..b", PREFIX + "..%2f_cluster"])
def test_other_paths(path):
    assert not has_dot_segment(path)
