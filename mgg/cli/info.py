"""`mgg info`: versions, backends and devices."""

from __future__ import annotations

import json


def add(sub):
    s = sub.add_parser("info", help="versions, backends and devices")
    s.add_argument("--json", action="store_true")
    return s


def main(args) -> int:
    from ..backend import describe

    info = describe()
    if args.json:
        print(json.dumps(info))
    else:
        for k, v in info.items():
            print(f"{k:>14}: {v}")
    return 0
