"""The Dockerfile and .dockerignore, checked without a container engine.

No image is built here (there is no engine to build it): these tests check what the files
themselves say -- that the build context holds everything the Dockerfile copies and nothing
else worth leaving out, that the image runs ``kafscale serve`` as the non-root user the
Kubernetes manifests expect, on the broker's ports, and that its final stage builds nothing.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import yaml

from kafscale.settings import SETTINGS_BY_FIELD

ROOT = Path(__file__).resolve().parents[2]

Instruction = tuple[str, str]  # (keyword upper-cased, the rest of the line)


def instructions() -> list[Instruction]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    lines: list[str] = []
    pending = ""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    parsed: list[Instruction] = []
    for line in lines:
        keyword, _, rest = line.strip().partition(" ")
        parsed.append((keyword.upper(), " ".join(rest.split())))
    return parsed


def stages() -> list[list[Instruction]]:
    result: list[list[Instruction]] = []
    for keyword, rest in instructions():
        if keyword == "FROM":
            result.append([])
        assert result, "the Dockerfile does not start with FROM"
        result[-1].append((keyword, rest))
    return result


def glob_regex(glob: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regex (Go's filepath.Match, plus ``**`` for any depth)."""
    out, i = [], 0
    while i < len(glob):
        for token, regex in (("**/", "(?:.*/)?"), ("**", ".*"), ("*", "[^/]*"), ("?", "[^/]")):
            if glob.startswith(token, i):
                out.append(regex)
                i += len(token)
                break
        else:
            out.append(re.escape(glob[i]))
            i += 1
    return re.compile("".join(out))


def ignore_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    """.dockerignore as (excludes, regex) pairs, in order."""
    patterns = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            glob = line.removeprefix("!").strip().strip("/")
            patterns.append((not line.startswith("!"), glob_regex(glob)))
    return patterns


def in_context(path: str) -> bool:
    """Whether the build context holds ``path`` (relative to the repository): as Docker decides,
    the last pattern that matches the path or one of its parent directories wins."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    included = True
    for excludes, pattern in ignore_patterns():
        if any(pattern.fullmatch(candidate) for candidate in candidates):
            included = not excludes
    return included


def copy_sources(stage: list[Instruction]) -> list[str]:
    sources = []
    for keyword, rest in stage:
        if keyword == "COPY" and "--from=" not in rest:
            *paths, _destination = rest.split()
            sources.extend(path for path in paths if not path.startswith("--"))
    return sources


def test_two_stages_on_python_3_11_slim() -> None:
    froms = [stage[0][1] for stage in stages()]
    assert len(froms) >= 2
    assert all(re.fullmatch(r"python:3\.11-slim( AS \w+)?", line, re.I) for line in froms)
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == ">=3.11"


def test_every_copied_file_is_in_the_build_context() -> None:
    sources = [source for stage in stages() for source in copy_sources(stage)]
    assert sources
    for source in sources:
        path = ROOT / source
        assert path.exists(), source
        files = [path] if path.is_file() else [p for p in path.rglob("*.py")]
        assert files, source
        for file in files:
            assert in_context(file.relative_to(ROOT).as_posix()), file


def test_the_build_context_leaves_out_what_the_image_does_not_need() -> None:
    for path in (".git/HEAD", ".venv/bin/python", ".tools/bin/minio", "tests/conftest.py"):
        assert not in_context(path), path
    for path in ("bench/results/x.md", "docs/operations.md", "kafscale/__pycache__/cli.pyc"):
        assert not in_context(path), path
    assert in_context("kafscale/cli.py") and in_context("pyproject.toml")


def test_the_image_runs_kafscale_serve_as_the_manifests_user() -> None:
    final = dict(stages()[-1])
    assert json.loads(final["ENTRYPOINT"]) == ["kafscale"]
    assert json.loads(final["CMD"]) == ["serve"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kafscale"] == "kafscale.__main__:main"
    statefulset = next(
        doc
        for doc in yaml.safe_load_all((ROOT / "k8s" / "broker.yaml").read_text())
        if doc and doc["kind"] == "StatefulSet"
    )
    pod_security = statefulset["spec"]["template"]["spec"]["securityContext"]
    assert final["USER"] == str(pod_security["runAsUser"]) == "10001"


def test_the_image_exposes_the_brokers_ports() -> None:
    exposed = {int(port) for port in dict(stages()[-1])["EXPOSE"].split()}
    defaults = {int(SETTINGS_BY_FIELD[f].default) for f in ("broker_port", "metrics_port")}
    assert exposed == defaults


def test_only_the_build_stage_builds() -> None:
    *builds, final = stages()
    assert any(
        "pip wheel" in rest for stage in builds for keyword, rest in stage if keyword == "RUN"
    )
    runs = [rest for keyword, rest in final if keyword == "RUN"]
    assert runs
    for run in runs:
        assert not re.search(r"apt-get|apk |gcc|build-essential|pip wheel", run), run
        if "pip install" in run:
            # Wheels from the build stage only: nothing fetched, nothing compiled.
            assert "--no-index" in run and "--find-links=/wheels" in run, run
