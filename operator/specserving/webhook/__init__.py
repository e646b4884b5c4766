"""The validating admission webhook: TLS material, its configuration object, and the kopf handler."""
