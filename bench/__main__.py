"""Run benchmarks: ``python -m bench`` runs every ``bench/bench_*.py``;
``python -m bench window mysql --repeat 3`` runs the named ones, passing the options
(everything from the first argument that is not a module name) to each module's
``main(argv)``. Exit status 1 when any benchmark failed, 2 for an unknown name."""

from __future__ import annotations

import importlib
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent


def available() -> list[str]:
    return sorted(p.stem.removeprefix("bench_") for p in HERE.glob("bench_*.py"))


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        print("available:", ", ".join(available()) or "(none)")
        return 0
    known = available()
    names: list[str] = []
    while args and not args[0].startswith("-"):
        name = args[0].removeprefix("bench_").removesuffix(".py")
        if name not in known:
            print(f"unknown benchmark {args[0]!r}; available: {', '.join(known) or '(none)'}", file=sys.stderr)
            return 2
        names.append(name)
        args.pop(0)
    failed: list[str] = []
    for name in names or known:
        print(f"=== bench {name} ===", flush=True)
        t0 = time.perf_counter()
        try:
            rc = importlib.import_module(f"bench.bench_{name}").main(list(args))
        except SystemExit as exc:  # argparse errors and explicit exits
            rc = exc.code
        except Exception:  # noqa: BLE001 - one broken benchmark must not hide the others
            traceback.print_exc()
            rc = 1
        print(f"=== bench {name}: {'ok' if not rc else f'FAILED ({rc})'} in {time.perf_counter() - t0:.1f} s ===", flush=True)
        if rc:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
