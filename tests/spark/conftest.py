"""One SparkSession and one real `hourglass serve` for every Spark test of a
run (starting Spark takes ~10 s, its Python workers a few more).

`local[2,3]`: two cores, and a failed task is tried up to 3 times (plain
`local[2]` never retries one), so the tests see Spark's real retries.
Spark's Python workers run this interpreter (PYSPARK_PYTHON), where
hourglass is installed, and the JVM binds to loopback only.
"""

from __future__ import annotations

import os
import sys

import pytest
from serving import Server


@pytest.fixture(scope="session")
def spark():
    pytest.importorskip("pyspark", reason="pyspark is not installed: pip install -e '.[spark]' (CI installs it)")
    pytest.importorskip("pyarrow", reason="pyarrow is not installed: pip install -e '.[spark]' (CI installs it)")
    from pyspark.sql import SparkSession

    from broker.spark import register

    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (SparkSession.builder.master("local[2,3]").appName("hourglass-spark-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.memory", "1g")
               .config("spark.sql.session.timeZone", "UTC")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    """A real `hourglass serve`; each test uses topics of its own."""
    root = tmp_path_factory.mktemp("spark-broker")
    server = Server.start(root / "data", log_path=root / "serve.log")
    yield server
    assert server.stop() == 0
