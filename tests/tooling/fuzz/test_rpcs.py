"""At least 1,000 generated messages to every RPC of every service: no UNKNOWN or INTERNAL, no crash, no hang,
and a valid call answers afterwards."""

from __future__ import annotations

import pytest
from conftest import SEED

from zerobubble.tooling.fuzz.campaign import fuzz_rpc
from zerobubble.tooling.fuzz.targets import RPCS, health, valid_call

EXAMPLES = 1000


@pytest.mark.parametrize("rpc", RPCS, ids=lambda rpc: rpc.name)
def test_generated_messages_get_an_answer_and_leave_the_service_serving(services, rpc):
    report = fuzz_rpc(services, rpc, examples=EXAMPLES, seed=SEED)
    findings = "\n".join(str(finding) for finding in report.findings)
    assert not report.findings, f"{len(report.findings)} findings after {report.sent} calls:\n{findings}"
    assert report.sent >= EXAMPLES
    assert services.processes[rpc.service].alive()
    assert health(services, rpc.service)
    assert valid_call(services, rpc.service) is None
