"""Generates the Python gRPC code for `protos/` into `peer/gen/`.

The generated files are committed so that a peer needs no build step; `tests/unit/test_protogen.py`
regenerates into a temporary directory and fails if anything differs.

    python -m peer.protogen            # regenerate peer/gen/ after editing protos/
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO / "protos"
GEN_ROOT = REPO / "peer" / "gen"
# protoc writes `from sitemesh.v1 import x_pb2`; our generated tree lives under peer.gen.
_IMPORT_RE = re.compile(r"^from sitemesh\.(\S+) import", re.MULTILINE)


def proto_files(root: Path = PROTO_ROOT) -> list[Path]:
    return sorted(root.rglob("*.proto"))


def generate(out: Path) -> None:
    """Runs protoc on every .proto under protos/ and writes importable packages into `out`."""
    from grpc_tools import protoc  # build-time dependency only

    import grpc_tools

    out.mkdir(parents=True, exist_ok=True)
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    files = [str(p.relative_to(PROTO_ROOT)) for p in proto_files()]
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *files,
    ]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed: {' '.join(args)}")
    for path in out.rglob("*.py*"):
        text = path.read_text()
        fixed = _IMPORT_RE.sub(r"from peer.gen.sitemesh.\1 import", text)
        if fixed != text:
            path.write_text(fixed)
    for d in [out, *[p for p in out.rglob("*") if p.is_dir()]]:
        (d / "__init__.py").touch()


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        shutil.rmtree(GEN_ROOT, ignore_errors=True)
        shutil.copytree(tmp, GEN_ROOT)
    print(f"generated {len(proto_files())} proto files into {GEN_ROOT.relative_to(REPO)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
