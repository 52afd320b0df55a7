"""Structured output under a JSON schema: what the grammar costs, and what drafting gives back.

    python scripts/bench_json_replies.py -t qwen2.5-coder-1.5b-instruct-q4_k_m.gguf [--repeats 3]

One pipeline; eight order e-mails, each turned into the same schema's JSON by a chat request (greedy,
``response_format`` json_schema, the schema also in the system prompt so the model knows the fields), in
order, as an extraction job does. Per repeat, interleaved: the target
alone without the grammar (the cost baseline: its reply is free text, so it is compared per token), the
target alone with the grammar, prompt lookup (``ngram``) with it, and the suffix cache with it (emptied at
the start of every loop, so it drafts from the e-mail and from the loop's earlier replies). Each setting
reports generated tokens over generation seconds (the ``localspec`` stats), the share of tokens where the
grammar refused the model's own best token (a full vocabulary check), and every strategy's ratio to the
target alone with the grammar, median over repeats.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SCHEMA = {
    "type": "object",
    "properties": {
        "customer": {"type": "string"},
        "email": {"type": "string"},
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "product": {"type": "string"},
                    "quantity": {"type": "integer"},
                    "unit_price": {"type": "number"},
                },
                "required": ["product", "quantity", "unit_price"],
            },
        },
        "shipping": {"enum": ["standard", "express", "pickup"]},
        "gift": {"type": "boolean"},
        "notes": {"type": "string"},
    },
    "required": ["customer", "email", "items", "shipping", "gift", "notes"],
}
EMAILS = [
    "Hi, this is Maria Lopez (maria.lopez@example.com). I'd like 2 ceramic mugs at 12.50 each and one teapot "
    "for 34.00. Standard shipping is fine. Not a gift.",
    "Order from Tom Becker, tom.becker@example.org: 1 wool blanket (89.90), 3 linen napkins at 6.20. "
    "Please send it express, it's a birthday present, so wrap it as a gift!",
    "Hello! Aiko Tanaka here, aiko.t@example.net. I'll pick it up at the store myself: 4 beeswax candles, "
    "7.75 each. No gift wrap. Could you keep them out of the sun?",
    "From: Samuel Okafor <s.okafor@example.com>. 1 cast iron pan at 45.00, 1 wooden spatula at 9.50, "
    "2 oven mitts at 11.00 each. Standard delivery. It's for me, not a gift.",
    "Hi there, Lena Fischer (lena.fischer@example.de). Express shipping please: 6 glass jars at 3.40 and "
    "1 funnel for 4.90. They are a gift for my sister, please add a card saying Happy Moving Day.",
    "This is Raj Patel, raj.patel@example.com. I want 2 bamboo cutting boards at 24.00 each. I'll collect "
    "them at the shop on Friday. Not a gift. Please call before if anything is out of stock.",
    "Order: Chloe Martin, chloe.m@example.fr, 1 enamel kettle 52.00, 1 tea strainer 5.50, 1 tin of loose "
    "tea 14.25. Standard shipping. Gift, yes, for my father.",
    "Hello, Jonas Berg, jonas.berg@example.se. 3 cotton aprons at 18.90 each, express shipping. No gift. "
    "Leave the parcel with the neighbour if I'm out.",
]
SYSTEM = (
    "You extract orders from customer e-mails. Answer with the order as JSON only, matching this JSON "
    "schema:\n" + json.dumps(SCHEMA)
)
FORMAT = {"type": "json_schema", "json_schema": {"name": "order", "schema": SCHEMA}}
SETTINGS = [  # (name, strategy, with the grammar, n_max: None lets the suffix cache size its own drafts)
    ("alone, free text", "none", False, None),
    ("alone, schema", "none", True, None),
    ("ngram k=4, schema", "ngram", True, 4),
    ("suffix, schema", "suffix", True, None),
]


def _loop(pipe, strategy: str, grammar: bool, n_max: int | None, counter: list[int]) -> dict:
    tokens = seconds = masks = drafted = accepted = 0
    valid = 0
    for email in EMAILS:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": email}]
        before = counter[0]
        r = pipe.chat(
            messages,
            response_format=FORMAT if grammar else None,
            max_tokens=320,
            temperature=0,
            strategy=strategy,
            n_max=n_max,
        )
        masks += counter[0] - before
        drafted += r.stats.drafted
        accepted += r.stats.accepted
        tokens += r.stats.generated_tokens
        seconds += r.stats.total_seconds - r.stats.prompt_seconds
        if grammar:
            try:
                json.loads(str(r))
                valid += 1
            except ValueError:
                pass
    return {
        "tokens": tokens,
        "seconds": seconds,
        "tok_s": tokens / seconds,
        "masks": masks,
        "valid": valid,
        "drafted": drafted,
        "accepted": accepted,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-t", "--target", required=True, help="a chat GGUF (Qwen2.5-Coder 1.5B measured)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=4096)
    args = ap.parse_args()

    import os

    import localspec
    from localspec.constrain import grammar

    counter = [0]
    full_mask = grammar.Constraint.masked

    def counted(self, logits):
        counter[0] += 1
        return full_mask(self, logits)

    grammar.Constraint.masked = counted  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as home:
        os.environ["LOCALSPEC_HOME"] = home  # an empty suffix store, measured costs kept apart
        pipe = localspec.load(
            target=args.target, draft="none", strategy="suffix", n_threads=args.threads, n_ctx=args.n_ctx
        )
        try:
            pipe.generate("warm up", max_tokens=4, strategy="suffix")  # the one-time cost measurement
            runs: dict[str, list[dict]] = {name: [] for name, *_ in SETTINGS}
            for rep in range(args.repeats):
                for name, strategy, with_grammar, n_max in SETTINGS:
                    pipe.reset_suffix()  # every loop starts from an empty cache
                    g = _loop(pipe, strategy, with_grammar, n_max, counter)
                    runs[name].append(g)
                    print(
                        f"repeat {rep + 1} {name:17s}: {g['tokens']} tokens in {g['seconds']:.1f} s = "
                        f"{g['tok_s']:.2f} tok/s; accepted {g['accepted']}/{g['drafted']} drafted; "
                        f"full masks {g['masks']}; valid JSON {g['valid']}/8",
                        flush=True,
                    )
            base = "alone, schema"
            for name, *_ in SETTINGS:
                ratio = statistics.median(
                    r["tok_s"] / b["tok_s"] for r, b in zip(runs[name], runs[base], strict=True)
                )
                tok_s = statistics.median(r["tok_s"] for r in runs[name])
                masks = statistics.median(r["masks"] / r["tokens"] for r in runs[name])
                print(
                    f"{name:17s}: {tok_s:.2f} tok/s, {ratio:.2f}x the target alone with the schema, "
                    f"full masks on {masks:.1%} of tokens"
                )
        finally:
            pipe.close()


if __name__ == "__main__":
    main()
