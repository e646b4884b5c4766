"""specserving-pdfix: the SpecServing decode-path fix for SGLang PD-disaggregated speculative decoding.

Importing this package changes nothing. The fix is applied by `specserving_pdfix.fix.apply()`, which SGLang
runs in every server process through the `sglang.srt.plugins` entry point (see `plugin.py`), and which
patches only what the installed SGLang release lacks. `python -m specserving_pdfix.probe` reports, by
calling the real builders, which algorithms get a PD-decode draft input.
"""

__version__ = "0.1.0"
