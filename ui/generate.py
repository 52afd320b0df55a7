"""The Generate tab's runs: Run streams the pair's tokens (a prompt, or a chat turn) onto the page with the
draft's highlighted, Compare times the target alone and with the draft; Stop ends a session's runs."""

from __future__ import annotations

import html
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import gradio as gr

from localspec.bench.report import NOISE_MARGIN
from localspec.errors import LocalspecError

from .common import Room, friendly, progress_adapter, session_key
from .controls import Controls
from .render import chat_prefix_html, empty_panel_html, result_panel_html, tokens_html
from .session import PairSpec

if TYPE_CHECKING:
    from localspec.pipeline.pipeline import Pipeline

REFRESH_SECONDS = 0.08  # how often the streaming output is pushed to the page, at most
#: Each push sends the whole output so far, and the browser lays it out again: for a long answer that work,
#: on the same cores as the models, slowed generation itself. On a busy 2-core AMD EPYC (2026-12-07, load
#: 12-15 beside other work) a 1,022-token run of the embedded pair wrote 11-14 tok/s on the page where
#: `localspec run` wrote 77, and took 90-120 s; pushed once a second it wrote 21 tok/s in half the time. So
#: pushes are spaced by their size (at most this many bytes of output a second) ...
PUSH_BYTES_PER_SECOND = 100_000
#: ... and to at least this many times what the last push held generation back (Gradio pulls the next token
#: once a push is handed over).
PUSH_SPACING = 4.0


class Pushes:
    """When to push a run's streaming output to the page: every :data:`REFRESH_SECONDS`, or more seldom for a
    long output (:data:`PUSH_BYTES_PER_SECOND`) or while a push itself takes long (:data:`PUSH_SPACING`)."""

    def __init__(self) -> None:
        self.interval = REFRESH_SECONDS
        self._last = -float("inf")

    def due(self, now: float) -> bool:
        """True when the next push is due at ``now`` (``time.monotonic()``)."""
        return now - self._last >= self.interval

    def pushed(self, at: float, took: float, size: int = 0) -> None:
        """A push of ``size`` bytes went out at ``at`` and generation resumed ``took`` seconds later."""
        self._last = at
        self.interval = max(REFRESH_SECONDS, PUSH_SPACING * took, size / PUSH_BYTES_PER_SECOND)


def _same_text_note(cmp: Any, opts: dict[str, Any]) -> str:
    """Compare's word on the two texts. Sampling draws differ by design; at temperature 0 the texts part
    only at a near-tie, where llama.cpp's batched verify pass rounds differently from a one-token pass
    (every token is still the verifying pass's own best: README, "The honest part first")."""
    if getattr(cmp, "same_text", True):
        return "yes"
    if opts.get("temperature", 0.0) > 0:
        return "no (sampling: each run draws its own text from the same distribution)"
    return (
        "no: they part at a near-tie, where the batched verify pass rounds differently "
        "(each token is still the target's own best)"
    )


def noise_caution(cmp: Any) -> str:
    """A warning for a Compare figure no drafting can produce (one timing of each side, taken while
    something else ran): a speedup past the tokens each target pass yielded, or far from 1x with no draft
    accepted; "" when the figure is possible. The same margin as the benchmark's noise warnings."""
    spec = cmp.speculative.stats
    per_pass = spec.tokens_per_round
    if not spec.accepted and abs(cmp.speedup - 1) > NOISE_MARGIN:
        why = f"{cmp.speedup:.2f}x with no draft accepted is the target alone timed twice"
    elif per_pass and cmp.speedup > per_pass * (1 + NOISE_MARGIN):
        why = f"{cmp.speedup:.2f}x is more than the {per_pass:.2f} tokens each target pass gave"
    else:
        return ""
    return (
        f"Caution: {why}, so the machine was busy during one of the runs; press Compare again "
        "when it is idle (the Bench tab repeats and takes medians)."
    )


class Runs(Controls):
    """The handlers that run the pair: Run, Compare, and the Stop of a browser session."""

    def _pipe(self, spec: PairSpec, progress: Any) -> Pipeline:
        pipe = self.holder.get(spec, progress_adapter(progress))
        self.loaded_room = (spec, Room.of(pipe))
        return pipe

    def on_run(
        self,
        v: dict[str, Any],
        request: gr.Request,
        progress: gr.Progress = gr.Progress(),  # noqa: B008
    ) -> Iterator[dict]:
        c = self.c
        session = session_key(request)
        out, panel, err = c["output"], c["result"], c["error"]
        prompt = v[c["prompt"]] or ""
        history = list(v[c["chat"]] or [])
        is_chat = v[c["mode"]] == "Chat"
        prefix = chat_prefix_html(history + [{"role": "user", "content": prompt}]) if is_chat else ""
        pieces: list[tuple[str, bool | str | None]] = []
        try:
            if not self.holder.claim(session):  # its Stop came while it waited in the queue
                yield {out: tokens_html([], prefix=prefix, status="stopped before it started")}
                return
            if not prompt.strip():
                raise LocalspecError(
                    "the prompt is empty", hint="type something to continue in the prompt box"
                )
            opts = self.gen_opts(v)  # every value checked before anything is loaded
            spec = self.spec(v)
            status = "starting..." if self.holder.loaded(spec) else spec.loading_text()
            yield {err: "", out: tokens_html([], prefix=prefix, status=status)}
            pipe = self._pipe(spec, progress)
            messages = history + [{"role": "user", "content": prompt}] if is_chat else None
            yield self.fit_max_tokens(opts, self.prompt_tokens(pipe, prompt, messages))
            if pipe.costs_pending(opts["strategy"]):
                status = "measuring this machine's decoding costs once (20-30 s on two CPU cores; kept)..."
                yield {out: tokens_html([], prefix=prefix, status=status)}
                pipe.machine_costs()
            yield from self._streamed(pipe, opts, session, prompt, messages, prefix, pieces)
        except Exception as exc:
            if isinstance(exc, LocalspecError):
                gr.Warning(html.escape(exc.message))  # Gradio renders a toast's text as HTML
            failed = {err: friendly(exc), out: tokens_html(pieces, prefix=prefix, status="failed")}
            yield failed | {panel: empty_panel_html()}  # the last run's numbers are not this one's

    def _streamed(
        self,
        pipe: Pipeline,
        opts: dict[str, Any],
        session: str,
        prompt: str,
        messages: list[dict] | None,
        prefix: str,
        pieces: list[tuple[str, bool | str | None]],
    ) -> Iterator[dict]:
        """A run's tokens onto the page as they come (into ``pieces``, shown every :data:`REFRESH_SECONDS`),
        then how it ended (:meth:`_run_end`); the stream is cleaned up once the page shows the answer."""
        out = self.c["output"]
        pushes = Pushes()
        stats = finish = None
        tokens = self.holder.stream(_token_source(pipe, prompt, messages, opts), session=session)
        try:
            for tr in tokens:
                pieces.append((tr.text, tr.source if tr.from_draft else None))
                stats, finish = tr.stats, tr.finish_reason
                if finish:
                    break  # the answer is complete: on the page before the stream is cleaned up
                now = time.monotonic()
                if pushes.due(now):
                    shown = tokens_html(pieces, prefix=prefix)
                    yield {out: shown}
                    pushes.pushed(now, time.monotonic() - now, len(shown))
            yield self._run_end(pieces, stats, finish, session, prefix, messages)
        finally:
            # the engine's cleanup (the KV cache put right, the suffix cache fed: long with a large store)
            # once the page shows the answer
            tokens.close()

    def _run_end(
        self,
        pieces: list[tuple[str, bool | str | None]],
        stats: Any,
        finish: str | None,
        session: str,
        prefix: str,
        messages: list[dict] | None,
    ) -> dict[Any, Any]:
        """The page once a run ended: its text and why it ended, its numbers, and a chat's turn answered."""
        c = self.c
        status = "stopped" if self.holder.was_stopped(session) and finish is None else ""
        if finish == "length":  # JSON cut here is not valid JSON: say why it ends
            status = "cut at Max tokens: raise it for the whole answer"
        update: dict[Any, Any] = {c["output"]: tokens_html(pieces, prefix=prefix, status=status)}
        if stats is not None:
            update[c["result"]] = result_panel_html(
                stats, note="target-alone speed and speedup: press Compare"
            )
        if messages is not None:
            reply = "".join(t for t, _ in pieces)
            update[c["prompt"]] = ""  # sent: the box is for the next message, as in a chat app
            update[c["chat"]] = [*messages, {"role": "assistant", "content": reply}]
        return update

    def on_compare(
        self,
        v: dict[str, Any],
        request: gr.Request,
        progress: gr.Progress = gr.Progress(),  # noqa: B008
    ) -> dict:
        c = self.c
        prompt = v[c["prompt"]] or ""
        fit: dict[Any, Any] = {}
        try:
            if not self.holder.claim(session_key(request)):  # its Stop came while it waited
                return {c["output"]: tokens_html([], status="stopped before it started")}
            if not prompt.strip():
                raise LocalspecError("the prompt is empty", hint="type a prompt, then press Compare")
            opts = self.gen_opts(v)
            spec = self.spec(v)
            if not self.holder.loaded(spec):
                progress(0.0, desc=spec.loading_text())  # with a value: Gradio shows the words with a bar
            pipe = self._pipe(spec, progress)
            fit = self.fit_max_tokens(opts, self.prompt_tokens(pipe, prompt, None))
            progress(None, desc="target alone, then with the draft")
            with self.holder.busy():
                cmp = pipe.compare(prompt, **opts)
            spec = cmp.speculative.stats
            panel = result_panel_html(
                spec,
                baseline=cmp.baseline.stats,
                speedup=cmp.speedup,
                memory=getattr(pipe, "memory", None) or spec.memory,
                note="same text with and without the draft: " + _same_text_note(cmp, opts),
                caution=noise_caution(cmp),
            )
            run = cmp.speculative
            sources = [
                src if drafted else None for src, drafted in zip(run.sources, run.from_draft, strict=True)
            ]
            pieces = list(zip(run.pieces, sources, strict=True)) or [(str(run), None)]
            status = "compare: the run with the draft"
            if v[c["mode"]] == "Chat":  # compare() times plain completions: said so
                status += ", a plain completion of the prompt box (Compare does not run the chat)"
            text = tokens_html(pieces, status=status)
            return {**fit, c["error"]: "", c["result"]: panel, c["output"]: text}
        except Exception as exc:
            if isinstance(exc, LocalspecError):
                gr.Warning(html.escape(exc.message))  # Gradio renders a toast's text as HTML
            return {**fit, c["error"]: friendly(exc), c["result"]: empty_panel_html()}

    def on_request(self, request: gr.Request) -> None:
        """A run, compare or bench was clicked: counted for Stop before it leaves the queue."""
        self.holder.note_request(session_key(request))

    def on_stop(self, request: gr.Request) -> None:
        """Stop the run (or bench) of the session that pressed Stop, not anyone else's, and its runs
        still waiting in the queue."""
        self.holder.request_stop(session_key(request))

    def on_unload(self, request: gr.Request) -> None:
        """The page was closed or reloaded: what its session runs is stopped as its Stop would (a bench
        after the run in progress), and its runs still waiting in the queue are dropped. The page that
        loads next is a new session, with no Stop button for them: they only kept the engine busy."""
        self.holder.request_stop(session_key(request), page_gone=True)


def _token_source(
    pipe: Pipeline, prompt: str, messages: list[dict] | None, opts: dict[str, Any]
) -> Callable[[], Any]:
    """What starts the run's stream when the holder calls it: the chat's, or the prompt's."""
    if messages is not None:
        conversation = messages
        return lambda: pipe.chat_stream(conversation, **opts)
    return lambda: pipe.stream(prompt, **opts)
