"""STAND-IN, NOT SGLANG: an HTTP server that answers where an SGLang prefill or decode GPU process would, so the
real router processes (sglang-router, smg) have pods to discover, register, probe and send requests to on a
machine without GPUs or RDMA.

What it does answer, as SGLang's HTTP server does: /health, /health_generate, /ready, /get_server_info and
/server_info (with the disaggregation mode, bootstrap port and dp size from its command line), /get_model_info,
/model_info, /v1/models, /metrics (sglang:num_running_reqs), /generate, /v1/completions and /v1/chat/completions.

The prefill/decode handoff is mimicked, not performed: a prefill records each request's bootstrap_room on its
bootstrap port (an HTTP listener standing in for Mooncake's bootstrap server); a decode looks that room up at the
bootstrap_host:bootstrap_port the router put in the request, and answers with the pods on both sides. So an answer
proves the router paired one prefill with one decode and passed the prefill's address and bootstrap port; it proves
nothing about KV transfer, the model, CUDA or speculative decoding.

POST /stand-in/fail {"generate": true} makes /generate and the OpenAI routes answer 500 (a broken engine), and
{"health": true} makes /health answer 503; {} restores both. Tests use it to make serving fail on purpose.

It exits on SIGTERM, as SGLang's server does. Without a handler a PID-1 Python ignores SIGTERM, and every pod of
it took the whole termination grace period to stop (measured on the real node: 40 s per LeaderWorkerSet pod).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ROOM_WAIT_SECONDS = 10.0


class State:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.pod = os.environ.get("POD_NAME") or socket.gethostname()
        self.lock = threading.Lock()
        self.rooms: dict[str, dict[str, Any]] = {}
        self.running = 0
        self.fail: dict[str, bool] = {}
        self.requests = 0

    def server_info(self) -> dict[str, Any]:
        a = self.args
        return {
            "stand_in": "specserving stand-in engine, not SGLang",
            "model_path": a.model_path, "served_model_name": a.served_model_name or a.model_path,
            "tp_size": a.tp_size, "dp_size": a.dp_size, "enable_dp_attention": a.enable_dp_attention,
            "disaggregation_mode": a.disaggregation_mode,
            "disaggregation_bootstrap_port": a.disaggregation_bootstrap_port,
            "disaggregation_transfer_backend": a.disaggregation_transfer_backend,
            "speculative_algorithm": a.speculative_algorithm,
            "page_size": a.page_size, "version": "stand-in", "pod": self.pod,
            "internal_states": [{"pod": self.pod}],
        }


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="stand-in sglang.launch_server", allow_abbrev=False)
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--model-path", default="stand-in")
    p.add_argument("--served-model-name")
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--dp-size", type=int, default=1)
    p.add_argument("--enable-dp-attention", action="store_true")
    p.add_argument("--disaggregation-mode", default="null")
    p.add_argument("--disaggregation-bootstrap-port", type=int, default=8998)
    p.add_argument("--disaggregation-transfer-backend", default="mooncake")
    p.add_argument("--speculative-algorithm")
    p.add_argument("--page-size", type=int, default=1)
    known, _ = p.parse_known_args(argv)  # every other SGLang flag is accepted and ignored
    return known


def handler(state: State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: Any) -> None:
            sys.stderr.write(f"stand-in {state.args.disaggregation_mode} {self.address_string()} {fmt % args}\n")

        def reply(self, code: int, body: Any, ctype: str = "application/json") -> None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def body(self) -> dict[str, Any]:
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b""
            try:
                loaded = json.loads(raw or b"{}")
            except ValueError:
                return {}
            return loaded if isinstance(loaded, dict) else {}

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            path = self.path.split("?", 1)[0]
            if path in ("/health", "/ready", "/health_generate"):
                if state.fail.get("health"):
                    self.reply(503, {"status": "stand-in told to fail"})
                else:
                    self.reply(200, "", "text/plain")
            elif path in ("/get_server_info", "/server_info"):
                self.reply(200, state.server_info())
            elif path in ("/get_model_info", "/model_info"):
                self.reply(200, {"model_path": state.args.model_path, "is_generation": True,
                                 "tokenizer_path": state.args.model_path})
            elif path == "/v1/models":
                name = state.args.served_model_name or state.args.model_path
                self.reply(200, {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "stand-in"}]})
            elif path == "/metrics":
                with state.lock:
                    running, total = state.running, state.requests
                self.reply(200, f"sglang:num_running_reqs{{pod=\"{state.pod}\"}} {running}\n"
                                f"standin_requests_total {total}\n", "text/plain; version=0.0.4")
            else:
                self.reply(404, {"error": f"stand-in engine: no route {path}"})

        def do_POST(self) -> None:  # noqa: N802
            path = self.path.split("?", 1)[0]
            body = self.body()
            if path == "/stand-in/fail":
                state.fail = {k: bool(v) for k, v in body.items()}
                self.reply(200, state.fail)
            elif path in ("/generate", "/v1/completions", "/v1/chat/completions"):
                self.generate(path, body)
            else:
                self.reply(404, {"error": f"stand-in engine: no route {path}"})

        def generate(self, path: str, body: dict[str, Any]) -> None:
            if state.fail.get("generate"):
                self.reply(500, {"error": {"message": "stand-in engine told to fail"}})
                return
            with state.lock:
                state.running += 1
                state.requests += 1
            try:
                room = body.get("bootstrap_room")
                mode = state.args.disaggregation_mode
                answer: dict[str, Any] = {"role": mode, "pod": state.pod, "bootstrap_room": room}
                if mode == "prefill":
                    with state.lock:
                        state.rooms[str(room)] = {"pod": state.pod, "at": time.time()}
                elif mode == "decode":
                    host, port = body.get("bootstrap_host"), body.get("bootstrap_port")
                    if room is None or host is None:
                        self.reply(400, {"error": {"message": "stand-in decode: no bootstrap_host/bootstrap_room: "
                                                              "not sent through a PD router"}})
                        return
                    peer = lookup_room(str(host), int(port or state.args.disaggregation_bootstrap_port), str(room))
                    if peer is None:
                        self.reply(502, {"error": {"message": f"stand-in decode: prefill at {host}:{port} never "
                                                              f"saw bootstrap room {room}"}})
                        return
                    answer["prefill_pod"] = peer["pod"]
                text = f"stand-in {mode} {state.pod}"
                meta = {"id": str(room), "finish_reason": {"type": "length"}, "prompt_tokens": 1,
                        "completion_tokens": 1, "stand_in": answer}
                if path == "/generate":
                    self.reply(200, {"text": text, "meta_info": meta})
                elif path == "/v1/completions":
                    self.reply(200, {"object": "text_completion", "choices": [{"index": 0, "text": text}],
                                     "stand_in": answer})
                else:
                    self.reply(200, {"object": "chat.completion", "stand_in": answer, "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}]})
            finally:
                with state.lock:
                    state.running -= 1

    return Handler


def lookup_room(host: str, port: int, room: str) -> dict[str, Any] | None:
    """The decode side: wait for the prefill to have seen the room, as a real decode waits for its KV."""
    url = f"http://{host if ':' not in host else '[' + host + ']'}:{port}/stand-in/room/{room}"
    end = time.time() + ROOM_WAIT_SECONDS
    while time.time() < end:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                found: dict[str, Any] = json.loads(r.read())
                return found
        except Exception:  # not there yet, or the prefill is still starting: retry until the deadline
            time.sleep(0.1)
    return None


def bootstrap_handler(state: State) -> type[BaseHTTPRequestHandler]:
    class Bootstrap(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            prefix = "/stand-in/room/"
            with state.lock:
                found = state.rooms.get(self.path[len(prefix):]) if self.path.startswith(prefix) else None
            data = json.dumps(found or {}).encode()
            self.send_response(200 if found else 404)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Bootstrap


def serve(server: ThreadingHTTPServer) -> threading.Thread:
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    return t


def main(argv: list[str] | None = None) -> None:
    args = parse(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # serve_forever runs in this thread: SystemExit ends it
    state = State(args)
    startup = float(os.environ.get("STANDIN_STARTUP_SECONDS", "0"))
    ThreadingHTTPServer.daemon_threads = True
    if args.disaggregation_mode == "prefill":
        serve(ThreadingHTTPServer((args.host, args.disaggregation_bootstrap_port), bootstrap_handler(state)))
    time.sleep(startup)  # a real engine loads weights first; its HTTP port opens only then
    print(f"stand-in engine (not SGLang): {args.disaggregation_mode} pod {state.pod} on {args.host}:{args.port}, "
          f"bootstrap port {args.disaggregation_bootstrap_port}, dp {args.dp_size}", flush=True)
    ThreadingHTTPServer((args.host, args.port), handler(state)).serve_forever()


if __name__ == "__main__":
    main()
