"""accel cache: the plans plan="auto" remembered (accel.search.cache): list them, or clear them (clearing all clears
compile's artifacts too, accel.accelerators.compile.cache: the next compile of every setup is cold)."""
from __future__ import annotations

import argparse
import json

import accel.accelerators.compile.cache as compile_cache
import accel.search.cache as plancache
from accel.files import cache_dir, size_text


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("cache", help="list or clear the plans plan='auto' remembered")
    parser.add_argument("action", choices=("list", "clear"),
                        help="list the remembered plans, or clear them (and compile's artifacts)")
    parser.add_argument("--key", help="clear only this entry (a key or its first characters)")
    parser.add_argument("--json", action="store_true", help="list as JSON")
    return parser


def run(args) -> int:
    folder = cache_dir()
    if args.action == "clear":
        ours = compile_cache.owns_compile_folder()
        compiled = compile_cache.clear_compile() if args.key is None else (0, 0)
        removed = plancache.clear(key=args.key)
        print(f"accel cache: removed {removed} entr{'y' if removed == 1 else 'ies'} from {folder} (only accel's "
              "own files there)")
        place = folder / "compile"
        if args.key is None and ours:
            print(f"accel cache: removed compile's artifacts: {_files(*compiled)} from {place}")
        elif args.key is None and place.is_symlink():
            print(f"accel cache: left {place} as it is: a symbolic link, not followed")
        elif args.key is None and place.exists():
            print(f"accel cache: left {place} as it is: accel did not make it (no {compile_cache.TAG})")
        return 0
    entries = plancache.entries()
    if args.json:
        print(json.dumps(entries, indent=2, default=str))
        return 0
    print(f"accel cache: {len(entries)} remembered plan(s) in {folder}")
    print(f"accel cache: compile's artifacts: {_files(*compile_cache.compile_usage())} in {folder / 'compile'} "
          "(accel cache clear removes them too)")
    for entry in entries:
        facts = entry["facts"]
        names = list(entry["plan"] or {}) or ["the empty plan"]
        print(f"  {entry['key'][:12]}  {entry['measured_at'] or '?':19}  {'+'.join(names)}")
        if facts:
            print(f"      {facts.get('model', '')}; batch {facts.get('batch', '')}; {facts.get('optimizer', '')}; "
                  f"{facts.get('device', '')}, {facts.get('cpu', '')}; {facts.get('versions', '')}")
    return 0


def _files(count: int, size: int) -> str:
    return f"{count} file{'' if count == 1 else 's'} ({size_text(size)})"
