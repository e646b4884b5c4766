"""STAND-IN, NOT SGLANG. The stand-in engine image (hack/images.sh stand-in-engine) puts this package where the
rendered command `python3 -m sglang.launch_server` finds it, so the operator's pods run unchanged on the local
cluster's real node. See specserving_standin/engine.py for what it answers and what it cannot prove."""
