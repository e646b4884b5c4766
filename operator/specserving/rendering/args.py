"""The SGLang command line of a prefill or decode pod, built from typed fields.

Flags use SGLang's full names (--tp-size, not --tp). Every flag this module can emit from a typed field is
"owned": extraArgs may not set it, because two values for one flag would make the pod's behaviour depend on
argparse's last-one-wins rule rather than on the spec.
"""

from __future__ import annotations

from specserving.api.types import SpecServingSpec
from specserving.rendering.labels import PREFILL

LAUNCHER = ["python3", "-m", "sglang.launch_server"]
BLOCK_SIZE_FLAGS = {"DSPARK": "--speculative-dspark-block-size", "DFLASH": "--speculative-dflash-block-size"}
HOST = "0.0.0.0"
DIST_INIT_PORT = 20000

# Flag -> the spec field that sets it. Aliases SGLang accepts for the same setting are owned too.
OWNED_FLAGS: dict[str, str] = {
    "--model-path": "spec.model.path",
    "--model": "spec.model.path",
    "--served-model-name": "spec.model.servedModelName",
    "--trust-remote-code": "spec.model.trustRemoteCode",
    "--tp-size": "spec.engine.tp",
    "--tp": "spec.engine.tp",
    "--tensor-parallel-size": "spec.engine.tp",
    "--dp-size": "spec.engine.dp",
    "--dp": "spec.engine.dp",
    "--data-parallel-size": "spec.engine.dp",
    "--enable-dp-attention": "spec.engine.enableDpAttention",
    "--enable-dp-lm-head": "spec.engine.enableDpLmHead",
    "--host": "the operator (always 0.0.0.0)",
    "--port": "spec.engine.port",
    "--speculative-algorithm": "spec.speculative.algorithm",
    "--speculative-draft-model-path": "spec.speculative.draftModelPath",
    "--speculative-num-steps": "spec.speculative.numSteps",
    "--speculative-eagle-topk": "spec.speculative.eagleTopk",
    "--speculative-num-draft-tokens": "spec.speculative.numDraftTokens",
    "--speculative-dspark-block-size": "spec.speculative.blockSize",
    "--speculative-dflash-block-size": "spec.speculative.blockSize",
    "--disaggregation-mode": "the pool (prefill or decode)",
    "--disaggregation-transfer-backend": "spec.transfer.backend",
    "--disaggregation-ib-device": "spec.transfer.ibDevices",
    "--disaggregation-bootstrap-port": "spec.prefill.bootstrapPort",
    "--nnodes": "spec.<pool>.nodesPerReplica",
    "--node-rank": "the operator (from the LeaderWorkerSet worker index)",
    "--dist-init-addr": "the operator (the LeaderWorkerSet leader address)",
    "--cuda-graph-bs-decode": "spec.decode.cudaGraphBatchSizes",
    "--enable-metrics": "spec.engine.metrics.enabled",
    "--enable-cache-report": "spec.engine.metrics.cacheReport",
    "--mem-fraction-static": "spec.engine.memFractionStatic",
    "--chunked-prefill-size": "spec.engine.chunkedPrefillSize",
    "--max-running-requests": "spec.engine.maxRunningRequests",
    "--tool-call-parser": "spec.engine.toolCallParser",
    "--reasoning-parser": "spec.engine.reasoningParser",
    "--disable-flashinfer-autotune": "spec.engine.disableFlashinferAutotune",
    "--moe-a2a-backend": "spec.engine.moeA2aBackend",
    "--moe-runner-backend": "spec.engine.moeRunnerBackend",
    "--log-requests": "spec.engine.requestLogging.enabled",
    "--log-requests-level": "spec.engine.requestLogging.level",
}
# Flags extraArgs may never carry although no field renders them: --config reads more flags from a file inside
# the image, past every check here.
FORBIDDEN_FLAGS: dict[str, str] = {
    "--config": "it reads further flags from a file the operator cannot check; put them in extraArgs instead",
}


def server_args(spec: SpecServingSpec, role: str, *, multinode: bool) -> list[str]:
    """The SGLang flags of one pool's serving container (its command is LAUNCHER): the typed fields' flags, then
    engine.extraArgs, then the pool's extraArgs."""
    return [*typed_server_args(spec, role, multinode=multinode), *(spec.engine.extra_args or []),
            *(spec.pool(role).extra_args or [])]


def typed_server_args(spec: SpecServingSpec, role: str, *, multinode: bool) -> list[str]:
    """The flags the operator renders from typed fields (every one in OWNED_FLAGS)."""
    eng, spec_dec, transfer = spec.engine, spec.speculative, spec.transfer
    pool = spec.pool(role)
    args = ["--model-path", spec.model.path]
    if spec.model.served_model_name:
        args += ["--served-model-name", spec.model.served_model_name]
    if spec.model.trust_remote_code:
        args.append("--trust-remote-code")
    args += ["--tp-size", str(eng.tp), "--dp-size", str(eng.dp)]
    if eng.mem_fraction_static:
        args += ["--mem-fraction-static", eng.mem_fraction_static]
    if role == PREFILL and eng.chunked_prefill_size is not None:
        args += ["--chunked-prefill-size", str(eng.chunked_prefill_size)]
    if eng.max_running_requests is not None:
        args += ["--max-running-requests", str(eng.max_running_requests)]
    if eng.enable_dp_attention:
        args.append("--enable-dp-attention")
    if eng.enable_dp_lm_head:
        args.append("--enable-dp-lm-head")
    if role != PREFILL and spec.decode.cuda_graph_batch_sizes:
        args += ["--cuda-graph-bs-decode", *(str(b) for b in spec.decode.cuda_graph_batch_sizes)]
    if eng.tool_call_parser:
        args += ["--tool-call-parser", eng.tool_call_parser]
    if eng.reasoning_parser:
        args += ["--reasoning-parser", eng.reasoning_parser]
    if speculates(spec, role):
        args += ["--speculative-algorithm", spec_dec.algorithm]
        for flag, value in (("--speculative-draft-model-path", spec_dec.draft_model_path),
                            ("--speculative-num-steps", spec_dec.num_steps),
                            ("--speculative-eagle-topk", spec_dec.eagle_topk),
                            ("--speculative-num-draft-tokens", spec_dec.num_draft_tokens),
                            (BLOCK_SIZE_FLAGS.get(spec_dec.algorithm, ""), spec_dec.block_size)):
            if value is not None:
                args += [flag, str(value)]
    args += ["--disaggregation-mode", role]
    if eng.disable_flashinfer_autotune:
        args.append("--disable-flashinfer-autotune")
    if eng.moe_a2a_backend:
        args += ["--moe-a2a-backend", eng.moe_a2a_backend]
    if eng.moe_runner_backend:
        args += ["--moe-runner-backend", eng.moe_runner_backend]
    # Every version's parser takes mooncake_tcp as a backend of its own (it sets MC_FORCE_TCP itself).
    args += ["--disaggregation-transfer-backend", transfer.backend]
    if transfer.ib_devices:
        args += ["--disaggregation-ib-device", ",".join(transfer.ib_devices)]
    if role == PREFILL:
        args += ["--disaggregation-bootstrap-port", str(spec.prefill.bootstrap_port)]
    if eng.request_logging.enabled:
        args += ["--log-requests", "--log-requests-level", str(eng.request_logging.level)]
    if eng.metrics.enabled:
        args.append("--enable-metrics")
    if eng.metrics.cache_report:
        args.append("--enable-cache-report")
    args += ["--host", HOST, "--port", str(eng.port)]
    if multinode:
        # Kubernetes expands $(VAR) in args from the container's env, which the LeaderWorkerSet injects.
        args += ["--nnodes", str(pool.nodes_per_replica), "--node-rank", "$(LWS_WORKER_INDEX)",
                 "--dist-init-addr", f"$(LWS_LEADER_ADDRESS):{DIST_INIT_PORT}"]
    return args


def speculates(spec: SpecServingSpec, role: str) -> bool:
    """Whether this pool runs speculative decoding: decode always, prefill unless switched off."""
    return role != PREFILL or spec.prefill.speculative_decoding == "Enabled"


def flag_name(token: str) -> str | None:
    """The flag a command-line token sets (`--port=1` -> `--port`), or None for a value."""
    if not token.startswith("--"):
        return None
    return token.split("=", 1)[0]
