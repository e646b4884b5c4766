"""SpecServing: a Kubernetes operator for PD-disaggregated SGLang serving with speculative decoding."""

__version__ = "0.1.0"

GROUP = "specserving.io"
VERSION = "v1alpha1"
KIND = "SpecServing"
PLURAL = "specservings"
API_VERSION = f"{GROUP}/{VERSION}"
