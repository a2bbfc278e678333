"""`zerobubble view`'s settings, validated before anything is served."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from zerobubble.common.config import Schema
from zerobubble.tooling.viewer.lines import MAX_LINE_BYTES


class ViewConfig(Schema):
    run_dir: Path = Field(description="the run folder `zerobubble up` wrote")
    host: str = Field("127.0.0.1", min_length=1, description="the address to listen on (loopback: this machine only)")
    port: int = Field(8765, ge=0, le=65535, description="the port (0: any free one)")
    allowed_hosts: list[str] = Field(default_factory=list, description="names the page is opened by besides the "
                                     "loopback names and `host` (a request naming another Host is refused: DNS "
                                     "rebinding)")
    max_line_bytes: int = Field(MAX_LINE_BYTES, gt=0, description="a longer line of the run's files is skipped with "
                                "a note, never read")

    @field_validator("run_dir")
    @classmethod
    def _a_folder(cls, value: Path) -> Path:
        if not value.is_dir():
            raise ValueError(f"{value} is not a folder")
        return value
