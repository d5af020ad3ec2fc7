"""Benchmark: spade's JSONL row I/O (``spade_cli.core.artifacts``) on realistic rows.

Reads a rollouts file of N_ROWS episodes with ~2k token ids each (bench_regret's generator) through
``read_rows`` (the path `spade report`, `spade inspect` and the update take), and small rows
(validations) the same way; writes the parsed records back with ``write_jsonl`` (atomic: temp,
fsync, rename) and through a ``PartialWriter`` (one flushed line per row). Each figure is the best
of ``--repeat`` runs, in CPU seconds of this process (steadier than wall time on a shared machine;
fsync waits are not in it), printed as one JSON line, so two versions of the reader can be
compared on one machine.

    .venv/bin/python recipes/bench_rows.py --rows 5000
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return round(min(times), 4)


def main() -> None:
    from bench_regret import generate

    from spade_cli.core.artifacts import PartialWriter, read_records, read_rows, write_jsonl

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=5_000)
    ap.add_argument("--small-rows", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None, help="Work directory (default: a temp dir, removed).")
    args = ap.parse_args()
    d = args.dir or Path(tempfile.mkdtemp(prefix="bench_rows_"))
    d.mkdir(parents=True, exist_ok=True)
    try:
        vpath, rpath = generate(d, args.rows, max(1, args.rows // 200), 500, 1_500)
        small = d / "small.jsonl"
        row = json.loads(vpath.read_text().splitlines()[0])
        small.write_text("".join(json.dumps({**row, "title": f"Env {i}"}) + "\n" for i in range(args.small_rows)))
        big = read_records(rpath, "spade.rollout")
        few = read_records(small, "spade.validation")

        def partial() -> None:
            (d / "out.partial").unlink(missing_ok=True)
            with PartialWriter(d / "out.partial") as w:
                for rec in big:
                    w.write(rec)

        out = {
            "rows": args.rows, "mb": round(rpath.stat().st_size / 1e6, 1), "small_rows": args.small_rows,
            "read_big_s": best(lambda: sum(1 for _ in read_rows(rpath, "spade.rollout")), args.repeat),
            "read_small_s": best(lambda: sum(1 for _ in read_rows(small, "spade.validation")), args.repeat),
            "write_big_s": best(lambda: write_jsonl(d / "out.jsonl", big), args.repeat),
            "write_small_s": best(lambda: write_jsonl(d / "out_small.jsonl", few), args.repeat),
            "partial_big_s": best(partial, args.repeat),
        }
        print(json.dumps(out))
    finally:
        if args.dir is None:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
