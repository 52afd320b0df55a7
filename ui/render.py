"""Pure presentation: turn localspec results into the HTML the page shows.

Nothing here loads models or talks to Gradio, so every function is a plain
``data -> str`` transformation. Numbers the browser test reads carry an ``id`` and a
``data-value`` attribute holding the raw number.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from typing import Any

from localspec.settings import MODEL_DRAFTER_STRATEGIES
from localspec.units import format_bytes

MB = 1e6  # decimal, as localspec.units.format_bytes writes sizes: the data-value and the text agree

CSS = """
.ls-out { white-space: pre-wrap; overflow-wrap: anywhere;
  font-family: ui-monospace, SFMono-Regular, Menlo, monospace;
  font-size: 0.92rem; line-height: 1.55; padding: 10px 12px; border: 1px solid var(--border-color-primary);
  border-radius: 8px; min-height: 9rem; max-height: 28rem; overflow-y: auto;
  background: var(--background-fill-primary); }
.ls-out .ls-d { background: #b7ebc1; color: #0b3d17; border-radius: 3px; }
.ls-out .ls-d.ls-src-prompt, .ls-legend .ls-d.ls-src-prompt { background: #c6dcff; color: #0a2a5c; }
.ls-out .ls-d.ls-src-history, .ls-legend .ls-d.ls-src-history { background: #ffe0a8; color: #4a3000; }
.ls-out .ls-d.ls-src-corpus, .ls-legend .ls-d.ls-src-corpus { background: #e4cdfa; color: #35104f; }
.ls-out .ls-d.ls-src-mtp, .ls-legend .ls-d.ls-src-mtp { background: #b6ebe3; color: #073b33; }
.ls-out .ls-prev { color: var(--body-text-color-subdued); }
.ls-out .ls-role { font-weight: 600; color: var(--body-text-color-subdued); }
.ls-legend { font-size: 0.85rem; color: var(--body-text-color-subdued); margin: 4px 0 0 2px; }
.ls-legend .ls-d { background: #b7ebc1; color: #0b3d17; border-radius: 3px; padding: 0 4px; }
.ls-err { border: 1px solid #e5484d; background: #fff0f0; color: #7a1016; border-radius: 8px;
  padding: 10px 12px; white-space: pre-wrap; }
.ls-err b { display: block; margin-bottom: 4px; }
.ls-ok { border: 1px solid #46a758; background: #effaf1; color: #14401d; border-radius: 8px;
  padding: 8px 12px; }
.ls-panel { display: grid; grid-template-columns: 1fr 1fr; gap: 12px; }
.ls-card { border: 1px solid var(--border-color-primary); border-radius: 8px; padding: 8px 12px; }
.ls-card h4 { margin: 0 0 6px 0; font-size: 0.95rem; }
.ls-card table { width: 100%; border-collapse: collapse; font-size: 0.9rem; }
.ls-card td { padding: 2px 4px; border: none; }
.ls-card td.v { text-align: right; font-variant-numeric: tabular-nums; font-weight: 600; }
.ls-big { font-size: 1.6rem; font-weight: 700; }
.ls-bars { display: flex; align-items: flex-end; gap: 6px; height: 120px; padding: 4px 0; }
.ls-bar { flex: 1; display: flex; flex-direction: column; justify-content: flex-end; align-items: center;
  height: 100%; font-size: 0.75rem; }
.ls-bar .fill { width: 100%; background: #3e8ed0; border-radius: 3px 3px 0 0; min-height: 1px; }
.ls-card table, .ls-card td, .ls-card tr { border: none !important; background: transparent !important; }
.ls-card tr + tr td { border-top: 1px solid var(--border-color-primary) !important; }
.ls-kv, .ls-kv tr, .ls-kv th, .ls-kv td { border: none !important; background: transparent !important; }
.ls-kv { width: 100%; border-collapse: collapse; font-size: 0.85rem; margin: 4px 0 0 0 !important; }
.ls-kv th, .ls-kv td { padding: 2px 6px !important; text-align: left; vertical-align: top; }
.ls-kv th { font-weight: 600; white-space: nowrap; }
#ls-preset-facts { padding: 6px 8px; }
#ls-preset-facts.ls-missing { border-left: 3px solid #f5a524; }
#ls-preset-facts.ls-cached { border-left: 3px solid #46a758; }
.ls-note { font-size: 0.82rem; color: var(--body-text-color-subdued); margin-top: 6px; }
.ls-caution { font-size: 0.82rem; color: #92400e; background: #fef3c7; border-radius: 6px; padding: 4px 8px;
  margin: 4px 0; }
"""


def esc(text: Any) -> str:
    """HTML-escape any value (quotes included, so it is safe inside attributes too)."""
    return html.escape(str(text), quote=True)


def fmt_num(x: float | int | None, digits: int = 2, suffix: str = "") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:.{digits}f}{suffix}"


def _value(elem_id: str, x: float | None, text: str) -> str:
    """A number the test (and a curious user's devtools) can read back: raw value in data-value."""
    raw = "" if x is None else repr(float(x))
    return f'<span id="{elem_id}" data-value="{raw}">{esc(text)}</span>'


# ----------------------------------------------------------------------------- output text


def tokens_html(
    pieces: Sequence[tuple[str, bool | str | None]], *, prefix: str = "", status: str = ""
) -> str:
    """Generated tokens as spans; a token proposed by the drafter and accepted gets class ``ls-d`` and
    ``ls-src-SOURCE`` (where the draft came from: model, mtp, prompt, history or corpus; each its own colour).

    Each piece is ``(text, source)``: None/False for the target's own token, True (a drafted token of an
    unknown source, counted as the model's) or the source name.

    ``prefix`` is already-rendered HTML placed before the tokens (previous chat turns);
    ``status`` a short plain-text line after them (``stopped``...).
    """
    out = ['<div class="ls-out" id="ls-output">', prefix]
    for text, source in pieces:
        if not text:
            continue
        if source:
            src = source if isinstance(source, str) else "model"
            cls = f"ls-t ls-d ls-src-{esc(src)}"
        else:
            cls = "ls-t"
        out.append(f'<span class="{cls}">{esc(text)}</span>')
    if status:
        out.append(f'\n<span class="ls-prev">[{esc(status)}]</span>')
    out.append("</div>")
    return "".join(out)


def chat_prefix_html(messages: Iterable[dict[str, str]]) -> str:
    """Earlier chat turns, plain (no highlighting), followed by the assistant label for the new reply."""
    parts = []
    for m in messages:
        parts.append(f'<span class="ls-role">{esc(m.get("role", "?"))}:</span> ')
        parts.append(f'<span class="ls-prev">{esc(m.get("content", ""))}</span>\n\n')
    parts.append('<span class="ls-role">assistant:</span> ')
    return "".join(parts)


def legend_html() -> str:
    return (
        '<div class="ls-legend">Highlighted tokens were drafted and accepted by the target, coloured by '
        'where the draft came from: <span class="ls-d ls-src-model">draft model</span> '
        '<span class="ls-d ls-src-mtp">MTP layers</span> '
        '<span class="ls-d ls-src-prompt">this prompt</span> '
        '<span class="ls-d ls-src-history">earlier requests</span> '
        '<span class="ls-d ls-src-corpus">your corpus</span>; plain ones the target produced itself. '
        "The text is exactly the target's either way.</div>"
    )


def error_html(exc: BaseException | str, *, title: str = "Could not do that") -> str:
    """A readable error box: the message, then the next step (``hint``) when the error has one."""
    if isinstance(exc, str):
        message, hint = exc, None
    else:
        message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        hint = getattr(exc, "hint", None)
    body = esc(message)
    if hint:
        body += f"\n\u2192 {esc(hint)}"
    return f'<div class="ls-err"><b>{esc(title)}</b>{body}</div>'


def ok_html(text: str) -> str:
    return f'<div class="ls-ok">{esc(text)}</div>'


# ----------------------------------------------------------------------------- result panel


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if obj is None:
        return default
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def memory_rows(memory: Any) -> list[tuple[str, str, float | None, str]]:
    """(label, element id, raw value, shown text) rows for the draft's memory cost."""
    tw, tk = _get(memory, "target_weights_bytes") or 0, _get(memory, "target_kv_bytes") or 0
    dw, dk = _get(memory, "draft_weights_bytes"), _get(memory, "draft_kv_bytes")
    over = _get(memory, "draft_overhead_bytes")
    pct = _get(memory, "draft_overhead_pct")
    rss = _get(memory, "draft_rss_delta_bytes")
    rss_target = None
    after_t, base = _get(memory, "rss_after_target_bytes"), _get(memory, "rss_baseline_bytes")
    if after_t is not None and base is not None and after_t > base:
        rss_target = after_t - base
    rss_pct = rss / rss_target * 100 if rss is not None and rss_target else None

    def mb(x: Any) -> float | None:
        return None if x is None else x / MB

    return [
        ("Target weights + KV", "ls-target-mb", mb(tw + tk), format_bytes(tw + tk)),
        ("Draft weights", "ls-draft-weights-mb", mb(dw), format_bytes(dw)),
        ("Draft KV cache", "ls-draft-kv-mb", mb(dk), format_bytes(dk)),
        ("Draft weights + KV", "ls-overhead-mb", mb(over), format_bytes(over)),
        ("  as % of target", "ls-overhead-pct", pct, fmt_num(pct, 1, " %")),
        ("Measured RSS increase", "ls-rss-mb", mb(rss), format_bytes(rss)),
        ("  as % of target RSS", "ls-rss-pct", rss_pct, fmt_num(rss_pct, 1, " %")),
    ]


def _table(rows: Iterable[tuple[str, str, float | None, str]]) -> str:
    cells = "".join(
        f"<tr><td>{esc(label)}</td><td class='v'>{_value(eid, raw, text)}</td></tr>"
        for label, eid, raw, text in rows
    )
    return f"<table>{cells}</table>"


def acceptance_bars_html(acceptance: Sequence[float] | None, drafted: Sequence[int] | None = None) -> str:
    """Acceptance rate per draft position as simple bars (no JS, renders offline)."""
    acceptance = list(acceptance or [])
    drafted = list(drafted or [])
    if not acceptance:
        return (
            '<div class="ls-note" id="ls-bars">No draft tokens were proposed, so no per-position chart.</div>'
        )
    bars = []
    for i, a in enumerate(acceptance):
        n = drafted[i] if i < len(drafted) else None
        pct = max(0.0, min(1.0, float(a))) * 100
        tip = f"position {i + 1}: {pct:.0f}% accepted" + (f" of {n} drafted" if n is not None else "")
        bars.append(
            f'<div class="ls-bar" title="{esc(tip)}"><span>{pct:.0f}%</span>'
            f'<div class="fill" style="height:{pct:.1f}%"></div><span>#{i + 1}</span></div>'
        )
    return f'<div class="ls-bars" id="ls-bars">{"".join(bars)}</div>'


def result_panel_html(
    stats: Any,
    *,
    baseline: Any = None,
    speedup: float | None = None,
    memory: Any = None,
    note: str = "",
    caution: str = "",
) -> str:
    """Speed next to memory: the two cards the issue asks for, plus acceptance by position.

    ``stats`` are the speculative run's GenerationStats, ``baseline`` the target-alone run's
    (None after a plain Run, when only Compare can tell the speedup); ``caution`` is said under the
    speedup (a figure the run cannot have measured). A run whose strategy drafted without the draft
    model says its memory is loaded but unused.
    """
    memory = memory if memory is not None else _get(stats, "memory")
    speed_card = _speed_card(stats, baseline, speedup, caution)
    mem_card = _memory_card(stats, memory)
    bars = acceptance_bars_html(_get(stats, "acceptance_by_position"), _get(stats, "drafted_by_position"))
    return (
        f'<div id="ls-result"><div class="ls-panel">{speed_card}{mem_card}</div>'
        f'<div class="ls-card" style="margin-top:12px"><h4>Acceptance by draft position</h4>{bars}</div>'
        f'<div class="ls-note">{esc(_meta_line(stats, note))}</div></div>'
    )


def _speed_card(stats: Any, baseline: Any, speedup: float | None, caution: str) -> str:
    """The Speed card: the speedup (or where to get it), then both speeds and what drafting bought."""
    spec_tps = _get(stats, "tokens_per_second")
    base_tps = _get(baseline, "tokens_per_second")
    accepted_pct = _pct(_get(stats, "acceptance_rate")) if _get(stats, "drafted") else None
    speed_rows = [
        ("Target alone", "ls-base-tps", base_tps, fmt_num(base_tps, 1, " tok/s")),
        ("With draft", "ls-spec-tps", spec_tps, fmt_num(spec_tps, 1, " tok/s")),
        (
            "Acceptance rate",
            "ls-acceptance",
            accepted_pct,
            fmt_num(accepted_pct, 1, " %"),  # nothing drafted: no rate ("-"), not 0 %
        ),
        (
            "Mean accepted length",
            "ls-mean-len",
            _get(stats, "mean_accepted_length"),
            fmt_num(_get(stats, "mean_accepted_length"), 2),
        ),
        (
            "Tokens per target pass",
            "ls-tpr",
            _get(stats, "tokens_per_round"),
            fmt_num(_get(stats, "tokens_per_round"), 2),
        ),
        (
            "Drafted / accepted",
            "ls-drafted",
            _get(stats, "drafted"),
            f"{_get(stats, 'drafted', '-')} / {_get(stats, 'accepted', '-')}",
        ),
    ]
    sp_text = fmt_num(speedup, 2, "\u00d7") if speedup is not None else "run Compare"
    return (
        '<div class="ls-card"><h4>Speed</h4>'
        f'<div class="ls-big">{_value("ls-speedup", speedup, sp_text)}</div>'
        + (f'<div class="ls-caution" id="ls-caution">{esc(caution)}</div>' if caution else "")
        + f"{_table(speed_rows)}</div>"
    )


def _memory_card(stats: Any, memory: Any) -> str:
    """The memory card: what the draft costs, and a note when this run loaded it without using it."""
    mem = memory_rows(memory)
    over_pct = mem[4][2]
    unused = ""
    if _get(memory, "draft_overhead_bytes") and str(_get(stats, "strategy")) not in MODEL_DRAFTER_STRATEGIES:
        unused = (
            '<div class="ls-note" id="ls-draft-unused">loaded, but this run did not use the draft model'
            " (pick the draft <i>n-gram lookup</i> to free it)</div>"
        )
    return (
        '<div class="ls-card"><h4>Memory cost of the draft</h4>'
        f'<div class="ls-big">{esc(format_bytes(_get(memory, "draft_overhead_bytes")))} '
        f'<span style="font-size:1rem">({esc(fmt_num(over_pct, 1, " % of target"))})</span></div>'
        f"{unused}{_table(mem)}</div>"
    )


def _meta_line(stats: Any, note: str) -> str:
    """The line under the cards: the strategy (``auto``: what it chose, and why), the draft, the pairing."""
    route = _get(stats, "route")  # a Route, or its line in a stats dict
    strategy = str(route) if route else _get(stats, "strategy", "")  # auto: what it chose, and why
    draft_name = _get(stats, "draft_name") or ""
    pairing = _get(stats, "pairing_note") or ""
    return " \u00b7 ".join(
        x for x in (f"strategy: {strategy}" if strategy else "", draft_name, pairing, note) if x
    )


def _pct(x: float | None) -> float | None:
    return None if x is None else x * 100


def empty_panel_html() -> str:
    return '<div id="ls-result" class="ls-note">Run a prompt or press Compare to fill this panel.</div>'


# ----------------------------------------------------------------------------- tables


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A small Markdown table; cell text has pipes and newlines neutralised."""

    def cell(x: Any) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)
