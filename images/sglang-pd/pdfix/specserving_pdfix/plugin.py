"""The `sglang.srt.plugins` entry point.

SGLang's `load_plugins()` runs every general plugin once per process, first thing in the scheduler
process (`run_scheduler_process`), in the engine's main process and, from 0.5.21, in the data-parallel
controller and detokenizer. The scheduler process is where the PD decode loop runs, and it calls
`load_plugins()` before it builds the Scheduler, so the patches are in place before the first batch.
`SGLANG_PLUGINS` (a comma-separated allow-list of plugin names) can exclude it; the plugin name is
`specserving_pdfix`.
"""

from __future__ import annotations


def load() -> None:
    """Entry point: apply the decode-path fix for the SGLang release in this process."""
    from specserving_pdfix.fix import apply

    apply()
