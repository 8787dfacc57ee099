"""The trajectory viewer: one static HTML page showing what the agents of a run did.

``relayrl view RUN_DIR [--step N] [--groups-per-step K] [--output FILE]`` reads the groups committed
on the run's bus and the trainer's ledger (which step trained each group, or dropped it and why) and
writes a single self-contained page (no server, no network: styles, script and data inline) that
works offline. For every sampled group it shows each trajectory: the prompt; every turn, generated
tokens shaded by their probability or by the size of their kept top-p set; tool calls with their
arguments; results (cut to a few lines, the rest behind a click) with their exit status and wall
time; compaction summaries; the reward, its components and the grader's report; detector flags with
their evidence; and the policy version of each generated span with its staleness when trained.
Filters: reward range, flagged only, compacted only, minimum length.

The run report (``relayrl report``) writes the same page next to ``report.html`` and links it.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

__all__ = ["collect_groups", "render_page", "trajectory_record", "write_viewer"]

MAX_RESULT_CHARS = 4000
"""Characters of one tool result kept in the page (the viewer is for looking, not for archiving)."""


def _token_texts(tokenizer: Any, token_ids: list[int]) -> list[str]:
    return [tokenizer.decode([token]) for token in token_ids]


def _span_record(span: Any, tokenizer: Any, trained_version: int | None) -> dict[str, Any]:
    ids = [int(token) for token in span.token_ids()]
    logprobs = [float(value) for value in span.token_logprobs()]
    versions = span.token_versions()
    kept = [len(span.kept_set(index)) for index in range(len(ids))] if span.has_kept_sets else [0] * len(ids)
    low, high = (min(versions), max(versions)) if versions else (0, 0)
    return {"tokens": _token_texts(tokenizer, ids), "p": [round(math.exp(value), 4) for value in logprobs],
            "kept": kept, "versions": [low, high],
            "staleness": None if trained_version is None or not versions else trained_version - low}


def trajectory_record(trajectory: Any, tokenizer: Any, *, trained_version: int | None = None) -> dict[str, Any]:
    """A trajectory as the page's JSON: its turns, tool calls and results, rewards, flags, costs."""
    segments = []
    generated = 0
    for segment in trajectory.segments:
        turns = []
        for turn in segment.turns:
            record: dict[str, Any] = {"role": turn.role}
            if turn.generated is not None:
                record["span"] = _span_record(turn.generated, tokenizer, trained_version)
                generated += len(record["span"]["tokens"])
            else:
                record["text"] = turn.text if turn.text is not None else tokenizer.decode(list(turn.context_token_ids()))
            if turn.tool_calls:
                record["calls"] = [{"id": call.id, "name": call.name, "arguments": call.arguments} for call in turn.tool_calls]
            if turn.tool_results:
                record["results"] = [{"id": result.call_id, "exit": result.exit_status, "s": round(result.wall_time_s, 3),
                                      "error": result.error, "truncated": result.truncated,
                                      "output": (result.output or "")[:MAX_RESULT_CHARS]} for result in turn.tool_results]
            turns.append(record)
        segments.append({"reason": segment.reason, "summary": segment.summary, "turns": turns})
    timings = trajectory.timings
    return {"id": trajectory.trajectory_id, "task": trajectory.task_id, "reward": trajectory.reward,
            "components": dict(trajectory.reward_components), "status": trajectory.status, "error": trajectory.error,
            "flags": [{"detector": flag.detector, "evidence": flag.evidence} for flag in trajectory.cheating],
            "metrics": dict(trajectory.metrics), "engines": list(trajectory.engine_ids), "generated": generated,
            "timings": {"generation_s": round(timings.generation_s, 3), "tool_s": round(timings.tool_s, 3),
                        "wall_s": round(max(0.0, timings.finished_at - timings.started_at), 3)},
            "segments": segments}


def collect_groups(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every group committed on the run's bus with what became of it: ``{ref, group, step, outcome}``."""
    from relayrl.buffer.segments import GroupRef, parse_segment_key
    from relayrl.cli.run.layout import RunLayout
    from relayrl.cli.run.ledger import read_ledger
    from relayrl.core import codec, wire

    layout = RunLayout(run_dir)
    config = layout.load_config()
    bus = layout.bus(config)
    outcome: dict[str, tuple[int, str]] = {}
    for step, record in read_ledger(run_dir).items():
        for ref in record["trained"]:
            outcome[ref] = (step, "trained")
        for ref, why in record["dropped"]:
            outcome[ref] = (step, f"dropped: {why}")
    prefix = config.buffer.prefix.strip("/")
    groups = []
    for key in sorted(bus.list(f"{prefix}/")):
        parsed = parse_segment_key(prefix, key)
        if parsed is None:
            continue
        segment = codec.decode_compressed(bus.get(key), wire.RolloutSegment, what=key)
        for index, group in enumerate(segment.groups):
            ref = str(GroupRef(parsed[0], parsed[1], index))
            step, what = outcome.get(ref, (None, "pending"))
            groups.append({"ref": ref, "group": group, "step": step, "outcome": what})
    return groups


def write_viewer(run_dir: str | Path, output: str | Path | None = None, *, step: int | None = None,
                 groups_per_step: int = 2, max_groups: int = 200, groups: list[dict[str, Any]] | None = None) -> Path:
    """Write the viewer page of ``run_dir`` (default ``RUN_DIR/report/trajectories.html``); return its path.

    With ``step``, every group that step trained or dropped; otherwise ``groups_per_step`` groups of
    each step (and pending ones), at most ``max_groups`` in all, spread over the whole run.
    ``groups``: what :func:`collect_groups` returned, for a caller that already read them.
    """
    from relayrl.rollout.models import load_tokenizer

    run_dir = Path(run_dir)
    tokenizer = load_tokenizer(run_dir / "model")
    groups = collect_groups(run_dir) if groups is None else groups
    if step is not None:
        chosen = [entry for entry in groups if entry["step"] == step]
    else:
        by_step: dict[Any, list[dict[str, Any]]] = {}
        for entry in groups:
            by_step.setdefault(entry["step"], []).append(entry)
        chosen = [entry for entries in by_step.values() for entry in entries[:groups_per_step]]
        if len(chosen) > max_groups:  # spread over the run rather than keep its beginning
            stride = len(chosen) / max_groups
            chosen = [chosen[int(index * stride)] for index in range(max_groups)]
    versions = _versions_by_step(run_dir)
    data = []
    for entry in chosen:
        trained_version = versions.get(entry["step"]) if entry["outcome"] == "trained" else None
        group = entry["group"]
        data.append({"ref": entry["ref"], "task": group.task_id, "step": entry["step"], "outcome": entry["outcome"],
                     "trajectories": [trajectory_record(trajectory, tokenizer, trained_version=trained_version)
                                      for trajectory in group.trajectories]})
    path = Path(output) if output is not None else run_dir / "report" / "trajectories.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_page(run_dir.name, data))
    return path


def _versions_by_step(run_dir: Path) -> dict[int, int]:
    """The policy version each step trained (its metrics' ``trainer/version`` before the update)."""
    from relayrl.trainer.metrics import read_metrics

    versions = {}
    for record in read_metrics(run_dir):
        version = record["metrics"].get("trainer/version")
        if version is not None:
            versions[int(record["step"])] = int(version) - 1  # the metric is the version the step produced
    return versions


def render_page(title: str, data: list[dict[str, Any]]) -> str:
    """The self-contained viewer page of ``data``: one ``{ref, task, step, outcome, trajectories}`` per
    group, each trajectory a :func:`trajectory_record` (``relayrl eval`` writes its samples with it)."""
    payload = json.dumps(data).replace("</", "<\\/")  # no "</script>" can end the data early
    return (_TEMPLATE.replace("__TITLE__", html.escape(title)).replace("__DATA__", payload))


_TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>trajectories: __TITLE__</title>
<style>
body{font:14px system-ui,sans-serif;margin:0;display:flex;height:100vh}
#side{width:260px;padding:12px;border-right:1px solid #ddd;overflow:auto;flex:none}
#main{flex:1;overflow:auto;padding:12px}
label{display:block;margin:6px 0}
.group{border:1px solid #ccc;border-radius:6px;margin:10px 0;padding:8px}
.trajectory{border-top:1px solid #eee;padding:6px 0}
.trajectory>summary{cursor:pointer}
.turn{margin:4px 0 4px 12px;white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:12px}
.role{font-weight:bold;color:#555}
.tok{border-radius:2px}
.call{color:#0a4;}
.result{background:#f6f6f6;border-left:3px solid #aaa;padding:2px 6px;margin:2px 0}
.flag{color:#b00;font-weight:bold}
.summary{background:#fff7d6;padding:2px 6px}
.meta{color:#666;font-size:12px}
.bad{color:#b00}
</style></head><body>
<div id="side">
<h3>__TITLE__</h3>
<div id="count" class="meta"></div>
<label>reward from <input id="rmin" type="number" step="0.1" value="0" style="width:4em"> to
<input id="rmax" type="number" step="0.1" value="1" style="width:4em"></label>
<label><input id="flagged" type="checkbox"> flagged only</label>
<label><input id="compacted" type="checkbox"> compacted only</label>
<label>min generated tokens <input id="minlen" type="number" value="0" style="width:5em"></label>
<label>shade tokens by <select id="shade"><option value="p">probability</option>
<option value="kept">kept-set size</option></select></label>
<p class="meta">Darker tokens: less likely under the engine's sampling distribution, or sampled
from a larger kept set. Hover a token for its numbers.</p>
</div>
<div id="main"></div>
<script id="data" type="application/json">__DATA__</script>
<script>
const DATA = JSON.parse(document.getElementById("data").textContent);
const $ = (id) => document.getElementById(id);
function el(tag, cls, text) { const e = document.createElement(tag); if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text; return e; }
function shade(span, i, mode) {
  const v = mode === "p" ? 1 - span.p[i] : Math.min(1, Math.log2(1 + span.kept[i]) / 6);
  return `rgba(220, 80, 40, ${(0.6 * v).toFixed(3)})`;
}
function renderSpan(span, mode) {
  const box = el("span");
  span.tokens.forEach((t, i) => { const s = el("span", "tok", t); s.style.background = shade(span, i, mode);
    s.title = `p=${span.p[i]} kept=${span.kept[i]}`; box.appendChild(s); });
  return box;
}
function renderResult(r) {
  const box = el("div", "result");
  box.appendChild(el("div", "meta", `[${r.id}] exit=${r.exit} ${r.s}s` + (r.truncated ? " (truncated)" : "")));
  const text = r.error ? "error: " + r.error : r.output;
  const lines = text.split("\\n");
  if (lines.length > 6) { const d = el("details"); d.appendChild(el("summary", null, lines.slice(0, 6).join("\\n")));
    d.appendChild(el("div", null, lines.slice(6).join("\\n"))); box.appendChild(d); }
  else box.appendChild(el("div", null, text));
  return box;
}
function renderTrajectory(t, mode) {
  const d = el("details", "trajectory");
  const c = t.components, parts = Object.keys(c).map((k) => `${k}=${(+c[k]).toFixed(3)}`).join(" ");
  const compactions = t.metrics.compactions || 0;
  d.appendChild(el("summary", t.flags.length ? "bad" : null,
    `reward ${t.reward.toFixed(3)} (${parts}) | ${t.generated} tokens | ${t.segments.length} segment(s)` +
    ` | ${t.status}` + (t.flags.length ? " | FLAGGED" : "")));
  d.appendChild(el("div", "meta", `${t.id} | generation ${t.timings.generation_s}s, tools ${t.timings.tool_s}s,` +
    ` wall ${t.timings.wall_s}s | compactions ${compactions} | engines ${t.engines.join(", ")}`));
  const grade = Object.keys(t.metrics).filter((k) => k.startsWith("grade/"));
  if (grade.length) d.appendChild(el("div", "meta", "grader: " + grade.map((k) => `${k.slice(6)}=${t.metrics[k]}`).join(" ")));
  t.flags.forEach((f) => d.appendChild(el("div", "flag", `${f.detector}: ${f.evidence}`)));
  if (t.error) d.appendChild(el("div", "bad", t.error));
  t.segments.forEach((s, si) => {
    if (si > 0) d.appendChild(el("div", "summary", `segment ${si + 1} (${s.reason}) continues from: ${s.summary}`));
    s.turns.forEach((turn) => {
      if (!turn.span && !turn.results && !turn.text) return;  // an empty message renders to nothing
      const row = el("div", "turn");
      row.appendChild(el("span", "role", turn.role + ": "));
      if (turn.span) { row.appendChild(renderSpan(turn.span, mode));
        const st = turn.span.staleness === null ? "" : `, staleness ${turn.span.staleness}`;
        row.appendChild(el("div", "meta", `policy version ${turn.span.versions[0]}` +
          (turn.span.versions[1] !== turn.span.versions[0] ? `..${turn.span.versions[1]}` : "") + st)); }
      else if (!turn.results) row.appendChild(el("span", null, turn.text));
      (turn.calls || []).forEach((call) => row.appendChild(el("div", "call",
        `call ${call.id}: ${call.name}(${JSON.stringify(call.arguments)})`)));
      (turn.results || []).forEach((r) => row.appendChild(renderResult(r)));
      d.appendChild(row);
    });
  });
  return d;
}
function visible(t) {
  const lo = +$("rmin").value, hi = +$("rmax").value;
  return t.reward >= lo && t.reward <= hi && (!$("flagged").checked || t.flags.length > 0)
    && (!$("compacted").checked || t.segments.length > 1) && t.generated >= +$("minlen").value;
}
function render() {
  const main = $("main"), mode = $("shade").value; main.innerHTML = ""; let shown = 0, total = 0;
  DATA.forEach((g) => {
    const kept = g.trajectories.filter(visible); total += g.trajectories.length;
    if (!kept.length) return;
    const box = el("div", "group");
    box.appendChild(el("div", null, `step ${g.step === null ? "-" : g.step} | ${g.outcome} | group ${g.ref} | task ${g.task}`));
    kept.forEach((t) => { box.appendChild(renderTrajectory(t, mode)); shown += 1; });
    main.appendChild(box);
  });
  $("count").textContent = `${shown} of ${total} trajectories in ${DATA.length} groups`;
}
["rmin", "rmax", "flagged", "compacted", "minlen", "shade"].forEach((id) => $(id).addEventListener("input", render));
render();
if (location.hash === "#open") document.querySelectorAll(".trajectory").forEach((d, i) => { if (i < 2) d.open = true; });
</script></body></html>
"""
