"""Tools from an MCP server, through the official `mcp` client: listed once when the environments are loaded (their
`inputSchema` is the OpenAI function schema's `parameters`), then called from each episode's own process as any
other tool, so the tool environment's output bound and error handling apply to them unchanged.

Each episode's process opens its own connection on its first call (a stdio server is then a child of that process
and dies with the episode); a call that takes longer than the server's `call_timeout_s`, a server that died or
answered an error, is an `error: ...` the model reads, never a hung episode.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from zerobubble.environment.config import McpServerConfig

# A stdio server's command naming one of these runs on the service's interpreter.
PYTHON_NAMES = frozenset({"python", "python3"})


class McpToolError(RuntimeError):
    """What the model reads when an MCP tool could not give a result."""


def _client(server: McpServerConfig):
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    if server.url is not None:
        return Client(server.url)
    command, *args = server.command
    if command in PYTHON_NAMES:
        # The service's own interpreter, which has `mcp` (and the user's packages), not the first on PATH.
        command = sys.executable
    # The server's stderr to the process's own: the SDK's default is whatever sys.stderr was when it was first
    # imported, which may be a stream with no file descriptor (a test's capture, a log wrapper) that cannot start it.
    return Client(stdio_client(StdioServerParameters(command=command, args=args, env=server.env or None),
                               errlog=sys.__stderr__))


def _schema(tool: Any) -> dict:
    parameters = dict(tool.input_schema or {"type": "object", "properties": {}})
    parameters.pop("title", None)  # the SDK's model name, not part of what the model needs to read
    return {"type": "function", "function": {"name": tool.name, "description": tool.description or "",
                                             "parameters": parameters}}


async def _list(server: McpServerConfig) -> list[dict]:
    async with asyncio.timeout(server.connect_timeout_s), _client(server) as client:
        tools, cursor = [], None
        while True:
            page = await client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
    schemas = [_schema(tool) for tool in tools if not server.tools or tool.name in server.tools]
    missing = sorted(set(server.tools) - {schema["function"]["name"] for schema in schemas})
    if missing:
        raise ValueError(f"the MCP server {server.shown} has no tool {missing[0]!r}")
    return schemas


def list_tools(server: McpServerConfig) -> list[dict]:
    """The server's tools (those named in `server.tools`, or all) as OpenAI function schemas; ValueError saying why
    not."""
    try:
        return asyncio.run(_list(server))
    except ValueError:
        raise
    except TimeoutError:
        raise ValueError(f"the MCP server {server.shown} did not list its tools within "
                         f"connect_timeout_s={server.connect_timeout_s}") from None
    except BaseException as exc:  # noqa: BLE001 - anyio wraps a transport's failure in exception groups
        raise ValueError(f"the MCP server {server.shown} could not list its tools: {_reason(exc)}") from None


def _reason(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _result_text(result: Any) -> str:
    parts = []
    for item in result.content:
        text = getattr(item, "text", None)
        parts.append(text if isinstance(text, str) else f"[{getattr(item, 'type', 'content')} content]")
    return "\n".join(parts)


class McpConnection:
    """One server's client session in this process, on an event loop of its own thread (the tool environment calls
    tools synchronously). Opened on the first call; dropped after a failure so that the next call connects anew."""

    def __init__(self, server: McpServerConfig):
        self.server = server
        self._pid = -1
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: Any = None
        self._stop: asyncio.Event | None = None

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._pid != os.getpid():  # a fork inherits no threads: the parent's loop is not running here
            self._pid, self._loop, self._client = os.getpid(), asyncio.new_event_loop(), None
            threading.Thread(target=self._loop.run_forever, name="mcp-client", daemon=True).start()
        return self._loop

    async def _connect(self) -> None:
        ready = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        asyncio.create_task(self._hold(ready, self._stop))
        self._client = await ready

    async def _hold(self, ready: asyncio.Future, stop: asyncio.Event) -> None:
        """Holds the connection open in a task of its own: the SDK's transports are task groups, which must be left
        by the task that entered them."""
        try:
            async with _client(self.server) as client:
                if not ready.done():
                    ready.set_result(client)
                await stop.wait()
        except BaseException as exc:  # noqa: BLE001 - its calls, if any, fail and say why
            if not ready.done():
                ready.set_exception(McpToolError(_reason(exc)))

    def _run(self, work: Any, timeout: float, what: str) -> Any:
        future = asyncio.run_coroutine_threadsafe(work, self._ensure_loop())
        try:
            return future.result(timeout)
        except FutureTimeout:
            future.cancel()
            self._drop()
            raise McpToolError(f"the MCP server did not {what} within {timeout} s") from None
        except BaseException as exc:  # noqa: BLE001 - a dead server surfaces as one of many transport errors
            self._drop()
            raise McpToolError(f"the MCP server failed: {_reason(exc)}") from None

    def call(self, name: str, arguments: dict) -> str:
        with self._lock:
            if self._client is None or self._pid != os.getpid():
                self._run(self._connect(), self.server.connect_timeout_s, "start")
            result = self._run(self._client.call_tool(name, arguments), self.server.call_timeout_s, "answer")
        if result.is_error:
            raise McpToolError(_result_text(result) or "the tool failed")
        return _result_text(result)

    def _drop(self) -> None:
        """Forgets the connection and closes it in the background (a stdio server's process too)."""
        stop, self._client, self._stop = self._stop, None, None
        if stop is not None:
            self._loop.call_soon_threadsafe(stop.set)


class McpTool:
    """A tool of an MCP server as the tool environment calls it: `tool(**arguments) -> str`."""

    def __init__(self, schema: dict, connection: McpConnection):
        self.schema = schema
        self.__name__ = schema["function"]["name"]
        self._connection = connection

    def __call__(self, **arguments: Any) -> str:
        return self._connection.call(self.__name__, arguments)


def mcp_tools(servers: list[McpServerConfig], schemas: list[list[dict]]) -> list[McpTool]:
    """The tools of `servers`, whose listings (list_tools) are `schemas`, one connection per server."""
    tools = []
    for server, listed in zip(servers, schemas, strict=True):
        connection = McpConnection(server)
        tools.extend(McpTool(schema, connection) for schema in listed)
    return tools
