"""sbatch templates (scripts/slurm/*.sbatch) filled with a site's parameters.

    python -c "from ops.placement import config, templates; r = config.load('examples/run.toml'); \
print(templates.render(r.sites['lumi'], r.path))"

Placeholders are `{{name}}` (bash's own `$` syntax stays untouched). A template that uses an
unknown placeholder, or misses `{{peer}}`, is an error naming the template. The job shape is not
in the template: `ops submit` passes it on the sbatch command line, which overrides #SBATCH lines,
so one template serves every shape the planner may choose.

A site is one torch.distributed job over its whole allocation: the template declares one Slurm
task per GPU (`{{ranks_per_node}}`, the shape's GPUs per node), the batch shell starts exactly
one peer, and `{{peer}}` tells that peer to start its trainer's ranks with `srun` over every node
of the job (`--launcher srun --nproc-per-node N`, peer/trainer/launch.py).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from ops.placement.config import SiteSlurm

_PLACEHOLDER = re.compile(r"\{\{\s*([a-z_]+)\s*\}\}")


class TemplateError(ValueError):
    """A template or its parameters cannot produce a script."""


def values(site: SiteSlurm, config_path: Path, job: int | None = None) -> dict[str, str]:
    """What each placeholder becomes for `site` (`job`: the job's sequence number, ops autopilot)."""
    p = site.params
    config = p.remote_config or str(config_path)
    modules = ["module purge", *(f"module load {shlex.quote(m)}" for m in p.modules)] if p.modules else []
    ranks = site.shape.gpus_per_node or 1  # CPU-only shapes (test clusters): one rank per node
    return {
        "ranks_per_node": str(ranks),
        "site": site.name,
        "job_name": f"sitemesh-{site.name}",
        "signal_seconds": str(p.signal_seconds),
        "chdir": f"#SBATCH --chdir={p.workdir}" if p.workdir else "# (works in the directory sbatch ran in)",
        "modules": "\n".join(modules) or "# (no modules configured)",
        "env": "\n".join(f"export {k}={shlex.quote(v)}" for k, v in p.env) or "# (no extra environment)",
        "setup": "\n".join(p.setup) or "# (no setup lines)",
        # The peer command is the user's shell text (it may be a path or `python -m peer.cli serve`);
        # only the values we add are quoted.
        "peer": f"{p.peer_command} --config {shlex.quote(config)} --site {shlex.quote(site.name)} "
                f"--launcher srun --nproc-per-node {ranks} --leave-before {p.leave_before}"
                + (f" --job {job}" if job is not None else ""),
    }


def render_text(text: str, fill: dict[str, str], where: str) -> str:
    used = set(_PLACEHOLDER.findall(text))
    unknown = sorted(used - set(fill))
    if unknown:
        raise TemplateError(
            f"{where}: unknown placeholder(s) {', '.join(unknown)}; known: {', '.join(sorted(fill))}"
        )
    if "peer" not in used:
        raise TemplateError(f"{where}: has no {{{{peer}}}} placeholder, so it would not start the peer")
    return _PLACEHOLDER.sub(lambda m: fill[m.group(1)], text)


def render(site: SiteSlurm, config_path: Path, job: int | None = None) -> str:
    """The batch script for `site`, ready for `sbatch`; `job` makes its peer that job's member."""
    template = site.params.template
    if template is None:
        raise TemplateError(f"[sites.{site.name}.slurm] has no template, so the site cannot be submitted to")
    try:
        text = template.read_text()
    except OSError as err:
        raise TemplateError(f"cannot read template {template} of site {site.name}: {err.strerror}") from err
    return render_text(text, values(site, config_path, job), str(template))
