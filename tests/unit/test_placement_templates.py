"""sbatch templates: placeholders, quoting, and the errors that name the template."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from ops.placement import config, templates
from ops.placement.templates import TemplateError

REPO = Path(__file__).resolve().parents[2]


def _site(**params: object) -> config.SiteSlurm:
    run = config.load(REPO / "examples/run.toml")
    site = run.sites["lumi"]
    return dataclasses.replace(site, params=dataclasses.replace(site.params, **params))  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["snellius", "lumi", "frontier"])
def test_example_sites_render_to_valid_bash(name: str) -> None:
    run = config.load(REPO / "examples/run.toml")
    script = templates.render(run.sites[name], run.path)
    assert "{{" not in script and "#SBATCH --signal=B:TERM@300" in script
    assert f"--site {name}" in script
    assert subprocess.run(["bash", "-n"], input=script, text=True, check=False).returncode == 0


def test_the_peer_leaves_on_its_own_before_the_end() -> None:
    """The peer times its own leave (`--leave-before`): at signal_seconds unless leave_seconds says."""
    assert "--nproc-per-node 8 --leave-before 300 --job 4" in templates.render(_site(), Path("run.toml"), job=4)
    script = templates.render(_site(signal_seconds=5, leave_seconds=40), Path("run.toml"))
    assert "#SBATCH --signal=B:TERM@5" in script and "--leave-before 40" in script


def test_values_are_quoted_for_the_shell() -> None:
    site = _site(
        env=(("MSG", "it's a $test"),),
        modules=("rocm/6.0.3",),
        remote_config="/p/run file.toml",
        workdir="/scratch/x",
    )
    script = templates.render(site, Path("unused.toml"))
    assert "export MSG='it'\"'\"'s a $test'" in script
    assert "module purge\nmodule load rocm/6.0.3" in script
    assert "--config '/p/run file.toml' --site lumi" in script
    assert "#SBATCH --chdir=/scratch/x" in script


def test_unknown_placeholder_names_the_template(tmp_path: Path) -> None:
    t = tmp_path / "bad.sbatch"
    t.write_text("#!/bin/bash\n{{peer}} {{gpus}}\n")
    with pytest.raises(TemplateError, match=rf"{t}: unknown placeholder\(s\) gpus"):
        templates.render(_site(template=t), Path("run.toml"))


def test_template_without_peer_is_refused(tmp_path: Path) -> None:
    t = tmp_path / "nopeer.sbatch"
    t.write_text("#!/bin/bash\necho {{site}}\n")
    with pytest.raises(TemplateError, match="has no {{peer}} placeholder"):
        templates.render(_site(template=t), Path("run.toml"))


def test_missing_template(tmp_path: Path) -> None:
    with pytest.raises(TemplateError, match="cannot read template .*missing.sbatch of site lumi"):
        templates.render(_site(template=tmp_path / "missing.sbatch"), Path("run.toml"))
    with pytest.raises(TemplateError, match="has no template"):
        templates.render(_site(template=None), Path("run.toml"))
