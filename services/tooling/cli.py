"""The `zerobubble` command."""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import importlib
import io
import json
import logging
import os
import sys
from pathlib import Path
from typing import NoReturn

from zerobubble.common.config_tree import ConfigError
from zerobubble.common.logs import setup_logging
from zerobubble.tooling.launcher.ready import announce
from zerobubble.tooling.launcher.tether import follow_launcher

SERVICES = ("reward", "buffer", "rollout", "trainer", "environment", "teacher")


def _service_module(name: str):
    try:
        return importlib.import_module(f"zerobubble.{name}.app")
    except ModuleNotFoundError as exc:
        if exc.name == f"zerobubble.{name}.app":
            raise SystemExit(f"zerobubble: the {name} service is not part of this build yet") from None
        raise


class _Version(argparse.Action):
    """argparse's own, but reading the installed version only when asked (importlib.metadata is slow to import)."""

    def __call__(self, parser, namespace, values, option_string=None):
        from importlib.metadata import version

        print(f"{parser.prog} {version('zerobubble')}")
        parser.exit()


def _overrides(args) -> list[str]:
    sets = list(args.set or [])
    if args.listen:
        sets.append(f"server.listen={args.listen}")
    if args.metrics_port is not None:
        sets.append(f"server.metrics_port={args.metrics_port}")
    return sets


def _schema_name(name: str) -> str:
    return f"{name.capitalize()}ServiceConfig"


def _service_schema(name: str):
    """The service's config schema, from its config module alone: checking a config imports no torch."""
    return getattr(importlib.import_module(f"zerobubble.{name}.config"), _schema_name(name))


def cmd_serve(args) -> NoReturn:
    from zerobubble.tooling.launcher.early_refusal import refuse_missing_paths, refuse_mistyped, remember_keys

    # The config, the model folder and the data are checked before the service's code (torch, for most) loads;
    # what is certainly wrong, before even its schema is built.
    refuse_mistyped(args.service, _schema_name(args.service), args.config, _overrides(args))
    refuse_missing_paths(args.service, args.config, _overrides(args))
    from zerobubble.common.config import key_tree, load_config
    from zerobubble.tooling.launcher.preflight import check_service

    schema = _service_schema(args.service)
    try:
        config = load_config(schema, args.config, _overrides(args))
    finally:
        remember_keys(args.service, key_tree(schema))
    check_service(args.service, config)
    module = _service_module(args.service)
    follow_launcher(config.server.grace_seconds)
    host = module.build(config).start()
    # One JSON line for users and scripts; it gives the bound port when 0 was asked. `zerobubble up` reads it from a
    # file of its own, since libraries print on stdout too.
    ready = {"service": args.service, "address": host.address, "metrics_port": host.metrics_port,
             **getattr(host, "endpoints", {})}
    print(json.dumps(ready), flush=True)
    announce(ready)
    code = host.run_until_signal()
    # The service has closed what it owns; the interpreter's own teardown (seconds with torch loaded, or
    # forever behind a thread stuck in a call) would only stretch the shutdown past the grace.
    logging.shutdown()
    sys.stdout.flush()
    os._exit(code)


def cmd_config(args) -> int:
    from zerobubble.common.config_reference import reference

    if args.service == "up":
        from zerobubble.tooling.launcher.config import UpConfig

        print(reference(UpConfig))
    else:
        print(reference(_service_schema(args.service)))
    return 0


def cmd_score(args) -> int:
    from zerobubble.reward.cli_score import run_score

    return run_score(args)


def cmd_demo(args) -> int:
    from zerobubble.reward.demo import run_demo

    return run_demo()


def cmd_bench(args) -> int:
    print(json.dumps(args.measure(args)))
    return 0


# Each area adds its own subcommands here: a module with `register(subparsers)` (and, for benchmarks,
# `register_bench(bench_subparsers)` whose parsers set `measure` to a function returning the figures), named with a
# one-line summary for the command list. A module is imported only when one of its commands runs: most bring torch,
# which the light install (`pip install zerobubble`, no `[train]`) lacks and which `--help` and `serve reward` skip.
COMMANDS = {
    "make-tiny-model": ("tiny.commands", "write a tiny Qwen2-architecture model and tokenizer"),
    "make-task": ("tiny.commands", "write a synthetic task: train.jsonl and held-out eval.jsonl"),
    "up": ("launcher.commands", "run the whole pipeline on this machine (default: the tiny CPU demo)"),
    "plot": ("plot", "draw a run's training curves (and evaluations) into one PNG"),
    "eval": ("evaluate", "pass@1 and pass@k of a model folder on a data set"),
    "export": ("export", "write a run's final policy as a Hugging Face model folder"),
    "slurm-plan": ("slurm_plan", "inside a Slurm job: each node's service, address and config"),
    "view": ("viewer.commands", "browse a run in a local web page: curves, rollouts, tokens, evaluations"),
    "front": ("front", "the HAProxy config before a service's gRPC port: per-peer limit, quiet connections closed"),
    "tinker": ("tinker.command", "serve the Tinker training API over Zerobubble's trainer and engine"),
}
BENCHES = {
    "transport": ("bench.transport", "buffer push-to-pull throughput vs a Ray actor queue and a socket"),
    "reward": ("bench.reward", "math scores/s with 1 and N workers; sandboxed programs/s"),
    "weights": ("bench.weights", "bucketed vs per-tensor vs flat weight broadcast"),
    "rollout": ("bench.rollout", "engine tokens/s vs a rollout worker's end to end"),
    "pipeline": ("bench.pipeline", "the demo pipeline on-policy vs asynchronous"),
    "train": ("bench.train", "trainer step at a real vocabulary: today's full logits vs chunked, packed, by tokens"),
    "in-flight": ("bench.in_flight", "run.weight_updates modes vs between batches on long generations"),
    "gpu-train": ("bench.gpu", "trainer step on a Qwen2-0.5B-shaped model vs the GPU's peak"),
    "gpu-generate": ("bench.gpu", "transformers engine tokens/s on a Qwen2-0.5B-shaped model"),
    "gpu-sync": ("bench.gpu", "weight sync trainer -> rollout on one GPU"),
    "fuzz": ("bench.fuzz", "soak every RPC of every service with generated messages and wire abuse"),
    "data": ("bench.data", "a large prompt set's load: rows/s and peak memory per format"),
    "scale": ("bench.scale", "the buffer under 64 producers and 4 pullers; its restart on a large log"),
    "connections": ("bench.connections", "each service under 1,024 descriptors against 2,000 quiet connections"),
    "episodes": ("bench.episodes", "multi-turn episodes vs the same tokens single-turn: the cost of turns"),
    "learning": ("bench.learning", "the demo vs TRL's GRPOTrainer: pass@1 gained per sample and minute"),
    "distill": ("bench.distill", "the distill demo vs TRL's DistillationTrainer: pass@1 gained per sample and minute"),
    "environment": ("bench.environment", "environment service: open and step latency, steps/s of episodes at once"),
    "tinker": ("bench.tinker", "the tinker-cookbook's RL loop against the Tinker front vs up: pass@1 gained a minute"),
    "refusals": ("bench.refusals", "seconds for up and serve to refuse bad input at load 4, vs python's start"),
    "openai": ("bench.openai_calls", "agent sessions calling the OpenAI endpoint at once: batched vs locked"),
}

# What the train extra brings: a command that needs one of these on a light install says which extra to add.
TRAIN_EXTRA_MODULES = frozenset({"torch", "transformers", "safetensors", "jinja2", "numpy", "isal", "matplotlib",
                                 "pyarrow", "datasets", "peft"})


def _add_lazy(subparsers, table: dict[str, tuple[str, str]], chosen: str | None, register: str) -> None:
    """Adds every command of `table`: the chosen one through its module's own `register`, the others as names with
    their summary (enough for the command list; a command is only parsed in full when it runs)."""
    if chosen in table:
        getattr(importlib.import_module(f"zerobubble.tooling.{table[chosen][0]}"), register)(subparsers)
    for name, (_module, summary) in table.items():
        if name not in subparsers.choices:
            subparsers.add_parser(name, help=summary)


def _chosen(argv: list[str]) -> tuple[str | None, str | None]:
    """The command and, after `bench`, the benchmark that argv names: what decides which modules to import."""
    rest = list(argv)
    while rest and rest[0].startswith("-"):
        option = rest.pop(0)
        if option == "--log-level" and rest:
            rest.pop(0)
    command = rest[0] if rest else None
    bench = rest[1] if command == "bench" and len(rest) > 1 else None
    return command, bench


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    command, bench_name = _chosen(argv)
    parser = argparse.ArgumentParser(prog="zerobubble", description=__doc__)
    parser.add_argument("--version", action=_Version, nargs=0, help="show the version and exit")
    parser.add_argument("--log-level", default=None, help="DEBUG, INFO, WARNING (default INFO)")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run one service until SIGTERM")
    serve.add_argument("service", choices=SERVICES)
    serve.add_argument("--config", type=Path, help="YAML file; fields not given keep their defaults")
    serve.add_argument("--listen", help="HOST:PORT (server.listen)")
    serve.add_argument("--metrics-port", type=int, help="Prometheus port (server.metrics_port)")
    serve.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a field, e.g. math.workers=4")
    serve.set_defaults(run=cmd_serve)

    config = sub.add_parser("config", help="list a service's settings (or `up`'s, the run's) with their defaults")
    config.add_argument("service", choices=(*SERVICES, "up"))
    config.set_defaults(run=cmd_config)

    score = sub.add_parser("score", help="score one completion or a JSONL file of them")
    score.add_argument("--verifier", default="boxed", help="boxed, think_answer_tags, code, or one the service's "
                       "config adds (custom, reward_model, combined)")
    score.add_argument("--gt", help="ground-truth answer (math verifiers)")
    score.add_argument("--tests", type=Path, help='JSON file {"inputs": [...], "outputs": [...]} (code)')
    score.add_argument("--response", help="the completion (default: read standard input)")
    score.add_argument("--prompt", default="", help="the prompt it answers (the reward model reads it)")
    score.add_argument("--file", type=Path, help="JSONL rows {verifier, response, gt_answer | test_cases, prompt, "
                       "metadata}")
    score.add_argument("--json", action="store_true", help="one JSON object per row instead of a table")
    score.add_argument("--partial-credit", action="store_true", help="code: reward the fraction of tests passed")
    score.add_argument("--server", help="HOST:PORT of a running reward service (default: start one here)")
    score.add_argument("--config", type=Path, help="reward service config when none is given by --server")
    score.add_argument("--timeout", type=float, default=300.0, help="deadline in seconds")
    score.set_defaults(run=cmd_score)

    demo = sub.add_parser("demo", help="start the reward service and score built-in examples")
    demo.set_defaults(run=cmd_demo)

    bench = sub.add_parser("bench", help="measure throughput; prints one JSON object as its last line")
    benches = bench.add_subparsers(dest="what", required=True)
    bench.set_defaults(run=cmd_bench)
    _add_lazy(benches, BENCHES, bench_name, "register_bench")
    _add_lazy(sub, COMMANDS, command, "register")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # A crash inside a native library (gloo, NCCL, a tokenizer) then leaves every thread's Python stack in the log;
    # called in-process with stderr replaced (a test capturing it), there is no descriptor to write to.
    with contextlib.suppress(AttributeError, io.UnsupportedOperation):
        faulthandler.enable()
    try:
        args = build_parser(argv).parse_args(argv)
        setup_logging(args.log_level)
        return args.run(args)
    except ConfigError as exc:
        print(f"zerobubble: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in TRAIN_EXTRA_MODULES:
            raise
        print(f"zerobubble: this command needs {exc.name}, which the train extra brings: "
              "pip install 'zerobubble[train]'", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        # A path on the command line that is not there is the user's to fix: a message, not a traceback.
        logging.getLogger(__name__).debug("missing file", exc_info=True)
        print(f"zerobubble: {exc.filename}: no such file or folder", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
