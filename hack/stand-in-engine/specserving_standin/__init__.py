"""A stand-in for an SGLang prefill or decode server, for the local cluster only. See engine.py."""
