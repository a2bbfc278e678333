"""The python tool: runs the model's program in the bubblewrap sandbox (common/sandbox) and answers with what it
printed, as the ReTool / verl sandbox-tool pattern does. The sandbox's limits (config `sandbox`) bound its time,
memory and output; the tool environment cuts the answer to limits.max_tool_output_chars. The step's deadline bounds
the wait for a sandbox slot and the program together: past it the program is killed and the step ends with
`timeout`."""

from __future__ import annotations

from collections.abc import Callable

from zerobubble.common.sandbox.runner import CodeSandbox
from zerobubble.environment.deadlines import StepTimeout, current_deadline


def python_tool(sandbox: CodeSandbox) -> Callable[[str], str]:
    def python(code: str) -> str:
        """Run a Python program and return what it printed (stdout, then stderr).

        Args:
            code: the program's source
        """
        result = sandbox.run(code, "", current_deadline())
        if result.status == "deadline":
            raise StepTimeout(f"the python tool's program did not end within the step's time ({result.stderr})")
        text = result.stdout + (f"\n[stderr]\n{result.stderr}" if result.stderr else "")
        return text if result.status == "ok" else f"{text}\n[{result.status}]".lstrip()

    return python
