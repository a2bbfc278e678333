"""`zerobubble bench data`: how fast, and in how much memory, a large prompt set loads (rows/s, peak resident memory
of a process that loads only it), for each format, beside the plain way of reading the same file: every row
decoded into a Python dict and kept (json.loads per line, or parquet's table turned into a list of dicts), which is
what the buffer did before its rows were kept as Arrow columns.

Each load runs in a fresh process, so its peak is its own; the process's memory before loading is reported too.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FORMATS = ("jsonl", "parquet", "folder")


def verl_columns(rows: int):
    """A verl-shaped set (prompt messages, reward_model.ground_truth, data_source) of short arithmetic questions."""
    import pyarrow as pa

    questions = [f"What is {i % 997} + {i % 991}? Reason step by step." for i in range(rows)]
    return pa.table({
        "data_source": pa.array(["arithmetic"] * rows),
        "prompt": pa.array([[{"role": "user", "content": q}] for q in questions]),
        "reward_model": pa.array([{"style": "rule", "ground_truth": str(i % 997 + i % 991)} for i in range(rows)]),
        "extra_info": pa.array([{"index": i} for i in range(rows)]),
    })


def write_sets(directory: Path, rows: int, formats: tuple[str, ...]) -> dict[str, Path]:
    import pyarrow.parquet as pq

    table = verl_columns(rows)
    paths = {}
    if "jsonl" in formats:
        paths["jsonl"] = directory / "train.jsonl"
        with open(paths["jsonl"], "w", encoding="utf-8") as out:
            for batch in table.to_batches(max_chunksize=65_536):
                out.writelines(json.dumps(row) + "\n" for row in batch.to_pylist())
    if "parquet" in formats or "folder" in formats:
        paths["parquet"] = directory / "train.parquet"
        pq.write_table(table, paths["parquet"])
    if "folder" in formats:
        import datasets

        datasets.disable_progress_bars()
        paths["folder"] = directory / "train-dataset"
        datasets.Dataset.from_parquet(str(paths["parquet"]), cache_dir=str(directory / "cache")).save_to_disk(
            str(paths["folder"]))
    return {name: path for name, path in paths.items() if name in formats}


def _max_rss_mb() -> float:
    """This process's peak resident memory. Not getrusage's ru_maxrss: that keeps the parent's peak across fork and
    exec, and the parent here has imported far more."""
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0]) / 1024  # kB


def load(kind: str, path: str) -> dict:
    """The load's rows and seconds, and this process's peak memory before and after it."""
    import pyarrow as pa

    from zerobubble.buffer.config import PromptsConfig
    from zerobubble.buffer.prompts import PromptSource

    pa.array(["warm"])  # pyarrow's first array imports pandas: part of every process, not of the load
    before = _max_rss_mb()
    started = time.perf_counter()
    if kind == "zerobubble":
        rows = len(PromptSource.from_config(PromptsConfig(path=path)))
    elif path.endswith(".jsonl"):
        with open(path, encoding="utf-8") as lines:
            kept = [json.loads(line) for line in lines]
        rows = len(kept)
    else:
        import pyarrow.parquet as pq

        kept = pq.read_table(path).to_pylist()
        rows = len(kept)
    return {"rows": rows, "seconds": time.perf_counter() - started, "rss_before_mb": before,
            "peak_rss_mb": _max_rss_mb()}


def measure(kind: str, path: Path) -> dict:
    """`load` in a fresh interpreter that imports only the loader, so the peak is the load's own."""
    done = subprocess.run([sys.executable, "-m", "zerobubble.tooling.bench.data", kind, str(path)],
                          capture_output=True, text=True, check=True)
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    figures["rows_per_second"] = figures["rows"] / figures["seconds"]
    figures["load_mb"] = figures["peak_rss_mb"] - figures["rss_before_mb"]
    return figures


def bench_data(*, rows: int, formats: tuple[str, ...], workdir: Path | None) -> dict:
    with tempfile.TemporaryDirectory(dir=workdir) as directory:
        started = time.perf_counter()
        paths = write_sets(Path(directory), rows, formats)
        print(f"wrote {rows:,} verl-shaped rows as {', '.join(paths)} in {time.perf_counter() - started:.1f} s",
              flush=True)
        report: dict = {"rows": rows}
        for name, path in paths.items():
            size = sum(f.stat().st_size for f in path.rglob("*")) if path.is_dir() else path.stat().st_size
            cases = [("zerobubble", f"{name}")]
            if name != "folder":
                cases.append(("dicts", f"{name}_as_dicts"))
            for kind, label in cases:
                figures = measure(kind, path)
                figures["file_mb"] = size / 2**20
                report[label] = {k: round(v, 2) for k, v in figures.items()}
                what = "kept as Arrow columns" if kind == "zerobubble" else "every row kept as a Python dict"
                print(f"{name:8s} {what:32s} {figures['rows_per_second']:>10,.0f} rows/s  "
                      f"{figures['seconds']:6.1f} s  peak {figures['peak_rss_mb']:7.0f} MB "
                      f"(+{figures['load_mb']:.0f} MB over the {figures['rss_before_mb']:.0f} MB process; "
                      f"file {size / 2**20:.0f} MB)", flush=True)
    return report


def _formats(text: str) -> tuple[str, ...]:
    chosen = tuple(name for name in text.split(",") if name)
    unknown = sorted(set(chosen) - set(FORMATS))
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"expected some of {', '.join(FORMATS)}, got {text!r}")
    return chosen


def register_bench(benches) -> None:
    parser = benches.add_parser("data", help="a large prompt set's load: rows/s and peak memory per format, beside "
                                "keeping every row as a Python dict")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--formats", type=_formats, default=FORMATS, help=f"comma-separated, of {', '.join(FORMATS)}")
    parser.add_argument("--workdir", type=Path, default=None, help="where the sets are written (default: the "
                        "system's temporary folder)")
    parser.set_defaults(measure=lambda args: bench_data(
        rows=args.rows, formats=args.formats, workdir=args.workdir))


if __name__ == "__main__":
    print(json.dumps(load(sys.argv[1], sys.argv[2])))
