"""Layered drawings of directed acyclic graphs, as coordinates for SVG.

Both the run tree (parent to child) and the queue graph (edges, which the
engine keeps acyclic) are drawn in layers: a node's layer is its longest
path from a source, and the nodes of a layer stand side by side in the
order given.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Drawing", "Placed", "layered"]

N = TypeVar("N", bound=Hashable)

NODE_W, NODE_H = 150, 40
GAP_X, GAP_Y = 30, 60
LABEL_GAP = 150  # between layers drawn left to right: room for an edge's label
PAD = 10


@dataclass(frozen=True, slots=True)
class Placed(Generic[N]):
    node: N
    x: float
    y: float


@dataclass(frozen=True, slots=True)
class Drawing(Generic[N]):
    nodes: list[Placed[N]]
    edges: list[tuple[Placed[N], Placed[N], int]]
    """(from, to, index of the edge in the input)"""
    width: float
    height: float
    node_w: int = NODE_W
    node_h: int = NODE_H


def _layers(nodes: Sequence[N], edges: Sequence[tuple[N, N]]) -> dict[N, int]:
    """Longest path from a source, per node (edges into unknown nodes are ignored)."""
    known = set(nodes)
    incoming: dict[N, list[N]] = {n: [] for n in nodes}
    for a, b in edges:
        if a in known and b in known:
            incoming[b].append(a)
    layer: dict[N, int] = {}

    def depth(node: N, path: frozenset[N]) -> int:
        if node not in layer:
            before = [p for p in incoming[node] if p not in path]  # a cycle cannot loop here
            layer[node] = 1 + max((depth(p, path | {node}) for p in before), default=-1)
        return layer[node]

    for node in nodes:
        depth(node, frozenset())
    return layer


def layered(nodes: Sequence[N], edges: Sequence[tuple[N, N]], *, vertical: bool = True) -> Drawing[N]:
    """Place ``nodes`` in layers: top to bottom (``vertical``) or left to right."""
    layer = _layers(nodes, edges)
    rows: dict[int, list[N]] = {}
    for node in nodes:
        rows.setdefault(layer[node], []).append(node)
    placed: dict[N, Placed[N]] = {}
    for depth, members in rows.items():
        for i, node in enumerate(members):
            along = PAD + i * (NODE_W + GAP_X if vertical else NODE_H + GAP_Y // 2)
            across = PAD + depth * (NODE_H + GAP_Y if vertical else NODE_W + LABEL_GAP)
            placed[node] = Placed(node, along, across) if vertical else Placed(node, across, along)
    drawn = [
        (placed[a], placed[b], i) for i, (a, b) in enumerate(edges) if a in placed and b in placed
    ]
    width = max((p.x for p in placed.values()), default=0) + NODE_W + PAD
    height = max((p.y for p in placed.values()), default=0) + NODE_H + PAD
    return Drawing(list(placed.values()), drawn, width, height)
