"""Running the webhook inside `specserving run`: its HTTPS server, and (for local clusters) its configuration.

Two set-ups:
- `configuration="self"` (local and development clusters): the operator makes a CA and certificate, serves on
  an address the API server reaches directly, and applies the ValidatingWebhookConfiguration with that URL and
  CA. It is left in place when the operator stops: with failurePolicy Fail, SpecServings are then refused until
  the operator is back, which is the safe side.
- `configuration="none"` (the Helm chart): certificate files come from a Secret (the chart's or cert-manager's)
  and the chart owns the configuration; kopf reloads the files when they change.
"""

from __future__ import annotations

import logging
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kopf

from specserving.kube import ApiError, Kube, StartupError
from specserving.policy import ServingPolicy
from specserving.webhook.configuration import CONFIGURATION_NAME, validating_configuration
from specserving.webhook.handlers import NamespaceLevels, WebhookMetrics, register

log = logging.getLogger(__name__)
SELF, NONE = "self", "none"


@dataclass
class WebhookOptions:
    """The webhook flags of `specserving run`."""

    port: int = 0  # 0: no webhook
    listen: str = "127.0.0.1"
    advertise: str | None = None  # the host the API server uses; default: listen (localhost for 0.0.0.0)
    certfile: Path | None = None
    keyfile: Path | None = None
    cert_dir: Path | None = None
    configuration: str = SELF
    configuration_name: str = CONFIGURATION_NAME

    @property
    def host(self) -> str:
        if self.advertise:
            return self.advertise
        return "localhost" if self.listen in ("0.0.0.0", "::") else self.listen


def tls_context() -> ssl.SSLContext:
    """The server side of the webhook's TLS: 1.2 or newer, whatever the OpenSSL build would otherwise allow (the
    API server speaks 1.2 and 1.3). kopf loads the certificate into it, and again when the files change."""
    context = ssl.create_default_context(purpose=ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def _server(opts: WebhookOptions) -> tuple[kopf.WebhookServer, bytes | None]:
    if opts.certfile or opts.keyfile:
        if not (opts.certfile and opts.keyfile):
            raise StartupError("--webhook-certfile and --webhook-keyfile go together")
        for f in (opts.certfile, opts.keyfile):
            if not f.is_file():
                raise StartupError(f"webhook TLS file {f} does not exist")
        return kopf.WebhookServer(addr=opts.listen, port=opts.port, host=opts.host, certfile=str(opts.certfile),
                                  pkeyfile=str(opts.keyfile), context=tls_context()), None
    # Only self mode makes certificates: importing cryptography maps its OpenSSL bindings, 8.8 MiB of RSS that an
    # operator on the chart's certificate files would keep for nothing (issue 21).
    from specserving.webhook.tls import generate

    cert_dir = opts.cert_dir or Path(tempfile.mkdtemp(prefix="specserving-webhook-"))
    hosts = [opts.host] + (["localhost"] if opts.host != "localhost" else [])
    material = generate(cert_dir, hosts)
    log.info("webhook: generated a self-signed CA and certificate for %s in %s", ", ".join(hosts), cert_dir)
    server = kopf.WebhookServer(addr=opts.listen, port=opts.port, host=opts.host,
                                certfile=str(material.certfile), pkeyfile=str(material.keyfile),
                                cadata=material.ca_pem, context=tls_context())
    return server, material.ca_pem


def install(registry: kopf.OperatorRegistry, opts: WebhookOptions, kube: Kube, metrics: WebhookMetrics, *,
            namespaces: list[str] | None = None, policy: ServingPolicy | None = None) -> None:
    """Register the validating handler, and at start-up serve it and (in self mode) configure the API server.

    In self mode with `namespaces`, the configuration covers only those namespaces, so that an operator scoped
    to some namespaces never holds up SpecServings elsewhere.
    """
    if not opts.port:
        return
    if opts.configuration not in (SELF, NONE):
        raise StartupError(f"--webhook-configuration must be {SELF} or {NONE}, not {opts.configuration!r}")
    server, ca_pem = _server(opts)
    if opts.configuration == SELF and ca_pem is None:
        raise StartupError("--webhook-configuration=self needs the operator's own CA: drop --webhook-certfile, or "
                           "use --webhook-configuration=none and let the chart own the configuration")
    register(registry, metrics, policy, NamespaceLevels(kube))

    @kopf.on.startup(id="webhook", registry=registry)
    def start_webhook(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.admission.server = server
        settings.admission.managed = None  # we own the configuration: kopf's would use a 30 s timeout
        if opts.configuration == SELF and ca_pem is not None:
            url = f"https://{opts.host}:{opts.port}"
            manifest = validating_configuration(ca_pem, url=url, name=opts.configuration_name,
                                                namespaces=namespaces or None)
            res = kube.resource("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration")
            if res is None:
                raise kopf.PermanentError("the API server does not serve admissionregistration.k8s.io/v1")
            try:
                kube.apply(res, manifest)
            except ApiError as exc:
                raise kopf.PermanentError(f"cannot apply the ValidatingWebhookConfiguration "
                                          f"{manifest['metadata']['name']}: {exc}") from None
            log.info("webhook: serving at %s, configuration %s applied", url, manifest["metadata"]["name"])
