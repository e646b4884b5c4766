"""STAND-IN, NOT SGLANG: `python3 -m sglang.launch_server ARGS` starts specserving_standin.engine."""

from specserving_standin.engine import main

if __name__ == "__main__":
    main()
