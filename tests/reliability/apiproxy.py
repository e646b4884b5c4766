"""A fault-injecting proxy between the operator and the API server: the operator's requests pass through it, so a
test can SIGKILL the operator at an exact request (its first one, or inside its Nth child apply) rather than at a
random time that may land between passes.

It is plain HTTP on 127.0.0.1 towards the operator (its kubeconfig names the proxy and carries the same token)
and HTTPS towards the API server, verified against the cluster's CA. Responses are streamed, watches included.
Test instrumentation, like toxiproxy: it changes nothing in what the operator sends or receives.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import os
import signal
import ssl
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

from harness.process import free_port

APPLY_PATCH = "application/apply-patch+yaml"
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade",
              "proxy-connection", "te", "trailer"}


@dataclass(frozen=True)
class Request:
    """One request of the operator, as the proxy saw it."""

    method: str
    path: str  # with its query
    content_type: str

    @property
    def child_apply(self) -> bool:
        """A server-side apply of a child (not of the SpecServing or its status, and not a dry run)."""
        return (self.method == "PATCH" and self.content_type.startswith(APPLY_PATCH)
                and "/specservings/" not in self.path and "dryRun=" not in self.path)

    def __str__(self) -> str:
        return f"{self.method} {self.path.split('?')[0]}"


@dataclass
class KillPlan:
    """When to SIGKILL the operator: at the first request of its incarnation, or inside its `nth` child apply,
    `after` the API server answered that apply (so it landed and the operator never heard) or before it was sent."""

    first_request: bool = False
    nth: int = 0
    after: bool = False


@dataclass
class Incarnation:
    """What one operator process did through the proxy, and where it was killed."""

    pid: int
    plan: KillPlan
    requests: int = 0
    applies: int = 0
    killed_at: str = ""
    killed: threading.Event = field(default_factory=threading.Event)


class ApiProxy:
    """Start with `with ApiProxy(kubeconfig) as proxy`; `proxy.kubeconfig` is the operator's kubeconfig."""

    def __init__(self, kubeconfig: Path) -> None:
        config = yaml.safe_load(kubeconfig.read_text())
        cluster = config["clusters"][0]["cluster"]
        self.upstream = cluster["server"].rstrip("/")
        self.port = free_port()
        self._context = ssl.create_default_context()
        if cluster.get("certificate-authority-data"):
            self._context.load_verify_locations(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
        elif cluster.get("certificate-authority"):
            self._context.load_verify_locations(cafile=cluster["certificate-authority"])
        user = config["users"][0]["user"]
        if user.get("client-certificate") or user.get("client-certificate-data"):
            self._client_cert(user)
        # The operator's kubeconfig: the proxy's address, the same user.
        proxied = {**config, "clusters": [{"name": config["clusters"][0]["name"],
                                           "cluster": {"server": f"http://127.0.0.1:{self.port}"}}]}
        self.kubeconfig = kubeconfig.with_name(f"{kubeconfig.stem}-proxied.yaml")
        self.kubeconfig.write_text(yaml.safe_dump(proxied))
        self.kubeconfig.chmod(0o600)
        self.current: Incarnation | None = None
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    def _client_cert(self, user: dict[str, Any]) -> None:
        """A kubeconfig with a client certificate (the admin's): the proxy presents it upstream."""
        def path_of(key: str) -> str:
            if user.get(f"{key}-data"):
                f = tempfile.NamedTemporaryFile("wb", delete=False, suffix=".pem")  # noqa: SIM115 - kept for ssl
                f.write(base64.b64decode(user[f"{key}-data"]))
                f.close()
                return f.name
            return str(user[key])
        self._context.load_cert_chain(path_of("client-certificate"), path_of("client-key"))

    # -- the test's side --------------------------------------------------------------------------------------------

    def __enter__(self) -> ApiProxy:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the API proxy did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            # The upstream side first: that ends the streams (watches) still open for killed operators.
            if self._session:
                await self._session.close()
            if self._runner:
                await self._runner.cleanup()
            # Whatever is left (handlers of connections a killed operator never closed) ends here, not later in the
            # garbage collector, where pytest would blame its warnings on whichever test runs then.
            left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in left:
                task.cancel()
            await asyncio.gather(*left, return_exceptions=True)
            await self._loop.shutdown_asyncgens()
        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()
        gc.collect()  # anything still unraisable surfaces in the test that used the proxy

    def follow(self, pid: int, plan: KillPlan) -> Incarnation:
        """From now on, requests belong to process `pid`, to be killed as `plan` says."""
        self.current = Incarnation(pid, plan)
        return self.current

    # -- the proxy --------------------------------------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._session = aiohttp.ClientSession(auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None),
                                                  connector=aiohttp.TCPConnector(ssl=self._context))
            app = web.Application(client_max_size=64 * 2**20)
            app.router.add_route("*", "/{tail:.*}", self._forward)
            self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
            await self._runner.setup()
            await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

        self._loop.run_until_complete(start())
        self._ready.set()
        self._loop.run_forever()

    def _kill(self, inc: Incarnation, request: Request, where: str) -> None:
        if inc.killed.is_set():
            return
        inc.killed_at = f"{where}: {request}"
        try:
            os.kill(inc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        inc.killed.set()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        seen = Request(request.method, request.path_qs, request.headers.get("Content-Type", ""))
        inc = self.current
        kill_after = False
        if inc is not None and not inc.killed.is_set():
            inc.requests += 1
            inc.applies += seen.child_apply
            plan = inc.plan
            if plan.first_request and inc.requests == 1:
                self._kill(inc, seen, "before the first pass (its first request)")
            elif plan.nth and seen.child_apply and inc.applies == plan.nth:
                if plan.after:
                    kill_after = True
                else:
                    self._kill(inc, seen, f"inside child apply {plan.nth}, before it reached the API server")
        if inc is not None and inc.killed.is_set() and not kill_after:
            raise web.HTTPServiceUnavailable(text="the operator was killed")
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        assert self._session is not None
        # Without a Content-Type of its own, aiohttp would add application/octet-stream, which the API server refuses
        # (415) where it would have read a request with none as JSON.
        skip = () if "Content-Type" in request.headers else ("Content-Type",)
        async with self._session.request(request.method, self.upstream + request.path_qs, headers=headers,
                                         data=body or None, allow_redirects=False,
                                         skip_auto_headers=skip) as upstream:
            if kill_after and inc is not None:
                self._kill(inc, seen, f"inside child apply {inc.plan.nth}, after the API server answered "
                                      f"{upstream.status}")
            response = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP})
            try:
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
            except (ConnectionResetError, aiohttp.ClientError):
                pass  # the operator went away (killed, or a watch it closed)
            return response
