"""The HTTP side's JSON reading: a body whose item list it bounds reads as json.loads reads it, bad JSON is
refused naming the body, and a list over its bound is refused naming the list before its later entries are
parsed."""

from __future__ import annotations

import json

import pytest

from zerobubble.common.errors import InvalidInput, TooLarge
from zerobubble.reward.http_contracts import json_body

VALID = [b"{}", b" { } ", b'{"items": []}', b'{"items": [1, {"a": [2]}, "x"] , "b": null}',
         b'{"a":1,"items":[ ]}\n', b"[1,2]", b'"s"', b'{"items": 5}', b'{"items": [1], "items": [2, 3]}',
         b'{"items": [1, 2, 3, 4]}']
INVALID = [b'{"items": [1,]}', b'{"items": [1 2]}', b'{"a" 1}', b"{1: 2}", b'{"a": 1,}', b'{"a": 1} x',
           b'{"items": [1]', b"{", b"", b'{"items": [\xff]}']


@pytest.mark.parametrize("raw", VALID)
def test_a_bounded_body_reads_as_json_loads_reads_it(raw):
    assert json_body(raw, 100, {"items": 4}) == json.loads(raw)


@pytest.mark.parametrize("raw", INVALID)
def test_bad_json_is_refused_naming_the_body(raw):
    with pytest.raises(InvalidInput) as refused:
        json_body(raw, 100, {"items": 4})
    assert refused.value.field == "body"


def test_a_list_over_its_bound_is_refused_before_its_later_entries_are_read():
    # The fifth entry is not even JSON: reading stops at the bound, before it.
    with pytest.raises(TooLarge) as refused:
        json_body(b'{"items": [1, 2, 3, 4, nonsense', 100, {"items": 4})
    assert refused.value.field == "items"
