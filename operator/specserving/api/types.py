"""The SpecServing spec as typed dataclasses: every field's JSON name, doc, default and bound live here.

The CRD in crds/ is generated from these classes (`specserving crd`), and a test regenerates it and fails on
any difference. Descriptions open with the JSON name and say what the field controls, its default and what
changing it does, so `kubectl explain` is useful.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from specserving.api.fields import CelRule, RawObject, StringMap, field
from specserving.api.naming import DECODE, PREFILL

ALGORITHMS = ("DSPARK", "DFLASH", "EAGLE", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM", "UNO")
TRANSFER_BACKENDS = ("mooncake", "mooncake_tcp", "nixl")
NETWORK_MODES = ("HostNetwork", "Multus")
BUILD_POLICIES = ("IfNeeded", "Never")
SPECULATION_MODES = ("Enabled", "Disabled")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
ROUTER_POLICIES = ("cache_aware", "round_robin", "random", "power_of_two")
ROLLOUT_STRATEGIES = ("Surge", "Stepped")
ROUTER_IMPLEMENTATIONS = ("sglang-router", "smg")
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer")

_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_FLAG_VALUE = r"^[A-Za-z0-9_.:/-]+$"
_VERSION = r"^[0-9]+\.[0-9]+\.[0-9]+(\.post[0-9]+)?$"
_FRACTION = r"^(0?\.[0-9]{1,4}|1(\.0{1,4})?)$"


@dataclass
class LocalObjectReference:
    """A reference to an object in the SpecServing's namespace."""

    name: str = field("name of the referenced object, in the SpecServing's namespace.", required=True,
                      max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


@dataclass
class PersistentVolumeClaimSource:
    """The model lives on a PersistentVolumeClaim."""

    claim_name: str = field("claimName is the PersistentVolumeClaim that holds the model.", required=True,
                            max_length=253, pattern=_NAME)
    read_only: bool = field("readOnly mounts the claim read-only. Default true: serving never writes weights.",
                            default=True)


@dataclass
class HostPathSource:
    """The model lives on every GPU node's local disk."""

    path: str = field("path on the node that holds the model, for example /data2.", required=True,
                      max_length=4096, pattern=r"^/")
    type: str = field("type is the hostPath type check. Default Directory: the pod fails to start, with a clear "
                      "event, on a node that lacks the folder.", default="Directory",
                      enum=("Directory", "DirectoryOrCreate", ""))


@dataclass
class NFSSource:
    """The model lives on an NFS export."""

    server: str = field("server is the NFS server's host name or address.", required=True, max_length=253)
    path: str = field("path is the exported path.", required=True, max_length=4096, pattern=r"^/")
    read_only: bool = field("readOnly mounts the export read-only. Default true.", default=True)


@dataclass
class ModelVolume:
    """Where the model files come from. Set exactly one of persistentVolumeClaim, hostPath or nfs."""

    CEL: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            rule="[has(self.persistentVolumeClaim), has(self.hostPath), has(self.nfs)]"
            ".filter(x, x).size() == 1",
            message="set exactly one of persistentVolumeClaim, hostPath or nfs",
        ),
    )

    mount_path: str = field("mountPath is where the volume is mounted in the serving containers; model.path "
                            "must lie below it.", required=True, max_length=4096, pattern=r"^/")
    persistent_volume_claim: PersistentVolumeClaimSource | None = field(
        "persistentVolumeClaim mounts a claim in the SpecServing's namespace.")
    host_path: HostPathSource | None = field(
        "hostPath mounts a folder of each GPU node. Simple on bare-metal clusters; needs the baseline Pod "
        "Security level to be relaxed (see docs/security.md).")
    nfs: NFSSource | None = field("nfs mounts an NFS export.")


@dataclass
class ModelSpec:
    """The model to serve."""

    CEL: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            rule="!has(self.volume) || self.path.startsWith(self.volume.mountPath)",
            message="path must lie below volume.mountPath",
            field_path=".path",
        ),
    )

    path: str = field("path is the model folder inside the container (SGLang --model-path), for example "
                      "/data2/DeepSeek-V4-Flash-DSpark.", required=True, max_length=4096)
    served_model_name: str | None = field("servedModelName is the name clients use in requests "
                                          "(--served-model-name). Default: SGLang derives it from path.",
                                          max_length=253)
    trust_remote_code: bool = field("trustRemoteCode lets SGLang run the model repository's own Python code "
                                    "(--trust-remote-code). DeepSeek-class models need it. Default false.",
                                    default=False)
    volume: ModelVolume | None = field("volume mounts the storage that holds the model. Omit it when the "
                                       "image already contains the model.")


@dataclass
class BuildSpec:
    """Whether and where the operator builds a serving image that carries the fixed PD decode path."""

    policy: str = field(
        "policy says whether the operator may build images/sglang-pd on top of image.base. IfNeeded (default): "
        "when the base image's SGLang version lacks the PD-decode builder for speculative.algorithm and the "
        "project's fix supplies it, the operator builds the fixed image and deploys it by digest. Never: the "
        "base image is used as-is, and only the builders that its own SGLang version has count.",
        default="IfNeeded", enum=BUILD_POLICIES)
    registry: str | None = field("registry is the repository the built image is pushed to, for example "
                                 "registry.example.com/ml/sglang-pd. Default: the operator's configured registry.",
                                 max_length=512, pattern=r"^[a-z0-9]([-a-z0-9._:/]*[a-z0-9])?$")
    push_secret_ref: LocalObjectReference | None = field(
        "pushSecretRef names a kubernetes.io/dockerconfigjson Secret with push rights to registry. The "
        "operator mounts it into the build Job only and never copies or logs it.")


@dataclass
class ImageSpec:
    """The SGLang serving image."""

    base: str = field("base is the SGLang image the pools run, for example lmsysorg/sglang:v0.5.23-cu129. When "
                      "the fixed decode path is needed, it is the base of the image the operator builds.",
                      required=True, max_length=512, pattern=r"^[^\s]+$")
    sglang_version: str | None = field(
        "sglangVersion is the SGLang version inside base, for example 0.5.16. Default: read from the image tag "
        "(v0.5.16-cu129 means 0.5.16). Set it when the tag does not say; an unknown version gets a warning and "
        "the build probe decides.", max_length=32, pattern=_VERSION)
    pull_policy: str = field("pullPolicy for every container. Default IfNotPresent.", default="IfNotPresent",
                             enum=PULL_POLICIES)
    pull_secrets: list[LocalObjectReference] | None = field(
        "pullSecrets are the Secrets used to pull base and the built image.", max_items=16)
    build: BuildSpec = field("build controls whether the operator builds the fixed-decode-path image.",
                             default_factory=BuildSpec)


@dataclass
class MetricsSpec:
    """SGLang's Prometheus metrics."""

    enabled: bool = field("enabled turns on SGLang's /metrics (--enable-metrics). Default true.", default=True)
    cache_report: bool = field("cacheReport adds prefix-cache hit counts to responses and metrics "
                               "(--enable-cache-report). Default false.", default=False)
    service_monitor: bool = field("serviceMonitor renders a Prometheus Operator ServiceMonitor for each pool. "
                                  "Needs the monitoring.coreos.com CRDs. Default false.", default=False)


@dataclass
class RequestLoggingSpec:
    """SGLang request logging."""

    enabled: bool = field("enabled logs every request (--log-requests). Default false.", default=False)
    level: int = field("level is SGLang's --log-requests-level: 0 logs metadata only, higher levels log inputs "
                       "and outputs. Default 0.", default=0, minimum=0, maximum=3)


@dataclass
class EngineSpec:
    """SGLang engine settings shared by the prefill and decode pools."""

    tp: int = field("tp is the tensor-parallel size of one replica (--tp-size): the GPUs one replica uses, "
                    "over nodesPerReplica nodes. Default 8, one 8-GPU node.", default=8, minimum=1, maximum=64)
    dp: int = field("dp is the data-parallel size inside one replica (--dp-size). With enableDpAttention it must "
                    "divide tp. Default 8.", default=8, minimum=1, maximum=64)
    enable_dp_attention: bool = field("enableDpAttention runs attention data-parallel across the dp ranks "
                                      "(--enable-dp-attention). Default true, as in the seed deployment.",
                                      default=True)
    enable_dp_lm_head: bool = field("enableDpLmHead shards the LM head across dp ranks (--enable-dp-lm-head). "
                                    "DSPARK and DFLASH under DP attention require it. Default true.", default=True)
    moe_a2a_backend: str | None = field("moeA2aBackend is SGLang's --moe-a2a-backend, for example none. "
                                        "Default: SGLang's own (none).", max_length=64, pattern=_FLAG_VALUE)
    moe_runner_backend: str | None = field("moeRunnerBackend is SGLang's --moe-runner-backend, for example "
                                           "flashinfer_mxfp4. Default: SGLang's own.", max_length=64,
                                           pattern=_FLAG_VALUE)
    mem_fraction_static: str | None = field("memFractionStatic is the fraction of GPU memory for weights and KV "
                                            "cache (--mem-fraction-static), as a quoted decimal such as \"0.8\". "
                                            "Default: SGLang's own.", max_length=8, pattern=_FRACTION)
    max_running_requests: int | None = field("maxRunningRequests caps concurrent requests per replica "
                                             "(--max-running-requests). Default: SGLang's own.", minimum=1,
                                             maximum=1_000_000)
    chunked_prefill_size: int | None = field("chunkedPrefillSize is the prefill chunk in tokens "
                                             "(--chunked-prefill-size). Passed to the prefill pool only; decode "
                                             "does not prefill. Default: SGLang's own.", minimum=-1,
                                             maximum=10_000_000)
    tool_call_parser: str | None = field("toolCallParser is SGLang's --tool-call-parser, for example deepseekv4.",
                                         max_length=64, pattern=_FLAG_VALUE)
    reasoning_parser: str | None = field("reasoningParser is SGLang's --reasoning-parser, for example "
                                         "deepseek-v4.", max_length=64, pattern=_FLAG_VALUE)
    disable_flashinfer_autotune: bool = field("disableFlashinferAutotune skips FlashInfer's start-up autotuning "
                                              "(--disable-flashinfer-autotune). Default false.", default=False)
    port: int = field("port is the SGLang HTTP port of every prefill and decode pod (--port). One port for "
                      "both pools because the router's service discovery probes a single port. Default 30000.",
                      default=30000, minimum=1024, maximum=65535)
    metrics: MetricsSpec = field("metrics configures SGLang's Prometheus metrics.", default_factory=MetricsSpec)
    request_logging: RequestLoggingSpec = field("requestLogging configures SGLang's request log.",
                                                default_factory=RequestLoggingSpec)
    env: list[RawObject] | None = field("env adds environment variables (Kubernetes EnvVar objects) to both "
                                        "pools' serving containers. Names the operator sets (SGLANG_HOST_IP, "
                                        "SGLANG_RAGGED_VERIFY_MODE...) are refused.", max_items=64)
    extra_args: list[str] | None = field("extraArgs are appended to both pools' SGLang command lines. Flags the "
                                         "operator renders from a field (--disaggregation-mode, --port, "
                                         "--tp-size, --moe-a2a-backend...) and --config are refused.",
                                         max_items=64, item_max_length=1024)


@dataclass
class SpeculativeSpec:
    """Speculative decoding."""

    CEL: ClassVar[tuple[CelRule, ...]] = (
        # has(): the API server also checks rules against the schema default {} of speculative.
        CelRule(rule="!has(self.algorithm) || self.algorithm != 'DFLASH' || has(self.draftModelPath)",
                message="DFLASH needs a draft model: set draftModelPath (SGLang refuses to start without one)",
                field_path=".draftModelPath"),
        CelRule(rule="!has(self.blockSize) || self.algorithm == 'DSPARK' || self.algorithm == 'DFLASH'",
                message="blockSize applies to DSPARK and DFLASH only: remove it", field_path=".blockSize"),
        CelRule(rule="self.algorithm != 'DFLASH' || !has(self.blockSize) || !has(self.numDraftTokens) || "
                     "self.blockSize == self.numDraftTokens",
                message="DFLASH needs numDraftTokens equal to blockSize (SGLang refuses to start otherwise)",
                field_path=".numDraftTokens"),
        # Measured in each release's ServerArgs (tests/decode_path/test_server_args.py): DSPARK verifies gamma + 1
        # tokens, where gamma is --speculative-dspark-block-size.
        CelRule(rule="self.algorithm != 'DSPARK' || !has(self.blockSize) || !has(self.numDraftTokens) || "
                     "self.numDraftTokens == self.blockSize + 1",
                message="DSPARK needs numDraftTokens equal to blockSize + 1 (SGLang refuses to start otherwise)",
                field_path=".numDraftTokens"),
    )

    algorithm: str = field(
        "algorithm is SGLang's --speculative-algorithm. Only algorithms with a PD-decode draft-input builder in "
        "the image's SGLang version are admitted (see docs/decode-path.md); others crash the first decode. "
        "Default DSPARK.", default="DSPARK", enum=ALGORITHMS)
    draft_model_path: str | None = field("draftModelPath is the draft model (--speculative-draft-model-path). "
                                         "Default: SGLang's own (the target model's built-in draft head).",
                                         max_length=4096)
    num_steps: int | None = field("numSteps is --speculative-num-steps. Default: SGLang's own.", minimum=1,
                                  maximum=64)
    eagle_topk: int | None = field("eagleTopk is --speculative-eagle-topk. Default: SGLang's own.", minimum=1,
                                   maximum=64)
    num_draft_tokens: int | None = field("numDraftTokens is --speculative-num-draft-tokens. Default: SGLang's "
                                         "own.", minimum=1, maximum=1024)
    block_size: int | None = field("blockSize is the draft block of DSPARK (--speculative-dspark-block-size) or "
                                   "DFLASH (--speculative-dflash-block-size); other algorithms refuse it. For "
                                   "DFLASH, SGLang requires numDraftTokens to equal it when both are set. "
                                   "Default: SGLang's own.", minimum=1, maximum=1024)


@dataclass
class NetworkSpec:
    """How pool pods reach each other for KV transfer."""

    CEL: ClassVar[tuple[CelRule, ...]] = (
        # has(self.mode): the API server checks the rules against the schema default {} of network, whose own
        # nested default (mode: HostNetwork) is not applied there.
        CelRule(rule="!has(self.mode) || self.mode != 'Multus' || "
                     "(has(self.multusNetworks) && self.multusNetworks.size() > 0)",
                message="mode Multus needs at least one entry in multusNetworks", field_path=".multusNetworks"),
        CelRule(rule="(has(self.mode) && self.mode != 'HostNetwork') || !has(self.multusNetworks) || "
                     "self.multusNetworks.size() == 0",
                message="multusNetworks is only used with mode Multus", field_path=".multusNetworks"),
    )

    mode: str = field(
        "mode is HostNetwork (default) or Multus. HostNetwork puts pool pods on the node's network, so Mooncake "
        "reaches the RDMA NICs and peers exactly as in a bare-metal deployment; it needs a privileged or "
        "baseline-exempt namespace and unique ports per node. Multus keeps pod networking and attaches the "
        "RDMA secondary networks named in multusNetworks.", default="HostNetwork", enum=NETWORK_MODES)
    multus_networks: list[str] | None = field(
        "multusNetworks are NetworkAttachmentDefinition names ([namespace/]name) put in the pods' "
        "k8s.v1.cni.cncf.io/networks annotation. Required with mode Multus.", max_items=16, item_max_length=253)


@dataclass
class RdmaSpec:
    """The RDMA device-plugin resource each pool pod requests."""

    resource_name: str = field("resourceName is the extended resource the RDMA device plugin advertises, for "
                               "example rdma/ib or rdma/hca_shared_devices_a. Default rdma/ib.",
                               default="rdma/ib", max_length=253, pattern=r"^[a-z0-9.-]+/[A-Za-z0-9_.-]+$")
    count: int | None = field("count is how many of resourceName each pod requests. Default: one per GPU of "
                              "the pod.", minimum=1, maximum=64)


@dataclass
class TransferSpec:
    """KV-cache transfer between the prefill and decode pools."""

    CEL: ClassVar[tuple[CelRule, ...]] = (
        CelRule(rule="self.backend != 'mooncake_tcp' || !has(self.ibDevices) || self.ibDevices.size() == 0",
                message="backend mooncake_tcp sends KV over TCP and uses no InfiniBand devices: remove ibDevices "
                        "or use backend mooncake",
                field_path=".ibDevices"),
    )

    backend: str = field("backend is SGLang's --disaggregation-transfer-backend. mooncake (default) moves KV "
                         "over RDMA; mooncake_tcp over TCP (SGLang sets MC_FORCE_TCP; no RDMA devices); nixl over UCX.",
                         default="mooncake", enum=TRANSFER_BACKENDS)
    ib_devices: list[str] | None = field(
        "ibDevices are the RDMA NICs Mooncake uses (--disaggregation-ib-device), one per GPU of a pod, for "
        "example mlx5_0 ... mlx5_7. Default: Mooncake discovers them.", max_items=64, item_max_length=64,
        item_pattern=r"^[A-Za-z0-9_.:-]+$")
    rdma: RdmaSpec = field("rdma is the RDMA device-plugin resource each pod requests (not for mooncake_tcp).",
                           default_factory=RdmaSpec)
    network: NetworkSpec = field("network chooses host networking or a Multus secondary network.",
                                 default_factory=NetworkSpec)


@dataclass
class PoolSpec:
    """Settings of one pool (prefill or decode)."""

    replicas: int = field("replicas is the number of replicas of the pool. Default 1.", default=1, minimum=0,
                          maximum=1000)
    nodes_per_replica: int = field("nodesPerReplica is how many nodes one replica spans. 1 (default) renders a "
                                   "Deployment; more renders a LeaderWorkerSet with --nnodes/--node-rank/"
                                   "--dist-init-addr (needs the LWS controller). engine.tp must be a multiple.",
                                   default=1, minimum=1, maximum=16)
    gpus_per_node: int = field("gpusPerNode is the GPUs of one node, the most one pod can ask for. Default 8.",
                               default=8, minimum=1, maximum=16)
    resources: RawObject | None = field("resources adds CPU, memory or other requests and limits to the serving "
                                        "container. The operator sets nvidia.com/gpu and the RDMA resource "
                                        "itself.")
    node_selector: StringMap | None = field("nodeSelector restricts the pool's pods to matching nodes.")
    tolerations: list[RawObject] | None = field("tolerations let the pool's pods run on tainted GPU nodes.",
                                                max_items=32)
    affinity: RawObject | None = field("affinity is the pods' Kubernetes affinity. Default: the operator "
                                       "spreads a pool's pods over nodes.")
    env: list[RawObject] | None = field("env adds environment variables (Kubernetes EnvVar objects) to this "
                                        "pool's serving container, after engine.env; an entry replaces "
                                        "engine.env's entry of the same name. Names the operator sets are "
                                        "refused.", max_items=64)
    extra_args: list[str] | None = field("extraArgs are appended to this pool's SGLang command line, after "
                                         "engine.extraArgs. Operator-owned flags are refused.", max_items=64,
                                         item_max_length=1024)
    startup_timeout_seconds: int = field("startupTimeoutSeconds is how long SGLang may take to load the model "
                                         "before the pod is restarted. A 671B model takes many minutes. "
                                         "Default 3600.", default=3600, minimum=60, maximum=86400)
    termination_grace_period_seconds: int = field("terminationGracePeriodSeconds is how long in-flight requests "
                                                  "get to finish when a pod stops. Default 300.", default=300,
                                                  minimum=0, maximum=86400)


@dataclass
class PrefillPoolSpec(PoolSpec):
    """The prefill pool."""

    speculative_decoding: str = field("speculativeDecoding is Enabled (default) or Disabled. Disabled runs the "
                                      "prefill pool without --speculative-algorithm, which works with every "
                                      "algorithm on the decode side (the seed's report).", default="Enabled",
                                      enum=SPECULATION_MODES)
    bootstrap_port: int = field("bootstrapPort is the KV-transfer bootstrap port of prefill pods "
                                "(--disaggregation-bootstrap-port), advertised to the router through the "
                                "sglang.ai/bootstrap-port annotation. Default 8998.", default=8998, minimum=1024,
                                maximum=65535)


@dataclass
class DecodePoolSpec(PoolSpec):
    """The decode pool. `kubectl scale` changes its replicas."""

    cuda_graph_batch_sizes: list[int] | None = field("cudaGraphBatchSizes are the decode batch sizes captured as "
                                                     "CUDA graphs (--cuda-graph-bs-decode), for example 1 2 4 8 "
                                                     "16.", max_items=128, item_minimum=1, item_maximum=4096)


@dataclass
class RouterSpec:
    """The SGLang router in PD mode, which finds the pools' pods through Kubernetes service discovery."""

    replicas: int = field("replicas of the router. Default 1.", default=1, minimum=0, maximum=100)
    implementation: str | None = field(
        "implementation is the router program: sglang-router (python3 -m sglang_router.launch_router, frozen at "
        "0.3.2) or smg (python3 -m smg.launch_router, its successor); the flags are rendered for the one chosen. "
        "Default: the router the SGLang version's image carries (docs/router.md lists them), else sglang-router "
        "with a warning. Set it together with image when the serving image has no router.",
        enum=ROUTER_IMPLEMENTATIONS)
    image: str | None = field("image of the router. Default: the serving image. It must carry the chosen "
                              "implementation's Python module.", max_length=512, pattern=r"^[^\s]+$")
    dp_aware: bool | None = field(
        "dpAware registers every DP rank of a pod as a worker of its own (--dp-aware), so the router spreads "
        "requests over the ranks instead of leaving that to each engine. Default: true when engine."
        "enableDpAttention is true, engine.dp > 1 and the implementation is smg (sglang-router 0.3.2 misroutes "
        "DP-aware PD requests, so true is refused with it).")
    policy: str = field("policy is the router's load-balancing policy (--policy). Default cache_aware.",
                        default="cache_aware", enum=ROUTER_POLICIES)
    prefill_policy: str | None = field("prefillPolicy overrides policy for prefill (--prefill-policy).",
                                       enum=ROUTER_POLICIES)
    decode_policy: str | None = field("decodePolicy overrides policy for decode (--decode-policy).",
                                      enum=ROUTER_POLICIES)
    port: int = field("port the router listens on and its Service exposes. Default 8000.", default=8000,
                      minimum=1, maximum=65535)
    service_type: str = field("serviceType of the router Service. Default ClusterIP.", default="ClusterIP",
                              enum=SERVICE_TYPES)
    resources: RawObject | None = field("resources of the router container. Default: 1 CPU, 1Gi requested.")
    node_selector: StringMap | None = field("nodeSelector restricts the router's pods to matching nodes (it needs "
                                            "no GPU).")
    tolerations: list[RawObject] | None = field("tolerations let the router's pods run on tainted nodes.",
                                                max_items=32)
    extra_args: list[str] | None = field("extraArgs are appended to the router's command line.", max_items=64,
                                         item_max_length=1024)
    serving_check: str = field(
        "servingCheck is Enabled (default) or Disabled. Enabled: after each rollout the operator sends one short "
        "generate request through the router's Service, which involves a prefill and a decode pod, and reports "
        "the answer in the ServingVerified condition (never in Ready). Disabled removes the condition.",
        default="Enabled", enum=SPECULATION_MODES)


@dataclass
class RolloutSpec:
    """How a change to the PD contract (docs/rollouts.md) rolls out: a new revision of both pools beside the old
    one, the router switched to it once it is Ready, then the old revision drained and deleted."""

    strategy: str = field(
        "strategy is Surge (default) or Stepped. Surge starts every replica of the new revision before the router "
        "switches and the old revision goes: no capacity is lost, but the new revision needs its own nodes. "
        "Stepped starts maxSurge replicas per role at a time and gives the same back from the old revision, so it "
        "needs only maxSurge spare nodes per role; the router switches once the new revision has Ready as many "
        "replicas of each role as the old one still runs.",
        default="Surge", enum=ROLLOUT_STRATEGIES)
    max_surge: int = field("maxSurge is the replicas per role a Stepped rollout adds at a time, and the most that "
                           "run beyond the wanted count. Default 1. Changes outside the PD contract roll a pool in "
                           "place with this surge (1 under Surge) and no unavailable replica.",
                           default=1, minimum=1, maximum=64)


@dataclass
class SpecServingSpec:
    """The desired state of one PD-disaggregated SGLang deployment with speculative decoding."""

    CEL: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            rule="!self.engine.enableDpAttention || self.engine.tp % self.engine.dp == 0",
            message="engine.dp must divide engine.tp when engine.enableDpAttention is true",
            # format(), not string() and +: the API server's cost estimate of string(int) concatenation is
            # unbounded and refuses the CRD.
            message_expression="'spec.engine.tp must be divisible by spec.engine.dp under DP attention (got %d and "
                               "%d): set dp to a divisor of tp'.format([self.engine.tp, self.engine.dp])",
            field_path=".engine.dp",
        ),
        CelRule(
            rule="self.engine.tp % self.prefill.nodesPerReplica == 0 && "
                 "self.engine.tp / self.prefill.nodesPerReplica <= self.prefill.gpusPerNode",
            message="engine.tp must split evenly over prefill.nodesPerReplica nodes of at most gpusPerNode GPUs",
            message_expression="'spec.engine.tp (%d) must split evenly over spec.prefill.nodesPerReplica (%d) "
                               "nodes of at most %d GPUs: raise nodesPerReplica'.format([self.engine.tp, "
                               "self.prefill.nodesPerReplica, self.prefill.gpusPerNode])",
            field_path=".prefill.nodesPerReplica",
        ),
        CelRule(
            rule="self.engine.tp % self.decode.nodesPerReplica == 0 && "
                 "self.engine.tp / self.decode.nodesPerReplica <= self.decode.gpusPerNode",
            message="engine.tp must split evenly over decode.nodesPerReplica nodes of at most gpusPerNode GPUs",
            message_expression="'spec.engine.tp (%d) must split evenly over spec.decode.nodesPerReplica (%d) "
                               "nodes of at most %d GPUs: raise nodesPerReplica'.format([self.engine.tp, "
                               "self.decode.nodesPerReplica, self.decode.gpusPerNode])",
            field_path=".decode.nodesPerReplica",
        ),
        CelRule(
            rule="!has(self.transfer.ibDevices) || self.transfer.ibDevices.size() == 0 || "
                 "(self.transfer.ibDevices.size() == self.engine.tp / self.prefill.nodesPerReplica && "
                 "self.transfer.ibDevices.size() == self.engine.tp / self.decode.nodesPerReplica)",
            message="transfer.ibDevices must list one device per GPU of a pool pod",
            message_expression="'spec.transfer.ibDevices lists %d devices but a pool pod has %d GPUs: list one "
                               "RDMA device per GPU'.format([self.transfer.ibDevices.size(), "
                               "self.engine.tp / self.decode.nodesPerReplica])",
            field_path=".transfer.ibDevices",
        ),
    )

    model: ModelSpec = field("model is the model to serve and where its files live.", required=True)
    image: ImageSpec = field("image is the SGLang serving image and the fixed-image build.", required=True)
    engine: EngineSpec = field("engine holds the SGLang settings both pools share.", default_factory=EngineSpec)
    speculative: SpeculativeSpec = field("speculative configures speculative decoding.",
                                         default_factory=SpeculativeSpec)
    prefill: PrefillPoolSpec = field("prefill is the prefill pool.", default_factory=PrefillPoolSpec)
    decode: DecodePoolSpec = field("decode is the decode pool; the scale subresource maps to decode.replicas.",
                                   default_factory=DecodePoolSpec)
    transfer: TransferSpec = field("transfer configures KV transfer between the pools.",
                                   default_factory=TransferSpec)
    router: RouterSpec = field("router is the SGLang router in PD service-discovery mode.",
                               default_factory=RouterSpec)
    rollout: RolloutSpec = field("rollout chooses how a change to the PD contract rolls out (docs/rollouts.md).",
                                 default_factory=RolloutSpec)

    def pool(self, role: str) -> PoolSpec:
        """The prefill or the decode pool, by role (api.naming.PREFILL or DECODE)."""
        if role == PREFILL:
            return self.prefill
        if role == DECODE:
            return self.decode
        raise ValueError(f"no pool has the role {role!r}")
