"""Which commits hold the engine code a benchmark record names: the digest in a record's provenance ("code").

    python benchmarks/code_commit.py DIGEST [--last 200]

bench's `code_digest` hashes every spice_core/*.py by path; this recomputes it for the last commits of the
current branch (git) and prints those that match, newest first, so a shard can run on the code its cell
started with (`git archive COMMIT spice_core`). Exit status 1 when none of them matches.
"""
from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
from pathlib import PurePosixPath


def git(*args: str) -> bytes:
    return subprocess.run(["git", *args], check=True, capture_output=True).stdout


def digest_at(rev: str) -> str:
    """`spice_core.tools.bench.code_digest` of the tree at ``rev`` (same order, same bytes)."""
    files = git("ls-tree", "-r", "--name-only", rev, "spice_core").decode().split()
    h = hashlib.sha256()
    for f in sorted((PurePosixPath(f) for f in files if f.endswith(".py"))):
        h.update(str(f.relative_to("spice_core")).encode())
        h.update(git("show", f"{rev}:{f}"))
    return h.hexdigest()[:16]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("digest", help="the 16 hex digits of a record's provenance code")
    ap.add_argument("--last", type=int, default=200, help="how many commits back to look (default 200)")
    args = ap.parse_args(argv)
    try:
        revs = git("rev-list", "-n", str(args.last), "HEAD").decode().split()
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"error: git could not list the commits ({e}): run this inside the repository", file=sys.stderr)
        return 2
    found = [r for r in revs if digest_at(r) == args.digest.strip().lower()]
    for r in found:
        print(r[:12], git("log", "-1", "--format=%cs %s", r).decode().strip()[:100])
    if not found:
        print(f"no commit among the last {len(revs)} has engine code {args.digest}: raise --last", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
