"""accel cache: the plans plan="auto" remembered (accel.plancache): list them, or clear them."""
from __future__ import annotations

import argparse
import json


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("cache", help="list or clear the plans plan='auto' remembered")
    parser.add_argument("action", choices=("list", "clear"))
    parser.add_argument("--key", help="clear only this entry (a key or its first characters)")
    parser.add_argument("--json", action="store_true", help="list as JSON")
    return parser


def run(args) -> int:
    from accel import plancache

    folder = plancache.cache_dir()
    if args.action == "clear":
        removed = plancache.clear(key=args.key)
        print(f"accel cache: removed {removed} entr{'y' if removed == 1 else 'ies'} from {folder}")
        return 0
    entries = plancache.entries()
    if args.json:
        print(json.dumps(entries, indent=2, default=str))
        return 0
    print(f"accel cache: {len(entries)} remembered plan(s) in {folder}")
    for entry in entries:
        facts = entry["facts"]
        names = list(entry["plan"] or {}) or ["the empty plan"]
        print(f"  {entry['key'][:12]}  {entry['measured_at'] or '?':19}  {'+'.join(names)}")
        if facts:
            print(f"      {facts.get('model', '')}; batch {facts.get('batch', '')}; {facts.get('optimizer', '')}; "
                  f"{facts.get('device', '')}, {facts.get('cpu', '')}; {facts.get('versions', '')}")
    return 0
