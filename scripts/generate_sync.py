"""Generate src/batonq/client_sync.py from src/batonq/client.py.

The sync client is the async one with the awaits taken out, so the two can
never drift apart. ``--check`` exits 1 when the file on disk is stale.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().parent.parent / "src" / "batonq" / "client.py"
TARGET = SOURCE.with_name("client_sync.py")

HEADER = '''"""Client: the synchronous twin of AsyncClient, with the same methods.

Generated from client.py by scripts/generate_sync.py: do not edit by hand.
"""
'''

# (pattern, replacement), applied in order.
RULES = [
    (r"^import asyncio\n", ""),
    (r"\bAsyncConnectionPool\b", "ConnectionPool"),
    (r"\bAsyncListener\b", "Listener"),
    (r"\bAsyncNoListener\b", "NoListener"),
    (r"\bAsyncWake\b", "Wake"),
    (r"\bAbstractAsyncContextManager\b", "AbstractContextManager"),
    (r"\bpsycopg\.AsyncConnection\b", "psycopg.Connection"),
    (r"\bAsyncIterator\b", "Iterator"),
    (r"\basynccontextmanager\b", "contextmanager"),
    (r"\bAsyncClient\b", "Client"),
    (r"\bconnect_async\b", "connect"),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\basync with\b", "with"),
    (r"\basync def\b", "def"),
    (r"\bawait ", ""),
]


def generate() -> str:
    text = SOURCE.read_text(encoding="utf-8")
    # A line ending in "# sync: <code>" becomes <code>, at the same indent.
    text = re.sub(
        r"^(\s*)\S.*?\s*# sync: (.*)$", lambda m: m[1] + m[2], text, flags=re.MULTILINE
    )
    for pattern, replacement in RULES:
        text = re.sub(pattern, replacement, text, flags=re.MULTILINE)
    return re.sub(r'\A""".*?"""\n', lambda _: HEADER, text, count=1, flags=re.DOTALL)


def main() -> int:
    text = generate()
    if "--check" in sys.argv[1:]:
        if TARGET.read_text(encoding="utf-8") != text:
            print(f"{TARGET} is stale: run python scripts/generate_sync.py", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
