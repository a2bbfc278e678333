"""An MCP server (mcp SDK, stdio) whose one tool blocks its event loop for an hour: once called, it reads nothing
more, not even the end of its stdin, as a hung server would."""

import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("peers-blocking")


@server.tool()
async def block() -> str:
    """Blocks the server."""
    time.sleep(3600)
    return "never"


if __name__ == "__main__":
    server.run("stdio")
