"""``relayrl report RUN_DIR``: a self-contained HTML (and Markdown) report of a run, with PNG plots.

Reads ``<run>/metrics.jsonl`` (one ``{"step", "time", "metrics"}`` object per line, the last record
of a step winning) and the run's events (``events/`` objects on the bus, ``RunEvent``), and writes
``<run>/report/report.html`` (plots embedded, opens anywhere), ``report.md`` and the PNG files.

Plots, each drawn only when the run recorded its metrics: reward (mean ± std), entropy (full
distribution and kept-set), train/inference mismatch KL (k1, k3), staleness histogram, response
length and turns, tokens/s (trainer and fleet), weight-sync timings. Monitor alarms are marked on
every plot and listed in a table. Needs matplotlib (relayrl's ``report`` extra).
"""

from __future__ import annotations

import base64
import html
import itertools
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relayrl.core import codec, wire
from relayrl.core.errors import RelayrlError
from relayrl.core.store import open_store

__all__ = ["Report", "load_run", "write_report"]


@dataclass
class Report:
    html_path: Path
    markdown_path: Path
    plots: list[Path]
    summary: dict[str, Any]


def load_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        raise RelayrlError(f"{run_dir}: no metrics.jsonl (is this a relayrl run directory?)")
    from relayrl.trainer.metrics import read_metrics

    return read_metrics(run_dir)  # lines of another shape are skipped, never fatal


def load_events(run_dir: Path) -> list[Any]:
    """The run's events from ``events/`` on the bus (an empty list when there are none)."""
    store = open_store(str(run_dir))
    events = []
    for key in store.list("events/"):
        try:
            events.append(codec.decode(store.get(key), wire.RunEvent, what=key))
        except RelayrlError:
            continue  # a foreign or damaged object does not stop the report
    return sorted(events, key=lambda event: event.time)


def load_run(run_dir: str | Path) -> tuple[list[dict[str, Any]], list[Any]]:
    run_dir = Path(run_dir)
    return load_metrics(run_dir), load_events(run_dir)


def _series(records: list[dict[str, Any]], name: str) -> tuple[list[int], list[float]]:
    steps, values = [], []
    for record in records:
        value = record["metrics"].get(name)
        if value is not None and math.isfinite(value):
            steps.append(record["step"])
            values.append(value)
    return steps, values


def _tenths(values: list[float]) -> tuple[float, float]:
    tenth = max(1, len(values) // 10)
    return sum(values[:tenth]) / tenth, sum(values[-tenth:]) / tenth


PLOTS: list[tuple[str, str, list[tuple[str, str]]]] = [
    ("reward", "Reward", [("reward/fleet_graded_mean", "every rollout, the grader's (before shapers)"),
                          ("reward/fleet_mean", "every rollout, shaped"), ("reward/mean", "trained batch")]),
    ("entropy", "Entropy (nats/token)", [("entropy/token_mean", "full distribution"), ("entropy/kept_mean", "kept-set")]),
    ("mismatch", "Train/inference mismatch KL", [("mismatch/kl_k1", "k1"), ("mismatch/kl_k3", "k3")]),
    ("lengths", "Response length and turns", [("response/tokens_mean", "tokens per trajectory"),
                                              ("response/turns_mean", "turns per trajectory")]),
    ("tools", "Tool use (every graded trajectory)", [("fleet/tool_calls_per_trajectory", "tool calls per trajectory"),
                                                      ("fleet/turns_per_trajectory", "turns per trajectory"),
                                                      ("fleet/parallel_turn_share", "share of turns with parallel calls"),
                                                      ("fleet/compacted_share", "share of trajectories compacted")]),
    ("throughput", "Throughput (tokens/s)", [("trainer/tokens_per_s", "trainer"), ("fleet/tokens_per_s", "rollout fleet")]),
    ("weight_sync", "Weight sync (s)", [("weight_sync/publish_s", "publish"),
                                        ("weight_sync/fetch_s", "fetch (slowest engine)"),
                                        ("weight_sync/apply_s", "apply pause (slowest engine)")]),
]


TENTH_COLUMNS = [
    ("reward/fleet_graded_mean", "reward (grader)"), ("reward/fleet_mean", "reward (shaped)"),
    ("fleet/tool_calls_per_trajectory", "tool calls"), ("fleet/parallel_turn_share", "parallel turns"),
    ("fleet/turns_per_trajectory", "turns"), ("fleet/compacted_share", "compacted"),
    ("fleet/tokens_per_trajectory", "tokens"), ("entropy/token_mean", "entropy"), ("fleet/tool_s_per_call", "s per call"),
]
"""Columns of the per-tenth table (those a run recorded): agentic runs are judged by these."""


def tenths_table(records: list[dict[str, Any]]) -> list[str]:
    """The run's steps in ten slices, the mean of each recorded column per slice (Markdown rows)."""
    columns = [(name, label) for name, label in TENTH_COLUMNS if _series(records, name)[1]]
    if len(records) < 10 or not columns:
        return []
    size = len(records) / 10
    rows = ["| steps | " + " | ".join(label for _, label in columns) + " |",
            "|---|" + "---|" * len(columns)]
    for tenth in range(10):
        chunk = records[round(tenth * size):round((tenth + 1) * size)]
        rows.append(f"| {chunk[0]['step']}-{chunk[-1]['step']} | " + " | ".join(_mean_cells(chunk, columns)) + " |")
    return rows


def _mean_cells(chunk: list[dict[str, Any]], columns: list[tuple[str, str]]) -> list[str]:
    """Each column's mean over ``chunk`` (3 decimals; empty where the chunk never recorded it)."""
    cells = []
    for name, _ in columns:
        _, values = _series(chunk, name)
        cells.append(f"{sum(values) / len(values):.3f}" if values else "")
    return cells


PHASE_COLUMNS = [
    ("reward/fleet_graded_mean", "reward (grader)"), ("fleet/shaping_per_trajectory", "length penalty"),
    ("fleet/tokens_per_trajectory", "tokens"), ("fleet/turns_per_trajectory", "turns"),
    ("fleet/tool_calls_per_trajectory", "tool calls"), ("fleet/parallel_turn_share", "parallel turns"),
]
"""Columns of the length-penalty table: the fleet's behaviour in budget steps against unconstrained ones."""


def length_penalty_table(records: list[dict[str, Any]]) -> list[str]:
    """Means of :data:`PHASE_COLUMNS` over the steps of each length-penalty phase kind (Markdown rows).

    Steps are attributed by the phase the trainer recorded (``length_penalty/budget_phase``); the
    fleet's behaviour lags a step or two behind a switch, so short phases blur the difference.
    """
    phases: dict[str, list[dict[str, Any]]] = {"unconstrained": [], "budget": []}
    for record in records:
        flag = record["metrics"].get("length_penalty/budget_phase")
        if flag is not None:
            phases["budget" if flag >= 0.5 else "unconstrained"].append(record)
    if not phases["budget"] or not phases["unconstrained"]:
        return []
    columns = [(name, label) for name, label in PHASE_COLUMNS if _series(records, name)[1]]
    rows = ["| phase | steps | " + " | ".join(label for _, label in columns) + " |",
            "|---|---|" + "---|" * len(columns)]
    for phase, chunk in phases.items():
        rows.append(f"| {phase} | {len(chunk)} | " + " | ".join(_mean_cells(chunk, columns)) + " |")
    return rows


def tool_use_table(trajectories: list[tuple[int, list[str]]]) -> list[str]:
    """Share of trajectories calling each tool, per tenth of the policy versions (Markdown rows).

    ``trajectories`` holds ``(policy version that began it, names of the tools it called)`` per
    trajectory. Which tools an agent keeps using, and which it drops, is what RL (or a length
    penalty) changes in its strategy; the per-tenth table counts calls, not which.
    """
    names = sorted({name for _, called in trajectories for name in called})
    if not trajectories or not names:
        return []
    first, last = min(version for version, _ in trajectories), max(version for version, _ in trajectories)
    width = max(1, -(-(last - first + 1) // 10))
    slices: dict[int, list[list[str]]] = {}
    for version, called in trajectories:
        slices.setdefault((version - first) // width, []).append(called)
    rows = ["| versions | trajectories | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for index in sorted(slices):
        chunk = slices[index]
        shares = [f"{sum(name in called for called in chunk) / len(chunk):.3f}" for name in names]
        low = first + index * width
        rows.append(f"| {low}-{min(last, low + width - 1)} | {len(chunk)} | " + " | ".join(shares) + " |")
    return rows


INTERRUPTIONS = ("restart", "resumed", "stopped", "lease-lost", "orphans", "weights-repaired")
"""Event kinds the report lists as interruptions of the run."""


def downtime(records: list[dict[str, Any]], events: list[Any]) -> tuple[float, list[str]]:
    """Seconds the run spent not training after an interruption, and one table row per interruption.

    A gap between two steps counts as downtime when an interruption event falls inside it; the
    downtime is the gap minus one typical step (the median gap), the time the step would have taken.
    """
    times = [record["time"] for record in records]
    gaps = sorted(later - earlier for earlier, later in itertools.pairwise(times))
    typical = gaps[len(gaps) // 2] if gaps else 0.0
    rows = ["| time (s into the run) | step | what | downtime s |", "|---|---|---|---|"]
    total = 0.0
    charged: set[int] = set()
    for event in sorted((event for event in events if event.kind in INTERRUPTIONS), key=lambda item: item.time):
        after = next((index for index, at in enumerate(times) if at > event.time), None)
        lost = 0.0
        if after is not None and after > 0 and after not in charged:  # one gap charged once, to its first event
            charged.add(after)
            lost = max(0.0, times[after] - times[after - 1] - typical)
            total += lost
        step = records[after - 1]["step"] if after else (records[-1]["step"] if after is None else 0)
        what = f"{event.source} {event.kind}: {event.message}".replace("|", "/")
        rows.append(f"| {event.time - times[0]:.0f} | {step} | {what} | {lost:.1f} |")
    return total, (rows if len(rows) > 2 else [])


CONFIG_SUMMARY = [("model", "model.path"), ("model init", "model.init"), ("dtype", "model.dtype"),
                  ("environment", "rollout.environment"), ("engine", "rollout.engine"), ("engines", "rollout.engines"),
                  ("router", "rollout.router"), ("group size", "rollout.group_size"),
                  ("trainer backend", "trainer.backend"), ("trainer ranks", "trainer.ranks"),
                  ("steps", "trainer.steps"), ("warm-up steps", "trainer.warmup.steps"),
                  ("batch groups", "buffer.batch_groups"), ("max staleness", "buffer.staleness.max_staleness"),
                  ("optimizer", "algo.optimizer"), ("sampling", "algo.sampling"), ("bus", "store.url"),
                  ("seed", "run.seed"), ("deterministic", "run.deterministic")]


def config_summary(run_dir: Path) -> list[str]:
    """A table of the run's main settings, from its resolved ``config.json`` (as started or resumed)."""
    import json

    try:
        raw = json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError):
        return []
    rows = ["| setting | value |", "|---|---|"]
    for label, dotted in CONFIG_SUMMARY:
        value: Any = raw
        for part in dotted.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value not in (None, "", {}):
            text = ", ".join(f"{key}={item}" for key, item in value.items()) if isinstance(value, dict) else value
            rows.append(f"| {label} | {str(text).replace('|', '/')} |")
    return rows if len(rows) > 2 else []


def _committed_groups(run_dir: str | Path) -> tuple[list[dict[str, Any]] | None, str]:
    """Every group committed to the run's bus (``relayrl.cli.view.collect_groups``), read once for the
    tool table and the viewer; or None and why they could not be read."""
    from relayrl.cli.view import collect_groups

    try:
        return collect_groups(run_dir), ""
    except (OSError, ValueError, KeyError, RelayrlError) as exc:
        return None, " ".join(str(exc).split())


def _tool_use(groups: list[dict[str, Any]]) -> list[tuple[int, list[str]]]:
    """``(version that began it, tools called)`` of every trajectory of ``groups``."""
    found = []
    for entry in groups:
        for trajectory in entry["group"].trajectories:
            spans = [turn.generated for segment in trajectory.segments for turn in segment.turns
                     if turn.generated is not None and turn.generated.versions]
            if spans:
                called = [call.name for segment in trajectory.segments for turn in segment.turns
                          for call in turn.tool_calls]
                found.append((spans[0].versions[0][0], called))
    return found


def _markdown_table_html(rows: list[str]) -> str:
    cells = [[html.escape(cell.strip()) for cell in row.strip("|").split("|")] for row in rows if not row.startswith("|---")]
    head, *body = cells
    return ("<table><tr>" + "".join(f"<th>{cell}</th>" for cell in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in body) + "</table>")


def write_report(run_dir: str | Path, output: str | Path | None = None) -> Report:
    """Write the report of ``run_dir`` into ``output`` (default ``<run_dir>/report``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise RelayrlError("relayrl report needs matplotlib: pip install matplotlib (relayrl's report extra)") from exc
    run_dir = Path(run_dir)
    records, events = load_run(run_dir)
    if not records:
        raise RelayrlError(f"{run_dir}/metrics.jsonl holds no step yet")
    out = Path(output) if output else run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    start_time = records[0]["time"]
    alarms = [event for event in events if event.kind == "alarm"]
    alarm_steps = [event.data.get("step") for event in alarms if isinstance(event.data.get("step"), int)]

    plots: list[tuple[str, Path, str]] = []
    missing: list[str] = []
    for key, title, series in PLOTS:
        present = [(name, label, *_series(records, name)) for name, label in series]
        present = [item for item in present if item[2]]
        if not present:
            missing.append(title)
            continue
        figure, axis = plt.subplots(figsize=(7, 3.2))
        for _name, label, steps, values in present:
            axis.plot(steps, values, label=label, linewidth=1.4)
        for step in alarm_steps:
            axis.axvline(step, color="tab:red", alpha=0.3, linewidth=0.8)
        axis.set_title(title)
        axis.set_xlabel("trainer step")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
        figure.tight_layout()
        path = out / f"{key}.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        plots.append((title, path, key))

    histogram: dict[int, float] = {}
    for record in records:
        for name, value in record["metrics"].items():
            match = re.fullmatch(r"staleness/hist/(-?\d+)", name)
            if match and value is not None:
                histogram[int(match.group(1))] = histogram.get(int(match.group(1)), 0.0) + value
    if histogram:
        figure, axis = plt.subplots(figsize=(7, 3.2))
        lags = sorted(histogram)
        axis.bar(lags, [histogram[lag] for lag in lags])
        axis.set_title("Staleness (policy versions behind the trainer), all steps")
        axis.set_xlabel("staleness")
        axis.set_ylabel("sequences")
        figure.tight_layout()
        path = out / "staleness.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        plots.insert(1, ("Staleness histogram", path, "staleness"))
    else:
        missing.append("Staleness histogram")

    evaluations = _held_out_evaluations(run_dir)
    if evaluations:
        plots.insert(0, ("Held-out evaluation ([eval])", _eval_plot(plt, evaluations, start_time, out), "eval"))

    # The fleet's reward counts every graded group (the grader's, before a length penalty lowers it);
    # the batch's is biased by the zero-variance filter.
    rewards, reward_source = [], ""
    for reward_source in ("reward/fleet_graded_mean", "reward/fleet_mean", "reward/mean"):
        _, rewards = _series(records, reward_source)
        if rewards:
            break
    _, entropy = _series(records, "entropy/token_mean")
    lost_s, interruptions = downtime(records, events)
    summary: dict[str, Any] = {"run": str(run_dir), "steps": len(records),
                               "wall_time_s": round(records[-1]["time"] - start_time, 1), "alarms": len(alarms)}
    if interruptions:  # a run that survived kills does not look clean: its wall time includes the downtime
        summary["interruptions"] = len(interruptions) - 2
        summary["restarts"] = sum(event.kind == "restart" for event in events)
        summary["downtime_s"] = round(lost_s, 1)
    if rewards:
        summary["reward_first_tenth"], summary["reward_last_tenth"] = (round(v, 4) for v in _tenths(rewards))
        summary["reward_metric"] = reward_source
    if entropy:
        summary["entropy_first_tenth"], summary["entropy_last_tenth"] = (round(v, 4) for v in _tenths(entropy))
    if evaluations:
        summary["eval_pass@1_first"] = f"{evaluations[0]['pass@1']:.4f} (step {evaluations[0]['step']})"
        summary["eval_pass@1_last"] = f"{evaluations[-1]['pass@1']:.4f} (step {evaluations[-1]['step']})"

    markdown = ["# relayrl run report", "", "| | |", "|---|---|"]
    markdown += [f"| {key.replace('_', ' ')} | {value} |" for key, value in summary.items()]
    markdown += [""]
    for title, path, _ in plots:
        markdown += [f"## {title}", "", f"![{title}]({path.name})", ""]
    if missing:
        markdown += ["Not recorded in this run: " + ", ".join(missing) + ".", ""]
    markdown += ["## Monitor alarms", ""]
    markdown += ([f"- step {event.data.get('step', '?')}: {event.message}" for event in alarms] or ["None."])
    markdown += [""]
    if interruptions:
        markdown += ["## Interruptions (restarts, resumes) and their downtime", "", *interruptions, ""]
    settings = config_summary(run_dir)
    if settings:
        markdown += ["## Config", "", *settings, ""]
    tenths = tenths_table(records)
    if tenths:
        markdown += ["## Per tenth of the run", "", *tenths, ""]
    phases = length_penalty_table(records)
    if phases:
        markdown += ["## Length penalty: budget steps against unconstrained ones", "", *phases, ""]
    groups, groups_unreadable = _committed_groups(run_dir)
    tools = tool_use_table(_tool_use(groups or []))
    if tools:
        markdown += ["## Tools called (share of committed trajectories)", "", *tools, ""]
    markdown_path = out / "report.md"
    markdown_path.write_text("\n".join(markdown) + "\n")

    body = ["<h1>relayrl run report</h1><table>"]
    body += [f"<tr><th>{html.escape(key.replace('_', ' '))}</th><td>{html.escape(str(value))}</td></tr>"
             for key, value in summary.items()]
    body += ["</table>"]
    for title, path, _ in plots:
        encoded = base64.b64encode(path.read_bytes()).decode()
        body += [f"<h2>{html.escape(title)}</h2><img alt='{html.escape(title)}' src='data:image/png;base64,{encoded}'>"]
    if missing:
        body += [f"<p>Not recorded in this run: {html.escape(', '.join(missing))}.</p>"]
    if tenths:
        body += ["<h2>Per tenth of the run</h2>", _markdown_table_html(tenths)]
    if phases:
        body += ["<h2>Length penalty: budget steps against unconstrained ones</h2>", _markdown_table_html(phases)]
    if tools:
        body += ["<h2>Tools called (share of committed trajectories)</h2>", _markdown_table_html(tools)]
    body += ["<h2>Monitor alarms</h2><ul>"]
    body += [f"<li>step {html.escape(str(event.data.get('step', '?')))}: {html.escape(event.message)}</li>"
             for event in alarms] or ["<li>None.</li>"]
    body += ["</ul>"]
    if interruptions:
        body += ["<h2>Interruptions (restarts, resumes) and their downtime</h2>", _markdown_table_html(interruptions)]
    if settings:
        body += ["<h2>Config</h2>", _markdown_table_html(settings)]
    body += [_viewer_link(run_dir, out, groups, groups_unreadable)]
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>relayrl run report</title><style>"
            "body{font-family:sans-serif;max-width:60em;margin:2em auto}img{max-width:100%}"
            "th{text-align:left;padding-right:1em}</style></head><body>" + "\n".join(body) + "</body></html>")
    html_path = out / "report.html"
    html_path.write_text(page)
    return Report(html_path, markdown_path, [path for _, path, _ in plots], summary)


def _held_out_evaluations(run_dir: Path) -> list[dict[str, Any]]:
    """The run's ``[eval]`` results (``RUN_DIR/eval/run.jsonl``), in step order."""
    from relayrl.rollout.periodic_eval import read_results

    return sorted((result for result in read_results(run_dir / "eval") if "pass@1" in result),
                  key=lambda result: result["step"])


def _eval_plot(plt: Any, evaluations: list[dict[str, Any]], start_time: float, out: Path) -> Path:
    """pass@k of every held-out evaluation against the trainer step and against wall time."""
    ks = sorted({int(name[5:]) for result in evaluations for name in result if name.startswith("pass@")})
    figure, (by_step, by_time) = plt.subplots(1, 2, figsize=(9, 3.2), sharey=True)
    for k in ks:
        points = [(result["step"], (result["time"] - start_time) / 60, result[f"pass@{k}"])
                  for result in evaluations if f"pass@{k}" in result]
        by_step.plot([p[0] for p in points], [p[2] for p in points], marker="o", markersize=3, label=f"pass@{k}")
        by_time.plot([p[1] for p in points], [p[2] for p in points], marker="o", markersize=3, label=f"pass@{k}")
    by_step.set_xlabel("trainer step (at the evaluation's start)")
    by_time.set_xlabel("minutes since the first step")
    by_step.set_ylabel(f"held out, {evaluations[-1]['tasks']} tasks x {evaluations[-1]['samples'] // max(1, evaluations[-1]['tasks'])}")
    for axis in (by_step, by_time):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle("Held-out evaluation ([eval])")
    figure.tight_layout()
    path = out / "eval.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _viewer_link(run_dir: str | Path, out: Path, groups: list[dict[str, Any]] | None, unreadable: str) -> str:
    """Write the trajectory viewer beside the report and link it (or say in one line why not)."""
    from relayrl.cli.view import write_viewer

    if groups is None:
        return f"<p>No trajectory viewer: {html.escape(unreadable)}</p>"
    try:
        path = write_viewer(run_dir, out / "trajectories.html", groups=groups)
    except (OSError, ValueError, KeyError, RelayrlError) as exc:
        return f"<p>No trajectory viewer: {html.escape(' '.join(str(exc).split()))}</p>"
    return f"<h2>Trajectories</h2><p><a href='{path.name}'>Browse sampled trajectories</a> (also: relayrl view).</p>"
