"""Condition types, condition reasons and event reasons: every CamelCase word the operator reports, in one place."""

from __future__ import annotations

# Condition types.
ADMITTED = "Admitted"
IMAGE_READY = "ImageReady"
PROGRESSING = "Progressing"
PREFILL_READY = "PrefillReady"
DECODE_READY = "DecodeReady"
ROUTER_READY = "RouterReady"
READY = "Ready"
DEGRADED = "Degraded"
SERVING_VERIFIED = "ServingVerified"
CONDITION_TYPES = (ADMITTED, IMAGE_READY, PROGRESSING, PREFILL_READY, DECODE_READY, ROUTER_READY, READY, DEGRADED,
                   SERVING_VERIFIED)

# Admitted.
ACCEPTED = "Accepted"  # the spec passed validation (warnings, if any, are in the message)
INVALID_SPEC = "InvalidSpec"  # the spec slipped past admission but validation refuses it: no children

# ImageReady (plus NOT_ADMITTED, IMAGE_LACKS_BUILDER and APPLY_FAILED).
NOT_NEEDED = "NotNeeded"  # the base image has its own PD-decode builder for the algorithm: the pools run it
BUILDING = "Building"  # the fixed image is being built; no pool is started until it is pushed
BUILT = "Built"  # the fixed image was built and pushed; the pools run it by digest
BUILD_FAILED = "BuildFailed"  # the build (or its probe) failed: the message carries the end of its log
REGISTRY_MISSING = "RegistryMissing"  # a build is needed but no registry is configured
BASE_UNRESOLVED = "BaseUnresolved"  # the base's registry cannot say what its tag points to (also a Warning event)

# PrefillReady / DecodeReady / RouterReady.
REPLICAS_READY = "ReplicasReady"
REPLICAS_NOT_READY = "ReplicasNotReady"
SCALED_TO_ZERO = "ScaledToZero"
WORKLOAD_MISSING = "WorkloadMissing"  # the pool's Deployment/LeaderWorkerSet does not exist (yet)
NOT_ADMITTED = "NotAdmitted"

# Progressing.
ROLLING_OUT = "RollingOut"
ROLLOUT_COMPLETE = "RolloutComplete"
PROGRESS_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"
# A rollout's new revision has a pod the scheduler cannot place (no spare GPU node for a surge): the old revision
# keeps serving. While a rollout runs, Progressing's reason is otherwise its step (rollout.STEPS).
NEW_REVISION_UNSCHEDULABLE = "NewRevisionUnschedulable"

# Ready (plus INVALID_SPEC, DEPENDENCY_MISSING, APPLY_FAILED).
ALL_POOLS_READY = "AllPoolsReady"
POOLS_NOT_READY = "PoolsNotReady"

# Shared by Progressing and Ready.
DEPENDENCY_MISSING = "DependencyMissing"  # a CRD a child needs (LeaderWorkerSet, ServiceMonitor) is not installed
APPLY_FAILED = "ApplyFailed"  # the API server refused a child
IMAGE_LACKS_BUILDER = "ImageLacksBuilder"  # admitted, but the image (base or built) would crash the first decode
# The API server's dry run refuses a rendered child (KServe's InvalidRenderedConfig): nothing of the rendering is
# applied, and the message names the child and the API server's words.
INVALID_RENDERED_CONFIG = "InvalidRenderedConfig"

# Degraded.
CRASH_LOOP_BACK_OFF = "CrashLoopBackOff"
CONTAINER_FAILED = "ContainerFailed"
IMAGE_PULL_FAILED = "ImagePullFailed"
POD_FAILED = "PodFailed"
# The API server refuses to create a pool's or the router's pods: the namespace's Pod Security level is too low
# for them (the message names the level they need), or another admission rule (a quota, a LimitRange) refuses them.
POD_SECURITY_REFUSED = "PodSecurityRefused"
PODS_NOT_CREATED = "PodsNotCreated"
NO_FAILURES = "NoFailures"

# ServingVerified (reconcile/serving.py).
WAITING_FOR_READY = "WaitingForReady"  # checked once the SpecServing is Ready
CHECKING = "Checking"  # the request of this rollout is on its way
REQUEST_SERVED = "RequestServed"  # the router answered a generate request that took a prefill and a decode pod
REQUEST_FAILED = "RequestFailed"  # the router answered with an error (no worker, a failed engine, ...)
ROUTER_UNREACHABLE = "RouterUnreachable"  # no answer from the router Service at all

# Events on actions (condition transitions use the condition's own reason).
CHILDREN_APPLIED = "ChildrenApplied"
CHILD_APPLY_FAILED = "ChildApplyFailed"
CHILD_PRUNED = "ChildPruned"
DRIFT_REPAIRED = "DriftRepaired"
DELETION_COST_SET = "DeletionCostSet"
BUILD_STARTED = "BuildStarted"  # the build Job was created

# Reasons that are bad news: their events are Warnings.
WARNING_REASONS = frozenset({
    INVALID_SPEC, DEPENDENCY_MISSING, APPLY_FAILED, IMAGE_LACKS_BUILDER, INVALID_RENDERED_CONFIG, BUILD_FAILED,
    REGISTRY_MISSING,
    PROGRESS_DEADLINE_EXCEEDED, NEW_REVISION_UNSCHEDULABLE,
    CRASH_LOOP_BACK_OFF, CONTAINER_FAILED, IMAGE_PULL_FAILED, POD_FAILED, CHILD_APPLY_FAILED, POD_SECURITY_REFUSED,
    PODS_NOT_CREATED,
    REQUEST_FAILED, ROUTER_UNREACHABLE,
})
