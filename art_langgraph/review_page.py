"""One self-contained HTML page to review a model's training, for users without Langfuse.

`write_review_page(folder)` (and `art-langgraph report MODEL_DIR`) reads a model's
folder, as a backend writes it (`trajectories/{split}/{step}.jsonl`, `history.jsonl`,
`checkpoints/*/checkpoint.json`), and writes `review.html` there:

- the reward curves: the mean reward of every split per step, an inline SVG chart;
- each step's groups: trajectories, rewards, mean and spread (zero-variance groups,
  which GRPO cannot learn from, are flagged);
- every trajectory: its turns, tool calls, tool results and errors, reward, metrics, the
  RULER judge's explanation and the exception that ended it, if any;
- each completion's tokens shaded by their logprob (darker: the model was less sure),
  the probability on hover.

No CDN, no server, no external file: inline CSS, inline SVG, a few lines of inline
JavaScript (a filter for failures, a jump list, and `#t-<trajectory id>` in the URL opens
that trajectory). Tokens are decoded with the base
model's tokenizer (`tokenizer="auto"`, found through the checkpoints' `base_model`), or
shown as ids when it cannot be loaded.

Left out: training curves other than the reward (the history's other metrics are listed
per step, not drawn), images and other media, and editing (this page only reads).
"""

from __future__ import annotations

import html
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from art_langgraph.backend.checkpoints import CheckpointFolder
from art_langgraph.errors import UsageError
from art_langgraph.trajectories.trajectory import LLMCall, Trajectory, TrajectoryGroup, read_groups
from art_langgraph.utils import atomic_write

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:16px 24px;position:sticky;top:0;z-index:2}
header h1{margin:0 0 4px;font-size:20px} header p{margin:0;color:#c9d1e0}
#controls{margin-top:8px;display:flex;gap:16px;flex-wrap:wrap;align-items:center}
#controls input[type=number]{width:64px}
#jump a{color:#9cc3ff;margin-right:8px;text-decoration:none}
main{padding:16px 24px;max-width:1200px}
section{background:#fff;border:1px solid #dde1e8;border-radius:8px;padding:12px 16px;margin:0 0 16px}
h2{font-size:17px;margin:4px 0 10px}
table{border-collapse:collapse;margin:4px 0 10px} td,th{border:1px solid #dde1e8;padding:3px 8px;text-align:right}
th{background:#f0f2f5} td.l{text-align:left}
tr.flat td{color:#9a6a00;background:#fff8e6}
article.trajectory{border-top:1px solid #eef0f3;padding:4px 0}
article.trajectory summary{cursor:pointer}
.reward{font-weight:600;padding:0 6px;border-radius:4px}
.good{background:#dcf5e3}.bad{background:#fde2e1}
.turn{margin:6px 0 6px 12px;padding:6px 10px;border-left:3px solid #c5cbd6;white-space:pre-wrap;word-break:break-word}
.turn .role{font-weight:600;text-transform:uppercase;font-size:11px;color:#5b6475;display:block}
.turn.assistant{border-color:#4c7bd9}.turn.tool{border-color:#8a63d2}.turn.user{border-color:#3aa675}
.call{font:12px/1.5 ui-monospace,Menlo,Consolas,monospace;margin:6px 0 6px 12px;padding:6px 8px;background:#fafbfc;border:1px solid #eef0f3;white-space:pre-wrap;word-break:break-all}
.tok{border-radius:2px}
.tool-error{color:#b42318;font-weight:600}
.meta{color:#5b6475;font-size:12px}
.hidden{display:none}
svg text{font-size:11px;fill:#5b6475}
"""

_JS = """
(function(){
  var t=document.getElementById('threshold'), f=document.getElementById('failures');
  function apply(){
    var cut=parseFloat(t.value), only=f.checked, shown=0;
    document.querySelectorAll('article.trajectory').forEach(function(a){
      var hide=only && !(parseFloat(a.dataset.reward) < cut);
      a.classList.toggle('hidden', hide); if(!hide) shown++;
    });
    document.getElementById('shown').textContent=shown;
  }
  t.addEventListener('input',apply); f.addEventListener('change',apply); apply();
  var h=location.hash && document.getElementById(location.hash.slice(1));
  if(h){var d=h.querySelector('details'); if(d){d.open=true;} h.scrollIntoView();}
  document.body.dataset.ready='1';
})();
"""

_COLORS = ["#4c7bd9", "#3aa675", "#d9822b", "#8a63d2", "#c0392b", "#16a2b8"]


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _load_tokenizer(folder: CheckpointFolder) -> Any:
    base = folder.base_model()
    if not base:
        return None
    try:
        from transformers import AutoTokenizer

        from art_langgraph.presets import resolve_preset

        return AutoTokenizer.from_pretrained(resolve_preset(base))
    except Exception:  # no tokenizer here: the page shows token ids
        return None


def _batches(folder: CheckpointFolder) -> dict[tuple[str, int], list[TrajectoryGroup]]:
    return {(split, step): read_groups(f) for split, step, f in folder.trajectory_files()}


def _curve_svg(curves: dict[str, list[tuple[int, float]]]) -> str:
    w, h, pad = 760, 260, 40
    points = [p for c in curves.values() for p in c]
    if not points:
        return '<svg id="reward-curve" width="760" height="40"><text x="10" y="24">no rewards yet</text></svg>'
    x0, x1 = min(p[0] for p in points), max(p[0] for p in points)
    y0, y1 = min(0.0, *(p[1] for p in points)), max(1.0, *(p[1] for p in points))
    sx = (w - 2 * pad) / max(1, x1 - x0)
    sy = (h - 2 * pad) / max(1e-9, y1 - y0)

    def xy(step: int, r: float) -> tuple[float, float]:
        return pad + (step - x0) * sx, h - pad - (r - y0) * sy

    parts = [
        f'<svg id="reward-curve" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        f'viewBox="0 0 {w} {h}" role="img" aria-label="mean reward per step">',
        f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="#9aa3b2"/>',
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="#9aa3b2"/>',
    ]
    for i in range(5):
        r = y0 + (y1 - y0) * i / 4
        _, y = xy(x0, r)
        parts.append(
            f'<line x1="{pad}" y1="{y:.1f}" x2="{w - pad}" y2="{y:.1f}" stroke="#eef0f3"/>'
            f'<text x="4" y="{y + 4:.1f}">{r:.2f}</text>'
        )
    for step in sorted({p[0] for p in points}):
        x, _ = xy(step, y0)
        parts.append(f'<text x="{x:.1f}" y="{h - pad + 16}" text-anchor="middle">{step}</text>')
    parts.append(f'<text x="{w / 2}" y="{h - 4}" text-anchor="middle">step</text>')
    for i, (split, pts) in enumerate(sorted(curves.items())):
        color = _COLORS[i % len(_COLORS)]
        path = " ".join(
            f"{'M' if j == 0 else 'L'}{x:.1f},{y:.1f}"
            for j, (x, y) in enumerate(xy(s, r) for s, r in sorted(pts))
        )
        parts.append(
            f'<path class="curve" data-split="{_e(split)}" d="{path}" fill="none" '
            f'stroke="{color}" stroke-width="2"/>'
        )
        for s, r in pts:
            x, y = xy(s, r)
            parts.append(
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}">'
                f"<title>{_e(split)} step {s}: {r:.3f}</title></circle>"
            )
        parts.append(
            f'<rect x="{w - pad - 110}" y="{pad + 16 * i - 9}" width="10" height="10" fill="{color}"/>'
            f'<text x="{w - pad - 95}" y="{pad + 16 * i}">{_e(split)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _token_text(tokenizer: Any, token_id: int) -> str:
    if tokenizer is None:
        return f"#{token_id} "
    try:
        return str(tokenizer.decode([token_id]))
    except Exception:
        return f"#{token_id} "


def _tokens(call: LLMCall, tokenizer: Any) -> str:
    ids, lps = call.completion_token_ids or [], call.logprobs or []
    if not ids:
        return _e(json.dumps(call.response_message, ensure_ascii=False))
    spans = []
    for i, tid in enumerate(ids):
        lp = lps[i] if i < len(lps) else None
        if lp is None or not math.isfinite(lp):
            spans.append(
                f'<span class="tok" title="id {tid}">{_e(_token_text(tokenizer, tid))}</span>'
            )
            continue
        p = math.exp(lp)
        alpha = min(0.85, (1 - p) * 0.85)
        spans.append(
            f'<span class="tok" data-lp="{lp:.4f}" title="id {tid}: logprob {lp:.3f} (p={p:.2f})" '
            f'style="background:rgba(255,90,0,{alpha:.2f})">{_e(_token_text(tokenizer, tid))}</span>'
        )
    return "".join(spans)


def _message(m: dict[str, Any]) -> str:
    role = str(m.get("role", "?"))
    content = m.get("content")
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    calls = "".join(
        f'<div class="meta">→ calls <b>{_e((c.get("function") or {}).get("name"))}</b>'
        f"({_e((c.get('function') or {}).get('arguments'))})</div>"
        for c in m.get("tool_calls") or []
    )
    body = _e(text) if content is not None else ""
    return f'<div class="turn {_e(role)}"><span class="role">{_e(role)}</span>{body}{calls}</div>'


def _trajectory(t: Trajectory, tokenizer: Any) -> str:
    good = "good" if t.reward > 0 else "bad"
    ruler = [line[len("RULER: ") :] for line in t.logs if line.startswith("RULER: ")]
    errors = sum(1 for e in t.tool_events if e.error)
    summary = (
        f'<span class="reward {good}">{t.reward:.3f}</span> '
        f"{len(t.calls)} LLM calls, {len(t.tool_events)} tool calls"
        + (f', <span class="tool-error">{errors} tool errors</span>' if errors else "")
        + (' <span class="tool-error">exception</span>' if t.exception else "")
        + f' <span class="meta">{_e(t.id)} {_e(t.metadata.get("scenario", ""))}</span>'
    )
    parts = [
        f'<article class="trajectory" id="t-{_e(t.id)}" data-id="{_e(t.id)}" data-reward="{t.reward}">',
        f"<details><summary>{summary}</summary>",
    ]
    if t.metrics:
        parts.append(f'<div class="meta">metrics: {_e(json.dumps(t.metrics))}</div>')
    if ruler:
        parts.append(f'<div class="meta">RULER: {_e(ruler[-1])}</div>')
    if url := t.metadata.get("langfuse_trace_url"):
        parts.append(f'<div class="meta">Langfuse: {_e(url)}</div>')
    parts.extend(_message(m) for m in t.messages)
    for ev in t.tool_events:
        if ev.error:
            out = f'<span class="tool-error">error: {_e(ev.error)}</span>'
        else:
            out = _e(json.dumps(ev.result, ensure_ascii=False)[:4000])
        parts.append(
            f'<div class="call">tool <b>{_e(ev.name)}</b>({_e(json.dumps(ev.args, ensure_ascii=False))})'
            f" → {out}</div>"
        )
    for i, call in enumerate(t.calls):
        lps = call.logprobs or []
        mean = f", mean logprob {statistics.fmean(lps):.3f}" if lps else ""
        parts.append(
            f'<div class="meta">call {i + 1}: {_e(call.model or "?")}, '
            f"{len(call.completion_token_ids or [])} tokens{mean}, "
            f"finish {_e(call.finish_reason or '?')}</div>"
            f'<div class="call">{_tokens(call, tokenizer)}</div>'
        )
    if t.exception:
        parts.append(
            f'<div class="call tool-error">{_e(t.exception.type)}: {_e(t.exception.message)}</div>'
        )
    parts.append("</details></article>")
    return "".join(parts)


def _step(split: str, step: int, groups: list[TrajectoryGroup], tokenizer: Any, cap: int) -> str:
    rows = []
    for gi, g in enumerate(groups):
        rewards = g.rewards()
        flat = len(rewards) > 1 and len(set(rewards)) == 1
        mean = statistics.fmean(rewards) if rewards else float("nan")
        std = statistics.pstdev(rewards) if rewards else float("nan")
        rows.append(
            f'<tr class="{"flat" if flat else ""}"><td>{gi}</td><td>{len(rewards)}</td>'
            f'<td class="l">{_e(", ".join(f"{r:.2f}" for r in rewards))}</td>'
            f"<td>{mean:.3f}</td><td>{std:.3f}</td>"
            f'<td class="l">{"zero variance: no signal" if flat else ""}'
            f"{f' {len(g.exceptions)} rollouts raised' if g.exceptions else ''}</td></tr>"
        )
    trajs = [t for g in groups for t in g.trajectories]
    shown = "".join(_trajectory(t, tokenizer) for t in trajs[:cap])
    more = (
        f'<p class="meta">{len(trajs) - cap} more trajectories left out of this page.</p>'
        if len(trajs) > cap
        else ""
    )
    return (
        f'<section class="step" id="{_e(split)}-{step}" data-split="{_e(split)}" data-step="{step}">'
        f"<h2>{_e(split)} · step {step}</h2>"
        '<table class="groups"><tr><th>group</th><th>n</th><th>rewards</th><th>mean</th>'
        f"<th>std</th><th></th></tr>{''.join(rows)}</table>{shown}{more}</section>"
    )


def write_review_page(
    folder: str | Path,
    out: str | Path | None = None,
    *,
    tokenizer: Any = "auto",
    max_trajectories_per_step: int = 200,
) -> Path:
    """Write the review page of a model's folder (see the module docstring); returns its path.
    `tokenizer`: "auto" (the base model's, if it loads), None (token ids), or any object
    with `decode([id])`."""
    if not Path(folder).is_dir():
        raise UsageError(f"{folder} is not a folder")
    model = CheckpointFolder(folder)
    batches = _batches(model)
    history = model.history()
    if not batches and not history:
        raise UsageError(
            f"{model.root} has no saved trajectories and no history: is it a model's folder "
            "({path}/{project}/models/{name})?"
        )
    if tokenizer == "auto":
        tokenizer = _load_tokenizer(model)
    curves: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for (split, step), groups in sorted(batches.items()):
        rewards = [r for g in groups for r in g.rewards()]
        if rewards:
            curves[split].append((step, statistics.fmean(rewards)))
    name, project = model.root.name, model.project
    order = sorted(batches, key=lambda k: (k[1], k[0]))
    jump = " ".join(f'<a href="#{_e(s)}-{n}">{_e(s)} {n}</a>' for s, n in order)
    n_traj = sum(len(g) for gs in batches.values() for g in gs)
    page = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{_e(name)}: training review</title><style>{_CSS}</style></head>",
        '<body data-ready="0"><header>',
        f"<h1>{_e(name)}</h1><p>project {_e(project)} · {len(batches)} batches · "
        f"{n_traj} trajectories · {len(history)} history lines</p>",
        '<div id="controls"><label><input type="checkbox" id="failures"> only rewards below '
        '<input type="number" id="threshold" value="0.5" step="0.1"></label>'
        '<span><span id="shown">0</span> trajectories shown</span>'
        f'<nav id="jump">{jump}</nav></div></header><main>',
        f'<section id="curves"><h2>Mean reward per step</h2>{_curve_svg(curves)}</section>',
        *(_step(s, n, batches[(s, n)], tokenizer, max_trajectories_per_step) for s, n in order),
        f"</main><script>{_JS}</script></body></html>",
    ]
    target = Path(out) if out is not None else model.root / "review.html"
    with atomic_write(target) as f:
        f.write("".join(page))
    return target
