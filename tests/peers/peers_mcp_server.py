"""An MCP server made with the mcp SDK, for the tests: `python peers_mcp_server.py stdio` or
`python peers_mcp_server.py http PORT`."""

import asyncio
import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("peers-test-tools")


@server.tool()
def add(a: int, b: int) -> int:
    """Adds two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b


@server.tool()
def shout(text: str) -> str:
    """The text in capitals, repeated 1000 times."""
    return text.upper() * 1000


@server.tool()
def fail(reason: str) -> str:
    """Always fails with the reason."""
    raise ValueError(reason)


@server.tool()
async def sleep(seconds: float) -> str:
    """Sleeps, then says so."""
    await asyncio.sleep(seconds)
    return "slept"


@server.tool()
def die() -> str:
    """Ends the server's process."""
    sys.stdout.flush()
    import os

    os._exit(3)


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
