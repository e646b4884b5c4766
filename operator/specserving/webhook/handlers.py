"""The kopf side of the validating webhook: one handler that asks admission.review, and the HTTPS server.

Importing this module registers the handler with kopf's default registry.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kopf

from specserving import GROUP, PLURAL, VERSION
from specserving.admission import refusal_message, review
from specserving.webhook.configuration import HANDLER_ID
from specserving.webhook.tls import TLSMaterial, generate

log = logging.getLogger(__name__)


def plain(value: Any) -> Any:
    """kopf's read-only body views as plain dicts and lists, for the pure code."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


@kopf.on.validate(GROUP, VERSION, PLURAL, id=HANDLER_ID, operations=["CREATE", "UPDATE"])
def validate_specserving(body: kopf.Body, old: kopf.Body | None, warnings: list[str], **_: Any) -> None:
    new_obj = plain(body)
    try:
        report = review(new_obj, plain(old) if old is not None else None)
    except Exception:
        name = f"{new_obj.get('metadata', {}).get('namespace')}/{new_obj.get('metadata', {}).get('name')}"
        log.exception("admission review of SpecServing %s failed unexpectedly", name)
        raise kopf.AdmissionError(f"the SpecServing admission webhook failed on {name}; see the operator's log",
                                  code=500) from None
    warnings.extend(str(w) for w in report.warnings)
    if not report.ok:
        raise kopf.AdmissionError(refusal_message(report), code=422)


def server(*, listen: str, port: int, advertise: str, cert_dir: Path,
           certfile: Path | None = None, keyfile: Path | None = None) -> tuple[kopf.WebhookServer, TLSMaterial | None]:
    """The webhook's HTTPS server: with the given certificate files, or with a self-signed CA made now.

    Returns the server and, when the CA was made here, the material whose CA the configuration must carry.
    """
    if certfile and keyfile:
        return kopf.WebhookServer(addr=listen, port=port, host=advertise, certfile=str(certfile),
                                  pkeyfile=str(keyfile)), None
    material = generate(cert_dir, [advertise, "localhost"] if advertise != "localhost" else ["localhost"])
    srv = kopf.WebhookServer(addr=listen, port=port, host=advertise, certfile=str(material.certfile),
                             pkeyfile=str(material.keyfile), cadata=material.ca_pem)
    return srv, material
