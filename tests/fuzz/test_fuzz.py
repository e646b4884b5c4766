"""No input crashes or hangs the CLI: mutated SpecServings, malformed YAML, invalid UTF-8, deep nesting and alias
bombs are each answered with exit 0, 1 or 2 and at most one line per problem, never a traceback.

10,000 cases in all (FUZZ_CASES split over the generators below); each runs `specserving validate` in process,
and `render` too when validate admits it. A deadline per case catches a hang as a failure. This is its own tier
(`make test-fuzz`, a few minutes), run by `make test` beside the cluster tier.
"""

from __future__ import annotations

import contextlib
import copy
import io
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specserving import cli
from specserving.validation import validate

from tests.unit.builders import seed

FUZZ_CASES = 10_000
# (share of FUZZ_CASES) mutated objects are where the rules live; raw text is where the loader lives.
MUTATED, RAW_TEXT, HOSTILE = 6_000, 3_000, 1_000
assert MUTATED + RAW_TEXT + HOSTILE == FUZZ_CASES
CASE_DEADLINE_MS = 5_000

SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-2**63, 2**63), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(["", "8", "8.0", "-1", "abc", "0.85", "1e309", "..", "/dev/shm", "/data2/../etc", "mlx5_0,mlx5_1",
                     "--config", "--disaggregation-mod", "--speculative-al=NGRAM", "$(X)", "DSPARK", "EAGLE", "NGRAM",
                     "lmsysorg/sglang:v0.5.23", "UPPER;x", "\x00", "\u202e", "é" * 30, "null", "~", "yes"]),
)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=12), inner, max_size=4)),
                      max_leaves=12)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a nested object, containers included."""
    found = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            found += _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            found += _paths(v, prefix + (i,))
    return found


SEED = seed()
SEED_PATHS = [p for p in _paths(SEED) if p]
# cel-python raises the recursion limit when its first environment is built; do that before hypothesis watches.
validate(SEED)


@st.composite
def mutated(draw: st.DrawFn) -> dict[str, Any]:
    """The seed SpecServing with one to four random edits: a value replaced, a key removed or a key added."""
    obj = copy.deepcopy(SEED)
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(SEED_PATHS))
        parent: Any = obj
        for key in path[:-1]:
            if isinstance(parent, dict) and key in parent:
                parent = parent[key]
            elif isinstance(parent, list) and isinstance(key, int) and key < len(parent):
                parent = parent[key]
            else:
                break
        else:
            last = path[-1]
            edit = draw(st.sampled_from(["replace", "replace", "remove", "add"]))
            if isinstance(parent, dict):
                if edit == "remove":
                    parent.pop(last, None)
                elif edit == "add":
                    parent[draw(st.text(min_size=1, max_size=12))] = draw(VALUES)
                else:
                    parent[last] = draw(VALUES)
            elif isinstance(parent, list) and isinstance(last, int) and last < len(parent):
                if edit == "remove":
                    parent.pop(last)
                else:
                    parent[last] = draw(VALUES)
    return obj


def run_cli(tmp: Path, content: bytes) -> tuple[int, str]:
    """`specserving validate` (and `render` when admitted) on `content`, in process: (exit code, stderr)."""
    target = tmp / "cr.yaml"
    target.write_bytes(content)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(["validate", "-f", str(target)])
        if code == 0:
            code = cli.main(["render", "-f", str(target)])
    return code, err.getvalue()


def check_answer(code: int, stderr: str) -> None:
    assert code in (0, cli.EXIT_REFUSED, cli.EXIT_INVALID), code
    assert "Traceback" not in stderr and "celpy" not in stderr and "jsonschema" not in stderr, stderr
    if code != 0:
        assert stderr.strip(), "a refusal must say why"
    for line in stderr.strip().splitlines():
        assert line.startswith(("error: ", "warning: ", "specserving: ")) or line.endswith("nothing would be admitted"), \
            line


def _dump(obj: dict[str, Any]) -> bytes:
    return yaml.safe_dump(obj, allow_unicode=True).encode()


SETTINGS = dict(deadline=CASE_DEADLINE_MS, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                    HealthCheck.function_scoped_fixture])


@settings(max_examples=MUTATED, **SETTINGS)  # type: ignore[arg-type]
@given(mutated())
def test_mutated_specservings_get_an_answer(tmp_path: Path, obj: dict[str, Any]) -> None:
    check_answer(*run_cli(tmp_path, _dump(obj)))


YAML_PIECES = st.sampled_from(["apiVersion: specserving.io/v1alpha1\n", "kind: SpecServing\n", "metadata: {name: a}\n",
                               "spec:\n", "  engine: {tp: 8}\n", "- ", ": ", "{", "}", "[", "]", "&a ", "*a ", "!!python/object:os.system ",
                               "!!binary ", "'", '"', "\t", "\n", "---\n", "...\n", "%YAML 1.1\n", "? ", "|\n", ">\n",
                               "#", "\\", "\x00", "\ufeff", "null", "~", "0x1F", "1e3", ".inf", "<<: *a\n"])


@settings(max_examples=RAW_TEXT, **SETTINGS)  # type: ignore[arg-type]
@given(st.one_of(st.binary(max_size=300), st.lists(YAML_PIECES, max_size=30).map(lambda xs: "".join(xs).encode()),
                 st.text(max_size=300).map(lambda t: t.encode("utf-8", "surrogatepass"))))
def test_raw_bytes_get_an_answer(tmp_path: Path, content: bytes) -> None:
    check_answer(*run_cli(tmp_path, content))


def _alias_bomb(levels: int, width: int) -> bytes:
    lines = ["a0: &a0 [x]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return ("\n".join(lines) + "\n").encode()


@settings(max_examples=HOSTILE, **SETTINGS)  # type: ignore[arg-type]
@given(st.sampled_from(["deep-list", "deep-map", "alias-bomb", "big", "long-line", "bad-utf8", "many-docs"]),
       st.integers(1, 10_000))
def test_hostile_inputs_get_a_refusal_in_bounded_time(tmp_path: Path, kind: str, size: int) -> None:
    content = {
        "deep-list": lambda: ("[" * (size % 2000) + "]" * (size % 2000)).encode(),
        "deep-map": lambda: ("a: {" * (size % 2000) + "}" * (size % 2000)).encode(),
        "alias-bomb": lambda: _alias_bomb(2 + size % 12, 2 + size % 9),
        "big": lambda: b"# " + b"x" * (cli.MAX_INPUT_BYTES + size),
        "long-line": lambda: _dump(seed(**{"spec.model.path": "/data2/" + "m" * size})),
        "bad-utf8": lambda: _dump(seed())[: size % 200] + b"\xff\xfe" + _dump(seed())[size % 200:],
        "many-docs": lambda: b"---\n".join([_dump(seed())] * (1 + size % 8)),
    }[kind]()
    code, stderr = run_cli(tmp_path, content)
    check_answer(code, stderr)


def test_the_fuzz_reaches_every_answer(tmp_path: Path) -> None:
    """The generators reach acceptance, refusal and unreadable input (else the fuzz proves little)."""
    answers = {run_cli(tmp_path, body)[0] for body in (
        _dump(seed()), _dump(seed(**{"spec.engine.tp": "x"})), b"\xff", _alias_bomb(12, 8))}
    assert answers == {0, cli.EXIT_REFUSED, cli.EXIT_INVALID}


def test_an_alias_bomb_is_refused_as_unreadable(tmp_path: Path) -> None:
    code, stderr = run_cli(tmp_path, _alias_bomb(12, 9))
    assert code == cli.EXIT_INVALID and "expands to more than" in stderr, stderr


def test_a_megabyte_of_nesting_is_refused_at_the_first_level_too_many(tmp_path: Path) -> None:
    code, stderr = run_cli(tmp_path, b"[" * (cli.MAX_INPUT_BYTES - 1))
    assert code == cli.EXIT_INVALID and f"nested deeper than {cli.MAX_DEPTH} levels" in stderr, stderr
