"""The tree allreduce's schedule (``ibemu.traffic.collectives``): NCCL's double binary tree and
the pieces of the vector each tree pipelines, checked without a fabric."""

from __future__ import annotations

import itertools
import math

import pytest

from ibemu.traffic.collectives import TREE_MAX_PIECES, Tree, binary_tree, double_tree, tree_pieces


def reach_root(t: Tree, r: int) -> int:
    seen = set()
    while t.parent[r] >= 0:
        assert r not in seen, "a cycle"
        seen.add(r)
        r = t.parent[r]
    return r


def test_binary_tree_by_hand() -> None:
    # n = 8: 0 -> 4; 4 -> 2, 6; 2 -> 1, 3; 6 -> 5, 7 (the in-order tree, rank 0 the root with one child)
    t = binary_tree(8)
    assert t.parent == (-1, 2, 4, 2, 0, 6, 4, 6)
    assert t.children[0] == (4,) and t.children[4] == (2, 6) and t.children[7] == ()
    # n = 6: 5's parent would be 6, beyond the last rank: 4 (5 with its low bit cleared)
    assert binary_tree(6).parent == (-1, 2, 4, 2, 0, 4)
    assert binary_tree(1).parent == (-1,)


def test_double_tree_by_hand() -> None:
    t0, t1 = double_tree(4)  # even: mirrored, the root of tree 1 is rank 3
    assert t0.parent == (-1, 2, 0, 2) and t1.parent == (1, 3, 1, -1)
    t0, t1 = double_tree(3)  # odd: shifted by one
    assert t0.parent == (-1, 2, 0) and t1.parent == (1, -1, 0)
    t0, t1 = double_tree(2)
    assert t0.parent == (-1, 0) and t1.parent == (1, -1)


@pytest.mark.parametrize("n", range(2, 70))
def test_double_tree_shape(n: int) -> None:
    trees = double_tree(n)
    for t in trees:
        assert t.parent.count(-1) == 1
        assert all(reach_root(t, r) == t.root for r in range(n))  # one tree, no cycle
        assert all(len(c) <= 2 for c in t.children)
        assert t.depth() <= math.ceil(math.log2(n)) + 1
        for r in range(n):
            if t.parent[r] >= 0:
                assert t.children[t.parent[r]][t.slot(r)] == r
    # a rank sends at most two halves down over both trees (rank 0 of an odd n: one in each)
    both = [r for r in range(n) if trees[0].children[r] and trees[1].children[r]]
    assert both == ([0] if n % 2 else [])
    assert all(len(trees[0].children[r]) + len(trees[1].children[r]) <= 2 for r in range(n))
    assert trees[0].root != trees[1].root


def test_pieces_cover_each_half_in_order() -> None:
    a, b = tree_pieces(1000, chunk_bytes=400)  # 100 elements a piece
    assert a == [(0, 100), (100, 200), (200, 300), (300, 400), (400, 500)]
    assert b[0] == (500, 600) and b[-1] == (900, 1000)
    a, b = tree_pieces(3, chunk_bytes=4)
    assert a == [(0, 1)] and b == [(1, 2), (2, 3)]


def test_pieces_grow_beyond_the_chunk_for_large_vectors() -> None:
    count = 50_000_000
    for half in tree_pieces(count):
        assert len(half) <= TREE_MAX_PIECES
        assert all(lo < hi for lo, hi in half)
        assert all(x[1] == y[0] for x, y in itertools.pairwise(half))
    assert tree_pieces(count)[0][-1][1] == count // 2 and tree_pieces(count)[1][-1][1] == count
