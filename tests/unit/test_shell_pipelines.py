"""Our bash scripts run under `set -o pipefail`, where a reader that leaves early fails the whole pipeline.

`grep -q` exits at its first match and `head` after its lines; a writer that still has output then dies of SIGPIPE
(exit 141), and pipefail reports the pipeline as failed. Whether it does depends on scheduling: `ip addr show`
writes one line per address, so `ip addr show | grep -q ADDR || ip addr add ADDR` passed for months and then, on a
loaded CI machine, added an address that was already there ("ipv4: Address already assigned").
"""

from __future__ import annotations

import pathlib
import re
import subprocess

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = sorted([*REPO.glob("hack/*.sh"), REPO / ".ci" / "run"])

# A pipe into a reader that stops reading before its input ends: grep -q / -m, head.
EARLY_READER = re.compile(r"(?<!\|)\|(?!\|)\s*(grep\s+(-\w*[qm]\w*|--quiet|--max-count)\b|head\b)")


def _offending_lines(text: str) -> list[str]:
    found = []
    for line in text.splitlines():
        code = line.split("#", 1)[0] if not line.lstrip().startswith("#") else ""
        # `$(... | head -n1 || true)` keeps what head printed and ignores the status, which is safe.
        if EARLY_READER.search(code) and "|| true" not in code:
            found.append(line.strip())
    return found


def test_the_hazard_is_real_a_writer_that_outlives_grep_q_fails_the_pipeline() -> None:
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", "{ echo a; sleep 0.3; echo b; } | grep -q a"],
                          check=False)
    assert proc.returncode == 141


def test_the_check_finds_the_pattern_it_forbids() -> None:
    assert _offending_lines('ip addr show dev "$B" | grep -q "inet $G/" || ip addr add "$G/16" dev "$B"')
    assert _offending_lines("x=$(ls | head -n1)")
    assert not _offending_lines("x=$(compgen -G '*.whl' | head -n1 || true)")
    assert not _offending_lines("grep -q foo <<<\"$routes\"")
    assert not _offending_lines("a || grep -q foo file")


def test_no_script_under_pipefail_pipes_into_a_reader_that_leaves_early() -> None:
    assert SCRIPTS, "no scripts found under hack/ and .ci/"
    offending = {
        str(path.relative_to(REPO)): lines
        for path in SCRIPTS
        if "pipefail" in (text := path.read_text())
        and (lines := _offending_lines(text))
    }
    assert not offending, f"pipe into grep -q/-m or head under pipefail (capture the output first): {offending}"
