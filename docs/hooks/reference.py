"""Reference pages made at build time from the code itself, so they never drift from it: the configuration from
the pydantic schemas, the CLI from its argparse parsers, the RPCs from protos/, the HTTP routes from the reward
service's router and the Tinker front's app."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("reward", "buffer", "rollout", "trainer", "environment", "teacher")


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


def configuration() -> str:
    import importlib

    from zerobubble.common.config_reference import describe
    from zerobubble.tooling.launcher.config import UpConfig

    parts = ["# Configuration", "",
             "Every setting, its default and its meaning, read from the schemas when these pages are built "
             "(`zerobubble config SERVICE` prints the same). A run of `zerobubble up` is configured by its own "
             "file (below, first); `zerobubble serve SERVICE --config FILE` reads the service's.", ""]
    from zerobubble.tooling.tinker.config import TinkerServerConfig

    schemas = [("zerobubble up", UpConfig)]
    for name in SERVICES:
        schemas.append((f"{name} service", importlib.import_module(f"zerobubble.{name}.app").CONFIG_SCHEMA))
    schemas.append(("Tinker API front (zerobubble tinker)", TinkerServerConfig))
    for title, schema in schemas:
        rows = [(f"`{name}`", f"`{default}`", doc) for name, default, doc in describe(schema)]
        parts += [f"## {title}", "", _table(("key", "default", "meaning"), rows), ""]
    return "\n".join(parts)


def cli() -> str:
    from zerobubble.tooling import cli as command

    parts = ["# Command line", "", "`zerobubble --help` and every command's own `--help`, as this build prints them.",
             ""]

    def help_of(argv: list[str]) -> str:
        parser = command.build_parser(argv)
        node = parser
        for word in argv:
            subparsers = next(action for action in node._actions if isinstance(action, argparse._SubParsersAction))
            node = subparsers.choices[word]
        return node.format_help()

    parts += ["## zerobubble", "", "```text", help_of([]).rstrip(), "```", ""]
    for name in ["serve", "config", "score", "demo", *command.COMMANDS]:
        parts += [f"## zerobubble {name}", "", "```text", help_of([name]).rstrip(), "```", ""]
    for name in command.BENCHES:
        parts += [f"## zerobubble bench {name}", "", "```text", help_of(["bench", name]).rstrip(), "```", ""]
    return "\n".join(parts)


_RPC = re.compile(r"((?:\s*//[^\n]*\n)*)\s*rpc (\w+)\((stream )?(\w+)\) returns \((stream )?(\w+)\)")


def rpcs() -> str:
    parts = ["# gRPC contracts", "",
             "Every RPC of every service, with the comment its `.proto` gives it; then each contract whole. The "
             "files in `protos/zerobubble/v1/` are the truth; the Python stubs beside them are generated "
             "(`make protos`).", ""]
    for proto in sorted((ROOT / "protos" / "zerobubble" / "v1").glob("*.proto")):
        text = proto.read_text()
        rows = []
        for match in _RPC.finditer(text):
            comment = " ".join(line.strip().removeprefix("//").strip() for line in match.group(1).strip().splitlines())
            request = ("stream " if match.group(3) else "") + match.group(4)
            reply = ("stream " if match.group(5) else "") + match.group(6)
            rows.append((f"`{match.group(2)}`", f"`{request}`", f"`{reply}`", comment))
        parts += [f"## {proto.name}", ""]
        if rows:
            parts += [_table(("rpc", "request", "reply", "what it does"), rows), ""]
        parts += ["??? note \"the whole contract\"", "", "    ```protobuf"]
        parts += ["    " + line if line else "" for line in text.rstrip().splitlines()]
        parts += ["    ```", ""]
    return "\n".join(parts)


_ROUTE = re.compile(r'add_(get|post)\("([^"]+)"')
_TINKER_ROUTE = re.compile(r'@app\.(get|post)\(f"\{API\}([^"]+)"\)')


def http() -> str:
    from zerobubble.reward import http_contracts

    source = (ROOT / "services" / "reward" / "http_server.py").read_text()
    rows = [(method.upper(), f"`{path}`") for method, path in _ROUTE.findall(source)]
    return "\n".join(["# HTTP routes of the reward service", "",
                      "The routes its HTTP server registers (`services/reward/http_server.py`):", "",
                      _table(("method", "path"), rows), "",
                      "Their JSON contracts, as `services/reward/http_contracts.py` states them:", "",
                      http_contracts.__doc__ or "", "", *tinker_routes()])


def tinker_routes() -> list[str]:
    source = (ROOT / "services" / "tooling" / "tinker" / "app.py").read_text()
    api = re.search(r'^API = "([^"]+)"', source, flags=re.MULTILINE).group(1)
    rows = [(method.upper(), f"`{api}{path}`") for method, path in _TINKER_ROUTE.findall(source)]
    return ["## The Tinker API front", "",
            "The routes `services/tooling/tinker/app.py` serves, as the official `tinker` client calls them "
            "([the guide](../guides/tinker.md) says what each does and what of the API is not served); any other "
            f"path under `{api}/` answers 404 naming it:", "", _table(("method", "path"), rows), ""]


PROTOCOL_MARKER = "<!-- sync-protocol-table -->"


def sync_protocol_tables() -> str:
    from zerobubble.common.sync_protocol import ANY, TRANSITIONS

    parts = []
    for part in dict.fromkeys(type(t.target) for t in TRANSITIONS):
        rows = [("any" if t.source == ANY else t.source.value, t.target.value, t.trigger, f"`{t.test}`")
                for t in TRANSITIONS if type(t.target) is part]
        parts += [f"### {part.__name__}", "", (part.__doc__ or "").strip(), "",
                  _table(("from", "to", "when", "tested by"), rows), ""]
    return "\n".join(parts)


SERVICES_MARKER = "<!-- services-table -->"


def services_table() -> str:
    """The services `zerobubble serve` starts, each with what its assembly says it holds and its contract."""
    import importlib

    from zerobubble.tooling.cli import SERVICES

    rows = []
    for name in SERVICES:
        doc = importlib.import_module(f"zerobubble.{name}.app").__doc__ or ""
        holds = " ".join(doc.strip().split("\n\n")[0].split())
        rows.append((f"`{name}`", holds, f"`protos/zerobubble/v1/{name}.proto`", f"`zerobubble serve {name}`"))
    return _table(("service", "what it assembles", "contract", "started by"), rows)


def on_page_markdown(markdown, page, config, files):
    if PROTOCOL_MARKER in markdown:
        markdown = markdown.replace(PROTOCOL_MARKER, sync_protocol_tables())
    if SERVICES_MARKER in markdown:
        markdown = markdown.replace(SERVICES_MARKER, services_table())
    return markdown


PAGES = {"reference/configuration.md": configuration, "reference/cli.md": cli, "reference/rpcs.md": rpcs,
         "reference/http.md": http}


def on_files(files, config):
    for uri, make in PAGES.items():
        files.append(File.generated(config, uri, content=make()))
    return files
