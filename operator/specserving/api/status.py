"""The SpecServing status: observed state, written only by the operator through the /status subresource."""

from __future__ import annotations

from dataclasses import dataclass

from specserving.api.fields import field

PHASES = ("Pending", "Building", "Progressing", "Ready", "Degraded", "Rejected", "Failed")


@dataclass
class Condition:
    """One observation of the SpecServing's state, in the Kubernetes API conventions' shape."""

    type: str = field("type of the condition: Admitted, ImageReady, Progressing, PrefillReady, DecodeReady, "
                      "RouterReady, Ready or Degraded.", required=True, max_length=64)
    status: str = field("status is True, False or Unknown.", required=True, enum=("True", "False", "Unknown"))
    reason: str = field("reason is a CamelCase category for the status.", required=True, max_length=128)
    message: str = field("message says what is wrong or what is happening, with names and counts.",
                         required=True, max_length=32768)
    last_transition_time: str = field("lastTransitionTime is when status last changed.", required=True,
                                      max_length=64)
    observed_generation: int | None = field("observedGeneration is the metadata.generation this condition "
                                            "describes.", minimum=0)


@dataclass
class PoolStatus:
    """Observed replicas of one pool."""

    replicas: int | None = field("replicas is the number of replicas that exist.", minimum=0)
    ready_replicas: int | None = field("readyReplicas is the number of replicas whose pods are Ready.", minimum=0)
    updated_replicas: int | None = field("updatedReplicas is the number of replicas on the current template.",
                                         minimum=0)
    desired_replicas: int | None = field("desiredReplicas is spec's replica count as last reconciled.",
                                         minimum=0)
    ready_summary: str | None = field("readySummary is readyReplicas/desiredReplicas, for kubectl get; for a pool "
                                      "whose replicas span nodes, \"2/2 groups (4/4 pods)\".", max_length=64)
    group_size: int | None = field("groupSize is the number of pods (one per node) in each replica of a pool that "
                                   "spans nodes (a LeaderWorkerSet group); absent for one pod per replica.",
                                   minimum=1)
    ready_pods: int | None = field("readyPods is the number of Ready pods of the pool's groups; only with "
                                   "groupSize. A group is ready only when all its pods are.", minimum=0)
    selector: str | None = field("selector is the label selector of the pool's pods, as a string; the scale "
                                 "subresource and HPAs read it.", max_length=1024)


@dataclass
class ImageStatus:
    """The image the pools run."""

    base: str | None = field("base is spec.image.base as last resolved.", max_length=512)
    resolved: str | None = field("resolved is the image the pools run: the base, or the fixed image by digest.",
                                 max_length=1024)
    sglang_version: str | None = field("sglangVersion is the SGLang version the operator resolved.",
                                       max_length=32)
    fix_applied: bool | None = field("fixApplied is true when resolved carries the project's decode-path fix.")
    pd_builders: list[str] | None = field("pdBuilders are the speculative algorithms with a PD-decode builder "
                                          "in resolved, as the capability table or the build probe reported.",
                                          max_items=32, item_max_length=64)
    base_digest: str | None = field("baseDigest is the manifest digest base pointed to when the operator first "
                                    "resolved it (from the base's registry, with spec.image.pullSecrets); the "
                                    "build is keyed by it and pulls the base by it. Absent when the base could "
                                    "not be resolved and the build is keyed by the tag.", max_length=71)
    build_key: str | None = field("buildKey is the content hash (the base's digest, or its reference when it "
                                  "could not be resolved; the algorithm; the fix version; the registry) of the build "
                                  "that produced resolved, or of the build in progress. While buildKey and a "
                                  "resolved digest are recorded here, the operator does not build that image "
                                  "again, even after the build Job's TTL removed the Job.", max_length=64)
    tag: str | None = field("tag is the tag the build pushes, <registry>/sglang-pd:pd-<buildKey>; resolved names "
                            "the same image by digest.", max_length=1024)


@dataclass
class RolloutStatus:
    """A rollout from one PD-contract revision to another, while it runs."""

    from_revision: str | None = field("fromRevision is the revision being replaced.", max_length=256)
    to_revision: str | None = field("toRevision is the revision the spec renders.", max_length=64)
    strategy: str | None = field("strategy is spec.rollout.strategy as this rollout runs it.", max_length=16)
    step: str | None = field("step is ScalingUpNew, ScalingDownOld, SwitchingRouter or DrainingOld "
                             "(docs/rollouts.md).", max_length=32)
    description: str | None = field("description is the step's target, for example the new revision's replicas; "
                                    "`specserving plan` prints the same lines.", max_length=1024)
    serving_revision: str | None = field("servingRevision is the revision the router pairs now.", max_length=64)


@dataclass
class SpecServingStatus:
    """The observed state of a SpecServing."""

    observed_generation: int | None = field("observedGeneration is the metadata.generation last reconciled.",
                                            minimum=0)
    phase: str | None = field("phase summarises the conditions for kubectl get: Pending, Building, "
                              "Progressing, Ready, Degraded, Rejected or Failed.", enum=PHASES)
    endpoint: str | None = field("endpoint is the router Service's in-cluster URL.", max_length=1024)
    conditions: list[Condition] | None = field("conditions are the latest observations, one per type.",
                                               max_items=32, list_type="map", list_map_keys=("type",))
    prefill: PoolStatus | None = field("prefill is the observed prefill pool.")
    decode: PoolStatus | None = field("decode is the observed decode pool; the scale subresource reads "
                                      "decode.replicas and decode.selector.")
    router: PoolStatus | None = field("router is the observed router.")
    image: ImageStatus | None = field("image is the resolved serving image.")
    revision: str | None = field("revision is the PD-contract revision the spec renders: a hash of every field "
                                 "prefill and decode must agree on (docs/rollouts.md). The pools' workloads are "
                                 "named <name>-<role>-<revision>.", max_length=64)
    serving_revision: str | None = field("servingRevision is the revision whose prefill and decode pods the router "
                                         "pairs.", max_length=64)
    rollout: RolloutStatus | None = field("rollout is present while a new revision replaces an old one.")
