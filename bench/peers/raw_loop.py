"""The raw claim/complete loop as a process: ``bench_core.py``'s baseline
(a plain table, ``UPDATE ... FOR UPDATE SKIP LOCKED`` then an ``UPDATE``
marking the batch done, one connection) until nothing is left.

python raw_loop.py BATCH           # $BENCH_DSN; prints the tasks it did
"""

from __future__ import annotations

import os
import sys

from batonq.benchmark import Baseline


def main(batch: int) -> None:
    raw = Baseline(os.environ["BENCH_DSN"])
    raw.open(1)
    try:
        total = 0
        while done := raw.claim_complete(0, batch):
            total += done
        print(total)
    finally:
        raw.close()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(int(sys.argv[1]))
