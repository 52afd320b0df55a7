"""``localspec doctor``: what this install can do. The installed llama.cpp (its version, the CPU features it
uses against the ones this CPU has, AMX, GPU backends and devices, the RPC backend), where models, caches
and measured costs live, and the models found; for each gap, the command that rebuilds llama-cpp-python
with it. The checks themselves are :func:`localspec.llama.build.check_build`'s.

Exit status 0 when everything localspec uses works here (a gap, such as a build without RPC, is no
failure), 1 when something does not (a problem).
"""

from __future__ import annotations

import json
import os
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import click

from localspec import constants
from localspec.llama import build as llama_build
from localspec.llama.build import BuildFacts, Finding
from localspec.units import format_bytes

#: How each finding's state is shown.
_MARK = {"ok": "ok", "note": "note", "gap": "gap", "problem": "PROBLEM"}


def pinned_version() -> str | None:
    """The llama-cpp-python version localspec's package metadata requires (``==X``), if it pins one."""
    try:
        requires = metadata.requires("localspec") or []
    except metadata.PackageNotFoundError:
        return None
    for req in requires:
        name, sep, version = req.partition("==")
        if sep and name.strip().lower().replace("_", "-") == "llama-cpp-python":
            return version.split(";")[0].strip()
    return None


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _writable(path: Path) -> bool:
    """Whether ``path`` can be written, or created in its nearest folder that exists."""
    while not path.exists() and path.parent != path:
        path = path.parent
    return os.access(path, os.W_OK)


def where_things_live() -> dict[str, Any]:
    """The folders localspec reads and writes, each with what it holds (``--json``'s ``paths``)."""
    from localspec.decoding import costs
    from localspec.suffix import store_files

    return {
        "model folders scanned": [str(p) for p in constants.default_scan_dirs()],
        "downloads (Hugging Face cache)": str(constants.hf_hub_cache()),
        "cache folder (LOCALSPEC_HOME)": str(constants.localspec_home()),
        "suffix cache": str(store_files.default_dir()),
        "measured costs": str(costs.costs_dir()),
        "AMX check verdicts": str(llama_build.verdicts_dir()),
        "your presets": str(constants.user_presets_dir()),
    }


def _folder_findings() -> list[Finding]:
    """The cache folder must be writable: the suffix cache, measured costs and verdicts are kept there."""
    home = constants.localspec_home()
    if _writable(home):
        return []
    return [
        Finding(
            "cache folder",
            "problem",
            f"{home} cannot be written: the suffix cache and the measured costs are not kept (set "
            "LOCALSPEC_HOME to a folder you can write)",
        )
    ]


def _read_build() -> tuple[BuildFacts | None, list[Finding]]:
    """The installed build, or a problem when llama-cpp-python does not load."""
    try:
        return llama_build.installed_build(), []
    except (ImportError, OSError, RuntimeError, AttributeError) as exc:
        pinned = pinned_version() or "<version>"
        return None, [
            Finding(
                "llama-cpp-python",
                "problem",
                f"it does not load ({type(exc).__name__}: {exc}); reinstall it: pip install --no-cache-dir "
                f"--force-reinstall llama-cpp-python=={pinned}",
            )
        ]


def diagnose() -> dict[str, Any]:
    """Everything ``doctor`` reports, as ``--json`` prints it; ``ok`` is False when a finding is a problem."""
    from localspec.gguf.scan import scan

    build, findings = _read_build()
    report: dict[str, Any] = {"localspec": _version("localspec"), "llama_cpp_python_pinned": pinned_version()}
    cpuinfo = _cpuinfo()
    if build is not None:
        findings = llama_build.check_build(
            build,
            cpuinfo,
            pinned=report["llama_cpp_python_pinned"],
            amx_crashes=llama_build.amx_crash_count(),
            gpus_seen=llama_build.gpus_seen(),
        )
        has = llama_build.cpuinfo_flags(cpuinfo)
        used = llama_build.features_of(build.system_info)
        report.update(
            llama_cpp_python=build.version,
            ggml=build.ggml_version,
            system_info=build.system_info,
            backends=list(build.backends),
            devices=[vars(d) for d in build.devices],
            cpu_features=[
                {"name": name, "build": name in used, "cpu": (flag in has) if has else None}
                for name, (flag, _) in llama_build.CPU_FEATURES.items()
            ],
        )
    findings += _folder_findings()
    report["findings"] = [
        {"topic": f.topic, "state": f.state, "text": f.text, "fix": f.fix} for f in findings
    ]
    report["fix_all"] = llama_build.fix_all(build, findings) if build is not None else None
    report["paths"] = where_things_live()
    report["models"] = [
        {
            k: m.as_dict()[k]
            for k in ("path", "name", "architecture", "quant", "size_bytes", "usable", "error")
        }
        for m in scan()
    ]
    report["ok"] = not any(f.state == "problem" for f in findings)
    return report


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def doctor(as_json: bool) -> None:
    """What this install can do: the llama.cpp build against this CPU and GPUs, RPC, where files live, the
    models found; the command that rebuilds llama-cpp-python for each gap. Exit status 1 when something
    localspec uses does not work here."""
    report = diagnose()
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        _print(report)
    sys.exit(0 if report["ok"] else 1)


def _print(r: dict[str, Any]) -> None:
    """The report for a reader."""
    if "llama_cpp_python" in r:
        pinned = r["llama_cpp_python_pinned"]
        click.echo(
            f"llama-cpp-python {r['llama_cpp_python']}"
            + (f" (localspec pins {pinned})" if pinned and pinned != r["llama_cpp_python"] else "")
            + (f", ggml {r['ggml']}" if r["ggml"] else "")
        )
        click.echo(f"  system info: {r['system_info']}")
        click.echo(f"  backends: {', '.join(r['backends'])}")
        for d in r["devices"]:
            memory = f", {format_bytes(d['memory_bytes'])}" if d["memory_bytes"] else ""
            click.echo(f"  device {d['name']} ({d['kind']}): {d['description']}{memory}")
        _print_features(r["cpu_features"])
    click.echo()
    for f in r["findings"]:
        click.echo(f"{_MARK[f['state']]:<8} {f['topic']}: {f['text']}")
        if f["fix"]:
            click.echo(f"         -> {f['fix']}")
    if r["fix_all"] and sum(1 for f in r["findings"] if f["fix"]) > 1:
        click.echo(f"All of it in one rebuild (AMX left out, as always):\n  {r['fix_all']}")
    click.echo("\nWhere things live:")
    for what, where in r["paths"].items():
        shown = ", ".join(where) if isinstance(where, list) else where
        click.echo(f"  {what + ':':<32} {shown or '(none of the usual folders exists)'}")
    models = r["models"]
    click.echo(
        f"\nModels found: {len(models)} GGUF file(s)" + (" (`localspec scan` for details)" if models else "")
    )
    for m in models:
        state = "" if m["usable"] else f"  ({m['error'] or 'not usable'})"
        click.echo(f"  {m['path']}  {m['quant'] or '-'}  {format_bytes(m['size_bytes'], unknown='-')}{state}")
    click.echo("\n" + summary(r["findings"]))


def summary(findings: list[dict[str, Any]]) -> str:
    """The report's last line: the problems, else the gaps and notes it listed, else that all works.

    Args:
        findings: the report's findings (``state``: ok, note, gap or problem).

    Returns:
        One line that agrees with the findings above it.
    """
    count = {state: sum(1 for f in findings if f["state"] == state) for state in ("problem", "gap", "note")}
    if count["problem"]:
        return (
            f"{count['problem']} problem(s): something localspec uses does not work here (see PROBLEM above)."
        )
    said = [f"{n} {state}(s)" for state, n in count.items() if n and state != "problem"]
    if not said:
        return "Everything localspec uses works here."
    return (
        f"Everything localspec uses works here, with {' and '.join(said)} above (a gap: something a rebuild "
        "would add; a note: worth knowing)."
    )


def _print_features(rows: list[dict[str, Any]]) -> None:
    """The x86 features: used by the build, and on this CPU (only where the build or the CPU is x86)."""
    if not any(row["build"] or row["cpu"] for row in rows):
        return
    yes = {True: "yes", False: "no", None: "?"}
    widths = [max(len(row["name"]), 3) for row in rows]
    for label, cells in (
        ("CPU features", [row["name"] for row in rows]),
        ("  the build uses", [yes[row["build"]] for row in rows]),
        ("  this CPU has", [yes[row["cpu"]] for row in rows]),
    ):
        click.echo(
            f"  {label:<16} " + " ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()
        )


COMMANDS = [doctor]
