"""Which verifier scores a prompt row: by the row's data source (as verl routes by `data_source`), else a default.
One run can so mix math and code prompts."""

from __future__ import annotations

from pydantic import Field

from zerobubble.common.config import Schema


class VerifierRouting(Schema):
    verifier: str = Field("boxed", min_length=1, description="the reward service's verifier for rows whose data "
                          "source by_data_source does not name: boxed, think_answer_tags, code, or one its config "
                          "adds")
    by_data_source: dict[str, str] = Field(default_factory=dict, description="data_source -> verifier, e.g. "
                                           "{gsm8k: boxed, apps: code}")

    def verifier_for(self, data_source: str | None) -> str:
        return self.by_data_source.get(data_source, self.verifier) if data_source is not None else self.verifier

    def verifiers(self) -> list[str]:
        """Every verifier a row may be routed to, the default first."""
        return list(dict.fromkeys([self.verifier, *self.by_data_source.values()]))
