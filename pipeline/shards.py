"""Shards: `--shard K/N` read one way (`pipeline sweep` over a grid's points, `pipeline vnncomp` over a benchmark's
instances): shard K of N holds the items whose index ≡ K (mod N), so the N shards are disjoint, cover every item
and are balanced to within one."""

from __future__ import annotations

from .errors import ConfigError


def parse_shard(text: str) -> tuple[int, int]:
    """`K/N` with 0 ≤ K < N: shard K of N (Slurm array task ids and Kubernetes completion indexes start at 0)."""
    k, sep, n = text.partition("/")
    try:
        shard = int(k), int(n)
    except ValueError:
        shard = (-1, 0)
    if not sep or not 0 <= shard[0] < shard[1]:
        raise ConfigError(f"--shard {text!r} must look like K/N with 0 <= K < N (e.g. --shard 0/4 ... --shard 3/4)")
    return shard


def in_shard(index: int, shard: tuple[int, int]) -> bool:
    """Whether the item at `index` belongs to shard (K, N)."""
    k, n = shard
    return index % n == k
