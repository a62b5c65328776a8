"""`ops report`: one picture (or a text summary) of a run, from the sites' data dirs.

    ops report --data-dir runs/demo/X/snellius --data-dir runs/demo/X/lumi --out report.png
    ops report --data-dir ... --format md
    ops report --data-dir runs/X/lumi --data-dir runs/X/snellius --autopilot-state run.toml.autopilot.json --format md

Reads, per data dir: `timeline.jsonl` (each site's own rounds: phases, tokens, loss, and the
held-out perplexity of θ where that site evaluated it during the run, `peer serve --eval-every`;
peer/core/timeline.py), the lease ledger (`leases/ledger.jsonl`: grants, reclaims, steals this site
logged as a block's owner) and, from the first dir, the commit log (joins, graceful leaves and
crashes are voter changes) and the round checkpoints for held-out perplexity when
`--heldout-documents` says which corpus slice to evaluate on (θ is the same at every site, I7: one
curve of each kind, whichever site measured it).

`--reference FILE` is a centralised run's held-out perplexity by tokens trained, drawn at the
tokens the mesh had committed at each of its held-out points (log-perplexity interpolated linearly
in tokens between the reference's points, never extrapolated), so the two compare at equal data:

    [{"tokens": 1048576, "perplexity": 812.5}, {"tokens": 2097152, "perplexity": 401.2}]   # .json
    tokens,perplexity                                                                     # any other
    1048576,812.5                                                                         # suffix: CSV

Panels: loss per site; held-out perplexity (in-run, checkpoints, reference); seconds per round per
site, compute vs overhead stacked; overhead share per site; tokens per site (cumulative); lease
events per site. Membership events are vertical lines on the per-round panels. Where the peers kept
job records (`jobs/*.json` in a data dir and in its job members' `jN/`, peer/job_record.py), a
panel of jobs per site over time, and in the text the allocation accounting (ops/accounting.py).
`--autopilot-state FILE` (the operator loop's state file, `ops autopilot --state`, by default
`<run file>.autopilot.json`) adds the jobs Slurm ended before their peer wrote a record (a batch
script that failed first), their whole allocation under "no peer"; only jobs of the sites whose
data dirs are given, matched to the records by site and Slurm job id.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ops import accounting, jobs_panel
from ops.audit import read_ledger
from ops.autopilot.keeper import Job
from ops.autopilot.state import AutopilotState
from peer import job_record, timeline_file
from peer.core.commitlog import RoundCommit, VoterChange
from peer.core.site_names import site_of
from peer.logstore import CorruptStore, FileStore
from peer.core.timeline import RoundTimeline

EXIT_INPUT = 2
MAX_EVALUATED = 12
"""Checkpoints evaluated for the perplexity panel at most (evenly spaced, the last one included)."""
LEASE_KINDS = ("grant", "reclaim", "steal")


@dataclass(frozen=True)
class MemberEvent:
    round: int
    """The last round committed before the voter change."""
    site: str
    kind: str
    """join, leave (graceful) or crash (declared dead)."""


@dataclass
class ReportData:
    """Everything the report draws, by panel (what tests check)."""

    sites: list[str]
    timelines: dict[str, list[RoundTimeline]]
    members: list[MemberEvent] = field(default_factory=list)
    perplexity: list[tuple[int, float]] = field(default_factory=list)
    """(round, held-out perplexity) of the evaluated checkpoints; empty when not evaluated."""
    leases: dict[str, dict[str, int]] = field(default_factory=dict)
    """site -> lease event kind -> count, as that site logged them as owner."""
    reference: list[tuple[int, float]] = field(default_factory=list)
    """(tokens, perplexity) of a centralised run (--reference), by tokens; empty without one."""
    jobs: list[job_record.JobRecord] = field(default_factory=list)
    """The job records of every member dir (a site's and its jobs' jN/), for the accounting."""
    slurm_jobs: list[Job] = field(default_factory=list)
    """The operator loop's jobs of the report's sites (--autopilot-state): those with no record count."""
    unreported: list[str] = field(default_factory=list)
    """Sites the loop's state has jobs of but no data dir was given for: left out of the accounting."""

    def allocations(self) -> accounting.Accounting | None:
        """The allocation accounting of the run's jobs; None when there is no job to account."""
        acc = accounting.account(self.jobs, self.slurm_jobs)
        return acc if acc.total.jobs or acc.unended else None

    def heldout(self) -> list[tuple[int, float]]:
        """(round, perplexity) of θ evaluated during the run, by round: θ is the same at every site,
        so each round's first evaluation counts, whichever site made it."""
        points: dict[int, float] = {}
        for site in self.sites:
            for r in self.timelines[site]:
                if r.heldout_perplexity is not None:
                    points.setdefault(r.round, r.heldout_perplexity)
        return sorted(points.items())

    def committed_tokens(self) -> dict[int, int]:
        """round -> tokens the run had committed through it: the least any site's record says (a
        site lagging the log may count the next round's too)."""
        out: dict[int, int] = {}
        for recs in self.timelines.values():
            for r in recs:
                if r.committed_tokens is not None:
                    out[r.round] = min(out.get(r.round, r.committed_tokens), r.committed_tokens)
        return out

    def reference_at(self) -> list[tuple[int, int, float]]:
        """(round, tokens, reference perplexity) at the tokens of every round with a held-out point
        (in-run or checkpoint), within the reference's range."""
        tokens = self.committed_tokens()
        rounds = sorted({r for r, _ in self.heldout()} | {r for r, _ in self.perplexity})
        out = []
        for rnd in rounds:
            if rnd in tokens and (ppl := interpolate(self.reference, tokens[rnd])) is not None:
                out.append((rnd, tokens[rnd], ppl))
        return out

    def loss(self, site: str) -> list[tuple[int, float]]:
        return [(r.round, r.loss) for r in self.timelines[site] if r.tokens > 0 and not math.isnan(r.loss)]

    def tokens_cumulative(self, site: str) -> list[tuple[int, int]]:
        out, total = [], 0
        for r in self.timelines[site]:
            total += r.tokens
            out.append((r.round, total))
        return out

    def seconds(self, site: str) -> list[tuple[int, float, float]]:
        """(round, compute seconds, overhead seconds) per round."""
        return [(r.round, r.compute_s, r.wall_s - r.compute_s) for r in self.timelines[site]]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="a PNG (or markdown) report of a run from its sites' data dirs")
    p.add_argument("--data-dir", required=True, action="append", type=Path, metavar="DIR",
                   help="a site's data directory (repeatable; the first one's log gives membership events)")
    p.add_argument("--out", type=Path, default=Path("report.png"), help="where the PNG goes (default report.png)")
    p.add_argument("--format", choices=("png", "md"), default="png", help="png picture or md text summary")
    p.add_argument("--heldout-documents", type=int, default=0, metavar="N",
                   help="evaluate the round checkpoints on the held-out split of the shipped corpus cut to "
                        "N documents (what `peer serve --max-documents N` trained on); 0: only the in-run points")
    p.add_argument("--reference", type=Path, metavar="FILE",
                   help="a centralised run's held-out perplexity by tokens (JSON [{tokens, perplexity}, ...] or "
                        "CSV tokens,perplexity), drawn at the tokens the mesh had committed at each held-out point")
    p.add_argument("--autopilot-state", type=Path, metavar="FILE",
                   help="the operator loop's state file (ops autopilot --state; default <run file>.autopilot.json): "
                        "its jobs that Slurm ended with no peer record count in the accounting, whole allocation "
                        "as 'no peer'")
    p.set_defaults(func=_report)


def read_reference(path: Path) -> list[tuple[int, float]]:
    """(tokens, perplexity) points of a reference file (module docstring), sorted by tokens."""
    text = path.read_text(encoding="utf-8")
    rows = json.loads(text) if path.suffix == ".json" else list(csv.DictReader(text.splitlines()))
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise ValueError(f"{path}: expected a list of {{tokens, perplexity}} points")
    try:
        points = sorted((int(row["tokens"]), float(row["perplexity"])) for row in rows)
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{path}: every point needs tokens and perplexity ({err!r})") from None
    if not points or any(not (math.isfinite(p) and p > 0) for _, p in points):
        raise ValueError(f"{path}: no points, or a perplexity that is not a positive number")
    return points


def interpolate(points: list[tuple[int, float]], tokens: int) -> float | None:
    """The perplexity `points` (sorted by tokens) give at `tokens`, log-linearly between the two
    around it; None outside their range."""
    for (t0, p0), (t1, p1) in zip(points, points[1:]):
        if t0 <= tokens <= t1:
            w = 0.0 if t1 == t0 else (tokens - t0) / (t1 - t0)
            return math.exp((1 - w) * math.log(p0) + w * math.log(p1))
    return points[0][1] if len(points) == 1 and points[0][0] == tokens else None


def _report(args: argparse.Namespace) -> int:
    try:
        data = collect(args.data_dir, args.heldout_documents, args.reference, args.autopilot_state)
    except (OSError, ValueError, KeyError, CorruptStore) as err:
        print(f"ops: error: cannot read the report input: {err}", file=sys.stderr)
        return EXIT_INPUT
    if not any(data.timelines.values()):
        print("ops: error: no round timeline in any data dir (timeline.jsonl): has a round been applied? "
              "Give each site's --data-dir.", file=sys.stderr)
        return EXIT_INPUT
    if args.format == "md":
        print(markdown(data))
    else:
        render(data, args.out)
        print(f"report written to {args.out}")
        if data.unreported:
            print(f"ops report: {_unreported(data)}", file=sys.stderr)
    return 0


def collect(data_dirs: list[Path], heldout_documents: int = 0, reference: Path | None = None,
            autopilot_state: Path | None = None) -> ReportData:
    """Reads the data dirs; the site of a dir is the one its timeline names (else the dir's name).
    With the loop's `autopilot_state`, its jobs of those sites (and of the sites the records name)."""
    timelines: dict[str, list[RoundTimeline]] = {}
    leases: dict[str, dict[str, int]] = {}
    for d in data_dirs:
        if not d.is_dir():
            raise ValueError(f"{d} is not a directory: give each site's --data-dir")
        records = timeline_file.read(d)
        site = records[0].site if records else d.name
        timelines[site] = records
        kinds = Counter(e.kind.value for e in read_ledger(d))
        leases[site] = {k: kinds.get(k, 0) for k in LEASE_KINDS}
    jobs = [r for d in data_dirs for member in (d, *sorted(d.glob("j[0-9]*"))) for r in job_record.read_dir(member)]
    data = ReportData(sorted(timelines), timelines, _member_events(data_dirs[0]), leases=leases, jobs=jobs)
    if autopilot_state is not None:
        reported = set(timelines) | {site_of(r.member) for r in jobs}
        loop_jobs = AutopilotState.read(autopilot_state).jobs.values()
        data.slurm_jobs = [j for j in loop_jobs if j.site in reported]
        data.unreported = sorted({j.site for j in loop_jobs} - reported)
    if heldout_documents > 0:
        data.perplexity = _perplexity(data_dirs[0], heldout_documents)
    if reference is not None:
        data.reference = read_reference(reference)
    return data


def _member_events(data_dir: Path) -> list[MemberEvent]:
    store = data_dir / "consensus"
    if not store.is_dir():
        return []
    out, last_round = [], 0
    for entry in FileStore(store).reload().entries:
        body = entry.body
        if isinstance(body, RoundCommit):
            last_round = body.round
        elif isinstance(body, VoterChange) and body.reason != "bootstrap":
            kind = "join" if body.add else "crash" if body.reason.startswith("dead") else "leave"
            out.append(MemberEvent(last_round, body.site, kind))
    return out


def heldout_samples(documents: int, wanted: int = 64):  # -> torch.Tensor (lazy torch: `ops` starts fast)
    """Held-out samples of the shipped corpus cut to `documents` (what the sites never train):
    `wanted`, or the largest power-of-two share of it that a small slice holds."""
    from peer.trainer.blocks import BlockIndex
    from peer.trainer.config import DataConfig

    corpus = BlockIndex(DataConfig.shipped(max_documents=documents)).corpus
    n = wanted
    while True:
        try:
            return corpus.heldout(n)
        except ValueError:
            if n == 1:
                raise
            n //= 2


def checkpoint_perplexity(path: Path, heldout) -> float:
    """Held-out perplexity of a checkpoint, loaded the way a user would (from_pretrained)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from peer.trainer.evaluate import perplexity

    hf_logging.disable_progress_bar()  # one bar per checkpoint would bury the demo's narration
    model = AutoModelForCausalLM.from_pretrained(path)
    return perplexity(model, heldout, torch.device("cpu"), bf16=False)


def untrained_perplexity(preset: str, documents: int) -> float:
    """Held-out perplexity of the seeded initial model every site starts from (θ_0)."""
    import torch

    from peer.trainer.config import MODEL_PRESETS
    from peer.trainer.evaluate import perplexity
    from peer.trainer.model import build_model

    cpu = torch.device("cpu")
    model = build_model(MODEL_PRESETS[preset], cpu, seed=0)
    return perplexity(model, heldout_samples(documents), cpu, bf16=False)


def _perplexity(data_dir: Path, documents: int) -> list[tuple[int, float]]:
    ckpts = sorted((data_dir / "checkpoints").glob("round-*"))
    if not ckpts:
        return []
    step = max(1, math.ceil(len(ckpts) / MAX_EVALUATED))
    chosen = ckpts[::-1][::step][::-1]  # evenly spaced, always the newest
    heldout = heldout_samples(documents)
    return [(int(p.name.removeprefix("round-")), checkpoint_perplexity(p, heldout)) for p in chosen]


_MARK = {"join": ("tab:green", "join"), "leave": ("tab:orange", "graceful leave"), "crash": ("tab:red", "crash")}


def render(data: ReportData, out: Path) -> None:
    """Draws the panels into a PNG at `out`."""
    import matplotlib.pyplot as plt

    fig = figure(data)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)


def figure(data: ReportData):  # -> matplotlib Figure (lazy matplotlib: `ops` starts fast)
    """The report's panels, in a figure of 2 x 3 axes (the held-out perplexity is the second), and
    below them, where there are job records, the jobs per site over time across the width."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    acc = data.allocations()
    rows = 3 if acc is not None else 2
    fig = plt.figure(figsize=(18, 9.5 * rows / 2), constrained_layout=True)
    grid = fig.add_gridspec(rows, 3)
    (ax_loss, ax_ppl, ax_time), (ax_over, ax_tok, ax_lease) = [[fig.add_subplot(grid[r, c]) for c in range(3)]
                                                               for r in range(2)]
    if acc is not None:
        jobs_panel.draw(fig.add_subplot(grid[2, :]), acc)
    n = max(len(data.sites), 1)
    width = 0.8 / n
    for i, site in enumerate(data.sites):
        color = f"C{i}"
        if pts := data.loss(site):
            ax_loss.plot(*zip(*pts), marker=".", color=color, label=site)
        secs = data.seconds(site)
        if secs:
            rounds, compute, overhead = zip(*secs)
            x = [r - 0.4 + width * (i + 0.5) for r in rounds]
            ax_time.bar(x, compute, width, color=color, label=f"{site} compute")
            ax_time.bar(x, overhead, width, bottom=compute, color=color, alpha=0.35, hatch="//",
                        label=f"{site} overhead")
            ax_over.plot(rounds, [100 * r.overhead_share for r in data.timelines[site]], marker=".",
                         color=color, label=site)
        if toks := data.tokens_cumulative(site):
            ax_tok.plot(*zip(*toks), color=color, label=site)
    if not any(data.loss(s) for s in data.sites):
        ax_loss.text(0.5, 0.5, "no loss recorded", ha="center", va="center", transform=ax_loss.transAxes)
    _heldout_panel(ax_ppl, data)
    xs = range(len(data.sites))
    bottom = [0] * len(data.sites)
    for kind, color in zip(LEASE_KINDS, ("tab:blue", "tab:orange", "tab:red")):
        counts = [data.leases.get(s, {}).get(kind, 0) for s in data.sites]
        ax_lease.bar(xs, counts, bottom=bottom, color=color, label=kind)
        bottom = [b + c for b, c in zip(bottom, counts)]
    ax_lease.set_xticks(list(xs), data.sites)
    for ax in (ax_loss, ax_ppl, ax_time, ax_over, ax_tok):
        seen = set()
        for ev in data.members:
            color, label = _MARK[ev.kind]
            ax.axvline(ev.round + 0.5, color=color, linestyle="--", linewidth=1,
                       label=f"{label}" if label not in seen else None)
            seen.add(label)
    titles = (
        (ax_loss, "Inner loss per site", "round", "mean inner loss"),
        (ax_ppl, "Held-out perplexity", "round", "perplexity (log)"),
        (ax_time, "Seconds per round: compute vs overhead", "round", "seconds"),
        (ax_over, "Overhead share (1 - compute / wall)", "round", "% of the round"),
        (ax_tok, "Tokens trained per site (cumulative)", "round", "tokens"),
        (ax_lease, "Lease events logged by each owner", "site", "blocks"),
    )
    for ax, title, xlabel, ylabel in titles:
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small", ncols=2 if ax is ax_time else 1)
    last_round = max((r.round for rs in data.timelines.values() for r in rs), default=0)
    fig.suptitle(f"sitemesh run: {len(data.sites)} sites ({', '.join(data.sites)}), {last_round} rounds", fontsize=14)
    return fig


def _heldout_panel(ax, data: ReportData) -> None:  # ax: matplotlib Axes (lazy matplotlib)
    """θ's held-out perplexity by round: evaluated during the run, from checkpoints, and the
    centralised reference at the tokens the mesh had committed at those rounds."""
    if pts := data.heldout():
        ax.plot(*zip(*pts), marker="s", color="black", label="θ during the run")
    if data.perplexity:
        ax.plot(*zip(*data.perplexity), marker="o", color="tab:gray", label="θ checkpoints")
    if ref := data.reference_at():
        rounds, _, ppl = zip(*ref)
        ax.plot(rounds, ppl, marker="x", linestyle="--", color="tab:purple",
                label="centralised reference, same tokens")
    if pts or data.perplexity:
        ax.set_yscale("log")
    else:
        ax.text(0.5, 0.5, "not evaluated\n(peer serve --eval-every N,\nops report --heldout-documents N)",
                ha="center", va="center", transform=ax.transAxes)


def markdown(data: ReportData) -> str:
    """A text summary: one row per site, then the membership events, the perplexity points and
    the allocation accounting."""
    lines = [("| site | rounds | trained | tokens | compute s | overhead s | overhead | tokens/s | last loss | "
              "grants | reclaims | steals |"), "|---" * 12 + "|"]
    for site in data.sites:
        recs = data.timelines[site]
        wall = sum(r.wall_s for r in recs)
        compute = sum(r.compute_s for r in recs)
        tokens = sum(r.tokens for r in recs)
        loss = data.loss(site)
        lease = data.leases.get(site, {})
        lines.append(f"| {site} | {len(recs)} | {sum(1 for r in recs if r.tokens)} | {tokens} | {compute:.1f} | "
                     f"{wall - compute:.1f} | {100 * (1 - compute / wall) if wall else 0:.0f}% | "
                     f"{tokens / wall if wall else 0:.0f} | {loss[-1][1] if loss else float('nan'):.3f} | "
                     f"{lease.get('grant', 0)} | {lease.get('reclaim', 0)} | {lease.get('steal', 0)} |")
    if data.members:
        lines += ["", "Membership: " + "; ".join(f"{e.site} {e.kind} after round {e.round}" for e in data.members)]
    if data.perplexity:
        lines += ["", "Held-out perplexity: " + ", ".join(f"round {r}: {p:.1f}" for r, p in data.perplexity)]
    if in_run := data.heldout():
        committed = data.committed_tokens()
        reference = {r: p for r, _, p in data.reference_at()}
        lines += ["", "Held-out perplexity during the run: " + ", ".join(
            f"round {r}" + (f" ({committed[r]} tokens)" if r in committed else "") + f": {p:.1f}"
            + (f" (reference {reference[r]:.1f}, ratio {p / reference[r]:.3f})" if r in reference else "")
            for r, p in in_run)]
    if (acc := data.allocations()) is not None:
        lines += ["", "Allocations:", "", accounting.table(acc)]
    if data.unreported:
        lines += ["", _unreported(data)]
    return "\n".join(lines)


def _unreported(data: ReportData) -> str:
    return (f"The operator loop's state has jobs of {', '.join(data.unreported)}, whose data dirs were not given: "
            "left out of the accounting (give each site's --data-dir).")
