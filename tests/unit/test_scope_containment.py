"""Key scopes inside other scopes (``batonq.rings.contains``): a key made
within its maker's scopes reaches no queue its maker could not."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from batonq.rings import contains, covers

_CHARS = "ab:*?[]!"
patterns = st.text(alphabet=_CHARS, min_size=1, max_size=6)
names = st.text(alphabet="ab:", min_size=0, max_size=8)


@given(st.lists(patterns, min_size=1, max_size=3), patterns, names)
def test_a_contained_pattern_matches_only_names_the_scopes_cover(
    scopes: list[str], pattern: str, name: str
) -> None:
    if contains(scopes, pattern) and covers([pattern], name):
        assert covers(scopes, name)


def test_what_is_contained_and_what_is_refused() -> None:
    assert contains(["*"], "*")
    assert contains(["shop:*"], "shop:*")
    assert contains(["shop:*"], "shop:eu:*")
    assert contains(["shop:*"], "shop:q?")
    assert contains(["shop:*"], "shop:orders")
    assert contains(["shop:orders", "mail:*"], "shop:orders")
    assert contains(["shop:[ab]"], "shop:a")
    assert not contains(["shop:*"], "*")
    assert not contains(["shop:*"], "s*")
    assert not contains(["shop:*"], "sho?:*")  # only shop:… names, but not said by its text: refused
    assert not contains(["shop:*"], "[s]hop:*")
    assert not contains(["shop:orders"], "shop:*")
    assert not contains(["shop:?"], "shop:*")
