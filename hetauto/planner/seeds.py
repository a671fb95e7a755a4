"""The principles' first guess, the candidates a search starts from, kept inside the space's feature set
(`StrategySpace.allows`): a space told "1F1B only, no ZeRO-1" gets 1F1B, ZeRO-1-off seeds.

Below `search` and the baselines (greedy starts from `seed_candidates` too), so neither imports the other
(`search.baseline_seeds` adds what Metis would pick).
"""

from __future__ import annotations

from hetauto.planner.space import Candidate, StrategySpace


def seed_candidates(space: StrategySpace) -> list[Candidate]:
    """The principles' first guess per microbatch size: every allowed cluster used, the fewest stages whose
    estimated memory fits, the smallest TP, Virtual-1F1B (plain 1F1B where the feature set excludes it) and
    ZeRO-1 off (on only where the set requires it); MCTS starts from these."""
    out = []
    order = max(space.orders(), key=lambda o: [space.spec.cluster(n).device.memory_bytes for n in o])
    per_cluster = max(1, space.num_layers // len(order))
    sched, zero1 = space.default_tail()
    for mbs in space.microbatch_sizes()[:4]:
        choices = []
        for name in order:
            opts = [o for o in space.cluster_options(name, mbs) if 0 < o.stages <= per_cluster]
            plain = [o for o in opts if not o.recompute]
            if not opts:
                break
            choices.append(min(plain or opts, key=lambda o: (o.tp, o.stages)))
        if len(choices) == len(order):
            out.append(Candidate(mbs, order, tuple(choices), sched, zero1, space.resharding,
                                 chunks=space.interleave[0] if sched == "interleaved" and space.interleave else 1))
    return out
