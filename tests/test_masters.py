"""The audit under sharding: snapshots split across processes (by parameter, as `spade update` keeps
them; by flat element ranges, as ZeRO partitions them; with the shape-[0] stubs ZeRO-3 leaves in
the module) give the same figures as the whole model in one process."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


def _snapshots(seed: int = 0) -> tuple[dict, dict, dict, dict]:
    import torch

    g = torch.Generator().manual_seed(seed)
    shapes = {"embed": (64, 16), "q": (16, 16), "norm": (16,), "head": (32, 16)}
    m_b = {k: torch.randn(*s, generator=g) for k, s in shapes.items()}
    # an update mostly below bf16's resolution, a few elements well above it
    m_a = {k: v + 1e-4 * torch.randn(v.shape, generator=g) + (torch.rand(v.shape, generator=g) < 0.05) * 0.1
           for k, v in m_b.items()}
    s_b = {k: v.to(torch.bfloat16) for k, v in m_b.items()}
    s_a = {k: v.to(torch.bfloat16) for k, v in m_a.items()}
    return s_b, m_b, m_a, s_a


def _flat_shard(t, rank: int, world: int):
    flat = t.reshape(-1)
    per = -(-flat.numel() // world)
    return flat[rank * per:(rank + 1) * per]


def test_sums_of_element_partitions_equal_the_whole() -> None:
    from spade_cli.training import masters, trainer_state

    snaps = _snapshots()
    whole = trainer_state.audit(*snaps)
    assert whole["elements"] == 64 * 16 + 16 * 16 + 16 + 32 * 16
    assert 0 < whole["changed_fraction"] < 1 and 0 < whole["rounding_lost_fraction"] < 1
    # 3 processes over 16 elements of "norm": the last process gets an empty slice
    for world in (2, 3, 7):
        total = [0.0] * len(masters.SUMS)
        for rank in range(world):
            part = [{k: _flat_shard(v, rank, world) for k, v in s.items()} for s in snaps]
            total = [a + b for a, b in zip(total, masters.sums(*part), strict=True)]
        assert masters.figures(total) == pytest.approx(whole, rel=1e-9), world


def test_stubs_and_parameters_owned_elsewhere_add_nothing() -> None:
    """A ZeRO-3 process sees shape-[0] parameters; `spade update` keeps only the parameters it owns.
    Neither raises, and the reduced sums are the single-process figures."""
    import torch

    from spade_cli.training import masters, trainer_state

    snaps = _snapshots(1)
    whole = trainer_state.audit(*snaps)
    keys = list(snaps[0])
    total = [0.0] * len(masters.SUMS)
    for rank in range(2):
        mine = [k for i, k in enumerate(keys) if i % 2 == rank]
        # what this process's module held of the others before the update: ZeRO-3's empty stubs;
        # the snapshots after the update are gathered in full on every process
        part = [{k: (v if k in mine or n >= 2 else torch.empty(0, dtype=v.dtype)) for k, v in s.items()}
                for n, s in enumerate(snaps)]
        total = [a + b for a, b in zip(total, masters.sums(*part), strict=True)]
    assert masters.figures(total) == pytest.approx(whole, rel=1e-9)
    # keys missing from a share (the snapshot keeps owned parameters only) add nothing either
    only_q = [{k: v for k, v in s.items() if k == "q"} for s in snaps]
    assert masters.sums(*only_q)[1] == 16 * 16


def test_mismatched_shards_are_refused() -> None:
    from spade_cli.training import masters

    s_b, m_b, m_a, s_a = _snapshots()
    bad = {**m_a, "q": m_a["q"][:3]}
    with pytest.raises(ValueError, match="snapshots of q hold different elements"):
        masters.sums(s_b, m_b, bad, s_a)


def test_without_master_before_the_served_weights_stand_in() -> None:
    """A fresh start has no trainer state: the input's served weights are the masters before."""
    from spade_cli.training import trainer_state

    s_b, _, m_a, s_a = _snapshots()
    fresh = trainer_state.audit(s_b, None, m_a, s_a)
    assert fresh["elements"] > 0 and fresh["master_update_l2"] > 0
