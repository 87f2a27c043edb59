"""What keeping an id index's pages out of RSS costs (storage.id_index,
`--index-resident-mb`): N ids looked up and inserted (keys_present and
put_many of 1,000, as a batch of sends does) into an index of 8 MB, with
its pages resident and with them paged (each probe's page mapped alone,
the pages shed every 256 calls: --index-resident-mb 0). Prints ONE JSON object.

    .venv/bin/python bench/index_pages.py
    .venv/bin/python -P bench/index_pages.py     # the installed (compiled) build, from another directory
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time

from storage import id_index
from storage.id_index import IdIndex, Residency


def run(ids: int, paged: bool) -> tuple[float, int]:
    """(us an id, sheds) for `ids` ids looked up and inserted."""
    directory = tempfile.mkdtemp(prefix="hourglass-index-pages-")
    try:
        index = IdIndex.build(directory + "/ids", 8192, lambda hour: True,
                              residency=Residency(0 if paged else 1 << 40))
        index.publish()
        began = time.perf_counter()
        for batch in range(ids // 1000):
            keys, _ = index.keys_present([("t", f"id-{batch}-{i}") for i in range(1000)])
            index.put_many([(key, 490_000, batch * 1000 + i) for i, key in enumerate(keys)])
        took = time.perf_counter() - began
        index.close()
        return took / ids * 1e6, index.sheds
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ids", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    resident, paged = [], []
    for _ in range(args.rounds):
        resident.append(run(args.ids, False)[0])
        paged.append(run(args.ids, True)[0])
    print(json.dumps({
        "ids": args.ids, "module_file": id_index.__file__,
        "resident_us_per_id": [round(x, 2) for x in resident], "paged_us_per_id": [round(x, 2) for x in paged],
        "paged_minus_resident_us_median": round(sorted(paged)[len(paged) // 2] - sorted(resident)[len(resident) // 2], 2),
    }, indent=2))


if __name__ == "__main__":
    main()
