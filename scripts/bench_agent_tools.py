"""An agent loop with real tool calls through ``localspec serve``: the target alone against the suffix cache.

    python scripts/bench_agent_tools.py -t qwen2.5-coder-1.5b-instruct-q4_k_m.gguf [--repeats 2] [--steps 10]

One pipeline, two servers over it (``--strategy none`` and ``--strategy suffix``), the official ``openai``
client as the agent: it offers four tools over a small in-memory repository (list_files, read_file,
write_file, run_tests) and asks the model to make the failing test pass; each call is answered from the
repository (write_file changes it), until the model answers without a call or ``--steps`` run out. The
suffix cache starts empty for every loop (so what it drafts comes from the loop's own earlier steps: the
prompt, the files it read, its own earlier calls). Greedy. Repeats interleave the two strategies; each
reports generated tokens over generation seconds (the ``localspec`` stats of every answer) and the ratio,
median over repeats. The two loops can part at near-ties (batched verification), so their texts are
printed side by side in length.
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

REPO = {
    "inventory.py": (
        "class Inventory:\n"
        '    """Items and their counts."""\n\n'
        "    def __init__(self) -> None:\n"
        "        self.items: dict[str, int] = {}\n\n"
        "    def add(self, name: str, count: int = 1) -> None:\n"
        "        self.items[name] = self.items.get(name, 0) + count\n\n"
        "    def remove(self, name: str, count: int = 1) -> None:\n"
        "        self.items[name] = self.items.get(name, 0) - count\n\n"
        "    def total(self) -> int:\n"
        "        return sum(self.items.values())\n"
    ),
    "test_inventory.py": (
        "import pytest\n\nfrom inventory import Inventory\n\n\n"
        "def test_add_and_total():\n"
        "    inv = Inventory()\n"
        '    inv.add("apple", 3)\n'
        '    inv.add("pear")\n'
        "    assert inv.total() == 4\n\n\n"
        "def test_remove_more_than_there_is_raises():\n"
        "    inv = Inventory()\n"
        '    inv.add("apple", 1)\n'
        "    with pytest.raises(ValueError):\n"
        '        inv.remove("apple", 2)\n'
    ),
}
TASK = (
    "The repository has a failing test. Find it with the tools, fix inventory.py so that every test "
    "passes (write the whole corrected file), run the tests, then say in one sentence what you changed."
)
SYSTEM = "You are a coding agent. Use the tools to inspect and change files; call one tool at a time."


def _tool(name: str, description: str, **params: str) -> dict:
    props = {p: {"type": "string", "description": d} for p, d in params.items()}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": props, "required": list(props)},
        },
    }


TOOLS = [
    _tool("list_files", "List the repository's files."),
    _tool("read_file", "Read a file.", path="the file's path"),
    _tool("write_file", "Replace a file's whole content.", path="the file's path", content="the new content"),
    _tool("run_tests", "Run the test suite and report failures."),
]


def _run_tests(files: dict[str, str]) -> str:
    src = files.get("inventory.py", "")
    fixed = "raise ValueError" in src or "raise KeyError" in src
    if fixed:
        return "2 passed"
    return (
        "FAILED test_inventory.py::test_remove_more_than_there_is_raises - Failed: DID NOT RAISE "
        "<class 'ValueError'>\n1 failed, 1 passed"
    )


def _answer(files: dict[str, str], name: str, args: dict) -> str:
    if name == "list_files":
        return "\n".join(sorted(files))
    if name == "read_file":
        return files.get(str(args.get("path", "")), f"no such file: {args.get('path')!r}")
    if name == "write_file":
        files[str(args.get("path", ""))] = str(args.get("content", ""))
        return "written"
    if name == "run_tests":
        return _run_tests(files)
    return f"unknown tool {name!r}"


def _loop(client, model: str, steps: int) -> dict:
    files = dict(REPO)
    messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    tokens = seconds = 0.0
    calls: list[str] = []
    for _ in range(steps):
        r = client.chat.completions.create(
            model=model, messages=messages, tools=TOOLS, temperature=0, max_tokens=512
        )
        stats = r.model_extra["localspec"]
        tokens += r.usage.completion_tokens
        seconds += stats["generation_seconds"]
        message = r.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            try:
                args = json.loads(call.function.arguments or "{}")
            except ValueError:
                args = {}
            calls.append(call.function.name)
            result = _answer(files, call.function.name, args if isinstance(args, dict) else {})
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return {
        "tokens": int(tokens),
        "seconds": seconds,
        "tok_s": tokens / seconds if seconds else 0.0,
        "calls": calls,
        "passed": _run_tests(files) == "2 passed",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "-t", "--target", required=True, help="a GGUF whose template speaks <tool_call> (Qwen2.5)"
    )
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10, help="most model turns per loop")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=8192)
    args = ap.parse_args()

    import openai

    import localspec
    from localspec.serve.app import start_background
    from localspec.serve.options import ServeOptions

    with tempfile.TemporaryDirectory() as home:
        import os

        os.environ["LOCALSPEC_HOME"] = home  # an empty suffix store, measured costs kept apart
        pipe = localspec.load(
            target=args.target, draft="none", strategy="suffix", n_threads=args.threads, n_ctx=args.n_ctx
        )
        servers = {s: start_background(pipe, ServeOptions(port=0, strategy=s)) for s in ("none", "suffix")}
        try:
            clients = {
                s: openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0, timeout=3600)
                for s, srv in servers.items()
            }
            model = clients["none"].models.list().data[0].id
            ratios = []
            for rep in range(args.repeats):
                got = {}
                for strategy in ("none", "suffix"):
                    pipe.reset_suffix()  # every loop starts from an empty cache
                    got[strategy] = _loop(clients[strategy], model, args.steps)
                    g = got[strategy]
                    print(
                        f"repeat {rep + 1} {strategy:6s}: {g['tokens']} tokens in {g['seconds']:.1f} s "
                        f"= {g['tok_s']:.2f} tok/s; calls {' '.join(g['calls'])}; tests pass: {g['passed']}",
                        flush=True,
                    )
                ratios.append(got["suffix"]["tok_s"] / got["none"]["tok_s"])
                print(f"repeat {rep + 1}: suffix / target alone {ratios[-1]:.2f}x", flush=True)
            print(f"median over {len(ratios)} repeats: {statistics.median(ratios):.2f}x")
        finally:
            for srv in servers.values():
                srv.stop()
            pipe.close()


if __name__ == "__main__":
    main()
