"""The rollout planner: from what runs now to the next placement of prefill and decode replicas per PD-contract
revision, and which revision the router pairs.

Pure and level-based: `decide` reads only the observed state (each revision's replicas, Ready replicas and pods,
and the router's revision), so an operator that restarts mid-rollout takes the same next step. `plan` runs
`decide` on a simulated cluster where every step completes, which is what `specserving plan` prints and what a
rollout's steps are when nothing fails (docs/rollouts.md has the step tables).

The invariants (tests/unit/test_rollout.py checks them over random states):
- the router pairs exactly one revision; it moves to the new one only when each role of the new revision has as
  many Ready replicas as the serving one runs (or all it wants);
- before that switch the serving revision keeps at least one replica of each role it had;
- a revision the router leaves is drained (replicas 0, pods gone) and then deleted;
- Stepped never runs more than `maxSurge` replicas per role beyond the larger of the two revisions' wanted counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from specserving.api.naming import DECODE, PREFILL
from specserving.api.types import RolloutSpec

ROLES = (PREFILL, DECODE)

SURGE = "Surge"
STEPPED = "Stepped"

# Steps (status.rollout.step, the Progressing reason while a rollout runs, and the event reason).
SCALING_UP_NEW = "ScalingUpNew"  # the new revision gets replicas (all of them under Surge, maxSurge more under Stepped)
SCALING_DOWN_OLD = "ScalingDownOld"  # Stepped: the serving revision gives back what the new one now holds Ready
SWITCHING_ROUTER = "SwitchingRouter"  # the router is rolled to pair the new revision (new router pod Ready first)
DRAINING_OLD = "DrainingOld"  # the old revision goes to 0, its pods drain, its workloads are deleted
STEPS = (SCALING_UP_NEW, SCALING_DOWN_OLD, SWITCHING_ROUTER, DRAINING_OLD)


@dataclass(frozen=True, slots=True)
class Pools:
    """One revision's prefill and decode workloads as observed."""

    replicas: Mapping[str, int]  # spec.replicas per role
    ready: Mapping[str, int] = field(default_factory=dict)
    pods: int = 0  # pods of the revision that still exist, terminating ones included

    def get(self, role: str) -> int:
        return int(self.replicas.get(role, 0))

    def ready_of(self, role: str) -> int:
        return int(self.ready.get(role, 0))


@dataclass(frozen=True, slots=True)
class Router:
    """The router Deployment as observed: the revision its pod template pairs, and whether its own rollout is
    done (every router pod runs that template and is Ready). revision None: there is no router Deployment."""

    revision: str | None
    settled: bool = True


@dataclass(frozen=True, slots=True)
class Strategy:
    """spec.rollout: Surge (max_surge None: the whole new revision first) or Stepped (max_surge replicas a step)."""

    max_surge: int | None = None

    @property
    def name(self) -> str:
        return SURGE if self.max_surge is None else STEPPED

    @classmethod
    def of(cls, rollout: RolloutSpec) -> Strategy:
        """The strategy spec.rollout asks for (maxSurge only counts under Stepped)."""
        return cls(None if rollout.strategy == SURGE else rollout.max_surge)


@dataclass(frozen=True, slots=True)
class Decision:
    """What to apply next."""

    replicas: dict[str, dict[str, int]]  # revision -> role -> replicas; revisions absent here are left as they are
    delete: frozenset[str]  # revisions whose workloads are deleted now (drained)
    router: str  # the revision the router's pod template pairs
    serving: str | None  # the revision the router pairs now (None before anything serves)
    source: str | None = None  # the revision being replaced, while a rollout runs
    step: str | None = None  # None: no rollout is running
    description: str = ""  # the step's target, stable while the step runs

    @property
    def rolling(self) -> bool:
        return self.step is not None


def shown(revision: str | None) -> str:
    """A revision as messages print it: workloads from before revisions have none."""
    return revision or "(unrevisioned)"


def _counts(replicas: Mapping[str, int]) -> str:
    return ", ".join(f"{role} {int(replicas.get(role, 0))}" for role in ROLES)


def _zeros() -> Pools:
    return Pools({role: 0 for role in ROLES})


def decide(target: str, wanted: Mapping[str, int], strategy: Strategy, pools: Mapping[str, Pools],
           router: Router) -> Decision:
    """The next placement for a SpecServing whose spec renders revision `target` with `wanted` replicas per role,
    given each existing revision's `pools` and the `router`."""
    wanted = {role: int(wanted.get(role, 0)) for role in ROLES}
    others = {rev: p for rev, p in pools.items() if rev != target}
    serving = router.revision if router.revision is not None and router.revision != target \
        and router.revision in pools else None
    if serving is None:
        return _after_switch(target, wanted, pools, others, router)
    replicas: dict[str, dict[str, int]] = {}
    delete: set[str] = set()
    # A revision that is neither serving nor the target never served (a change replaced it mid-rollout): it goes.
    for rev, p in others.items():
        if rev != serving:
            _drain(rev, p, replicas, delete)
    old, new = pools[serving], pools.get(target, _zeros())
    live = [role for role in ROLES if wanted[role] > 0]

    def step(name: str, description: str, router_rev: str = serving) -> Decision:
        return Decision(replicas, frozenset(delete), router_rev, serving, shown(serving), name, description)

    if any(new.ready_of(role) < new.get(role) for role in ROLES):  # the last step up is not Ready yet
        replicas[target] = {role: new.get(role) for role in ROLES}
        return step(SCALING_UP_NEW, f"revision {shown(target)} to {_counts(replicas[target])}")
    if all(new.ready_of(role) >= max(1, min(wanted[role], old.get(role))) for role in live):
        replicas[target] = {role: new.get(role) for role in ROLES}
        return step(SWITCHING_ROUTER, f"router from revision {shown(serving)} to {shown(target)}", target)
    down = {role: min(old.get(role), max(1 if old.get(role) else 0, wanted[role] - new.ready_of(role)))
            for role in ROLES}
    if any(down[role] < old.get(role) for role in ROLES):
        replicas[serving] = down
        replicas[target] = {role: new.get(role) for role in ROLES}
        return step(SCALING_DOWN_OLD, f"revision {shown(serving)} to {_counts(down)}")
    surge = strategy.max_surge
    up = {role: wanted[role] if surge is None else
          min(wanted[role], max(new.get(role), max(wanted[role], old.get(role)) + surge - old.get(role)))
          for role in ROLES}
    up = {role: max(up[role], new.get(role)) for role in ROLES}
    replicas[target] = up
    return step(SCALING_UP_NEW, f"revision {shown(target)} to {_counts(up)}")


def _drain(rev: str, p: Pools, replicas: dict[str, dict[str, int]], delete: set[str]) -> None:
    if p.pods == 0 and all(p.get(role) == 0 for role in ROLES):
        delete.add(rev)
    else:
        replicas[rev] = {role: 0 for role in ROLES}


def _after_switch(target: str, wanted: dict[str, int], pools: Mapping[str, Pools], others: Mapping[str, Pools],
                  router: Router) -> Decision:
    """The router pairs the target (or nothing serves yet): the target gets what the spec wants, and every
    other revision drains, once the router no longer runs a pod that pairs it."""
    replicas: dict[str, dict[str, int]] = {target: dict(wanted)}
    delete: set[str] = set()
    if not others:
        return Decision(replicas, frozenset(), target, target if target in pools else None)
    source = ", ".join(shown(rev) for rev in sorted(others))
    if router.revision == target and not router.settled:
        new = pools.get(target, _zeros())
        replicas[target] = {role: new.get(role) for role in ROLES}
        # Router pods of both revisions answer until the router's own rollout ends; each pairs only its own.
        old = sorted(others)[0] if len(others) == 1 else None
        return Decision(replicas, frozenset(), target, old, source, SWITCHING_ROUTER,
                        f"router from revision {source} to {shown(target)}")
    for rev, p in others.items():
        _drain(rev, p, replicas, delete)
    return Decision(replicas, frozenset(delete), target, target, source, DRAINING_OLD,
                    f"revision {source} drained and deleted; revision {shown(target)} to {_counts(wanted)}")


@dataclass(frozen=True, slots=True)
class PlannedStep:
    step: str
    description: str
    # The replicas per revision and the router's revision once the step is applied.
    replicas: dict[str, dict[str, int]]
    router: str


def plan(source: str | None, source_replicas: Mapping[str, int], target: str, wanted: Mapping[str, int],
         strategy: Strategy, limit: int = 200) -> list[PlannedStep]:
    """The steps from `source` (serving with `source_replicas`; None: nothing runs) to `target`, when every step
    completes: pods become Ready, the router's rollout finishes, drained pods go."""
    if source == target:
        return []
    pools: dict[str, Pools] = {}
    router = Router(None)
    if source is not None:
        pools[source] = Pools(dict(source_replicas), dict(source_replicas), sum(source_replicas.values()))
        router = Router(source)
    steps: list[PlannedStep] = []
    for _ in range(limit):
        d = decide(target, wanted, strategy, pools, router)
        if not d.rolling:
            return steps
        if not steps or (steps[-1].step, steps[-1].description) != (d.step, d.description):
            assert d.step is not None
            steps.append(PlannedStep(d.step, d.description, {r: dict(v) for r, v in d.replicas.items()}, d.router))
        for rev, counts in d.replicas.items():
            pools[rev] = Pools(dict(counts), dict(counts), sum(counts.values()))
        for rev in d.delete:
            pools.pop(rev, None)
        router = Router(d.router)
    raise RuntimeError(f"rollout from {source} to {target} did not finish in {limit} steps")  # a planner bug
