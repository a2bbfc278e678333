"""Hypothesis strategies for any protobuf message, built from its descriptor so a field added to a contract is
fuzzed without a change here.

Every field may be left unset or drawn from its type's extremes (2^31-1, -1, NaN, inf, empty and huge strings
up to the message limit, random bytes, out-of-range enum values). `Array` messages are also drawn consistent
(random dtype and shape with exactly the bytes they need), so that random token ids and log-probs get past the
codec check and reach the code behind it. Valid seed messages mutated in a few fields reach deeper still.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st

from zerobubble.common.codec import varint
from zerobubble.v1 import common_pb2

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
UINT32 = (0, 2**32 - 1)
UINT64 = (0, 2**64 - 1)
INT_EXTREMES = (0, 1, -1, 2, 7, 64, 1024, 2**16, 2**31 - 1, -(2**31), 2**32 - 1, 2**53, 2**63 - 1, -(2**63))
FLOAT_EXTREMES = (0.0, -0.0, 1.0, -1.0, 0.5, math.nan, -math.nan, math.inf, -math.inf, 1e-45, 3.4e38, -3.4e38,
                  1e308, 2.0**31)
ITEM_BYTES = {
    common_pb2.DTYPE_BOOL: 1, common_pb2.DTYPE_UINT8: 1, common_pb2.DTYPE_INT8: 1, common_pb2.DTYPE_INT16: 2,
    common_pb2.DTYPE_INT32: 4, common_pb2.DTYPE_INT64: 8, common_pb2.DTYPE_FLOAT16: 2,
    common_pb2.DTYPE_BFLOAT16: 2, common_pb2.DTYPE_FLOAT32: 4, common_pb2.DTYPE_FLOAT64: 8,
}
# Deeper than any contract nests; past it a message field is left empty.
MAX_DEPTH = 6

_T = FieldDescriptor
_INTEGER_RANGES = {
    _T.TYPE_INT32: INT32, _T.TYPE_SINT32: INT32, _T.TYPE_SFIXED32: INT32,
    _T.TYPE_INT64: INT64, _T.TYPE_SINT64: INT64, _T.TYPE_SFIXED64: INT64,
    _T.TYPE_UINT32: UINT32, _T.TYPE_FIXED32: UINT32, _T.TYPE_UINT64: UINT64, _T.TYPE_FIXED64: UINT64,
}


def _is_repeated(field: FieldDescriptor) -> bool:
    return field.is_repeated


def _is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _json_text() -> st.SearchStrategy[str]:
    """JSON documents, for the string fields that carry JSON (chat messages): any shape, rarely the right one."""
    leaves = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
    values = st.recursive(leaves, lambda inner: st.lists(inner, max_size=4)
                          | st.dictionaries(st.sampled_from(["role", "content", "name", ""]) | st.text(max_size=8),
                                            inner, max_size=4), max_leaves=12)
    return values.map(lambda value: json.dumps(value, allow_nan=True))


class MessageStrategies:
    """Strategies for the messages of one service, whose server takes messages up to `max_message_bytes`.

    Huge strings and byte fields stay below a quarter of the limit each, so that most messages holding one
    still fit and reach the service instead of being refused by the transport.
    """

    def __init__(self, max_message_bytes: int, *, long_lists: bool = True):
        self.huge = max(1, max_message_bytes // 4)
        self._messages: dict[tuple[str, int], st.SearchStrategy] = {}
        # The elements repeated into long lists are small, without long lists of their own, so that a list
        # stays within a few megabytes.
        self._elements = MessageStrategies(1024, long_lists=False) if long_lists else None

    # -- scalars -----------------------------------------------------------------------------------------
    def _integers(self, low: int, high: int) -> st.SearchStrategy[int]:
        return st.sampled_from([v for v in INT_EXTREMES if low <= v <= high]) | st.integers(low, high)

    def _floats(self, width: int) -> st.SearchStrategy[float]:
        return st.sampled_from(FLOAT_EXTREMES) | st.floats(width=width)

    def _sometimes_huge(self, usual: st.SearchStrategy, huge: st.SearchStrategy) -> st.SearchStrategy:
        # One value in sixteen is huge: often enough to hit every size check, rarely enough to stay fast.
        return st.integers(0, 15).flatmap(lambda pick: huge if pick == 0 else usual)

    def _sizes(self) -> st.SearchStrategy[int]:
        return st.sampled_from([self.huge // 64, self.huge // 2, self.huge])

    def _strings(self) -> st.SearchStrategy[str]:
        characters = st.characters(exclude_categories=("Cs",))
        usual = st.one_of(
            st.just(""),
            st.text(characters),
            st.sampled_from(["0", "-1", "nan", "\x00", "\\boxed{1}", "```python\nprint(1)\n```", "cpu", "cuda:0"]),
            _json_text(),
        )
        return self._sometimes_huge(usual, st.builds(lambda char, size: char * size, characters, self._sizes()))

    def _bytes(self) -> st.SearchStrategy[bytes]:
        huge = st.builds(_random_bytes, st.integers(0, 2**32), self._sizes())
        return self._sometimes_huge(st.just(b"") | st.binary(), huge)

    def _enum(self, field: FieldDescriptor) -> st.SearchStrategy[int]:
        known = [value.number for value in field.enum_type.values]
        return st.sampled_from(known) | st.sampled_from([-1, max(known) + 1, INT32[1], INT32[0]])

    def value(self, field: FieldDescriptor, depth: int = 0) -> st.SearchStrategy:
        """One value of `field` (an element, for a repeated field)."""
        kind = field.type
        if kind in _INTEGER_RANGES:
            return self._integers(*_INTEGER_RANGES[kind])
        if kind == _T.TYPE_FLOAT:
            return self._floats(32)
        if kind == _T.TYPE_DOUBLE:
            return self._floats(64)
        if kind == _T.TYPE_BOOL:
            return st.booleans()
        if kind == _T.TYPE_STRING:
            return self._strings()
        if kind == _T.TYPE_BYTES:
            return self._bytes()
        if kind == _T.TYPE_ENUM:
            return self._enum(field)
        return self.message(field.message_type, depth + 1)

    def field(self, field: FieldDescriptor, depth: int = 0) -> st.SearchStrategy:
        """What `field` is set to: a value, a list of them, or a dict for a map."""
        if _is_map(field):
            entry = field.message_type
            key, value = entry.fields_by_name["key"], entry.fields_by_name["value"]
            return st.dictionaries(self.value(key, depth), self.value(value, depth), max_size=4)
        if not _is_repeated(field):
            return self.value(field, depth)
        lists = st.lists(self.value(field, depth), max_size=4)
        if self._elements is None:
            return lists
        # Many copies of one element: counts far past what a caller should send, cheap to draw.
        counts = st.sampled_from([100, 1000, 10_000])
        return lists | st.builds(self._copies, self._elements.value(field, depth), counts)

    def _copies(self, item, count: int) -> list:
        # At most `huge` bytes of copies: an element can be a tree of nested lists, and ten thousand copies of
        # one, built before the size filter sees them, took the fuzzing process to tens of gigabytes.
        return [item] * min(count, max(1, self.huge // _size(item)))

    # -- messages ------------------------------------------------------------------------------------------
    def message(self, descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
        """Any message of this type, each field unset or drawn."""
        key = (descriptor.full_name, depth)
        if key not in self._messages:
            cls = GetMessageClass(descriptor)
            if depth > MAX_DEPTH:
                strategy = st.builds(cls)
            else:
                optional = {f.name: st.deferred(lambda f=f: self.field(f, depth)) for f in descriptor.fields}
                strategy = st.fixed_dictionaries({}, optional=optional).map(lambda values: build(cls, values))
                if descriptor.full_name == common_pb2.Array.DESCRIPTOR.full_name:
                    strategy = strategy | consistent_arrays()
            self._messages[key] = strategy
        return self._messages[key]

    def mutants(self, seeds: Sequence[Message]) -> st.SearchStrategy[Message]:
        """A valid seed with one to three fields, at any depth, replaced by a drawn value or cleared."""

        @st.composite
        def mutant(draw) -> Message:
            message = draw(st.sampled_from(seeds))
            copy = type(message)()
            copy.CopyFrom(message)
            for _ in range(draw(st.integers(1, 3))):
                self._mutate(draw, copy, 0)
            return copy

        return mutant()

    def _mutate(self, draw, message: Message, depth: int) -> None:
        fields = message.DESCRIPTOR.fields
        if not fields:
            return
        field = draw(st.sampled_from(list(fields)))
        inside = field.message_type is not None and not _is_map(field) and depth < MAX_DEPTH
        if inside and _is_repeated(field) and len(getattr(message, field.name)) and draw(st.booleans()):
            items = getattr(message, field.name)
            self._mutate(draw, items[draw(st.integers(0, len(items) - 1))], depth + 1)
        elif inside and not _is_repeated(field) and message.HasField(field.name) and draw(st.booleans()):
            self._mutate(draw, getattr(message, field.name), depth + 1)
        elif draw(st.integers(0, 5)) == 0:
            message.ClearField(field.name)
        else:
            message.ClearField(field.name)
            assign(message, field, draw(self.field(field, depth)))

    def requests(self, descriptor: Descriptor, seeds: Sequence[Message] = ()) -> st.SearchStrategy[Message]:
        """What the fuzz sends: messages drawn from scratch, and as often mutated seeds where there are any, with
        fields unknown to the contract (as a newer client sends them) added to some, and none much larger than
        the message limit (a larger one only measures the transport's refusal)."""
        drawn = self.message(descriptor)
        known = drawn | self.mutants(seeds) if seeds else drawn
        extended = st.builds(_with_unknown_fields, known, unknown_fields(descriptor))
        return (known | extended).filter(lambda message: message.ByteSize() <= 8 * self.huge)


def assign(message: Message, field: FieldDescriptor, value) -> None:
    """Set `field` of `message` to a value drawn for it by MessageStrategies.field."""
    target = getattr(message, field.name)
    if _is_map(field):
        composite = field.message_type.fields_by_name["value"].message_type is not None
        for key, item in value.items():
            if composite:
                target[key].CopyFrom(item)
            else:
                target[key] = item
    elif _is_repeated(field):
        target.extend(value)
    elif field.message_type is not None:
        target.CopyFrom(value)
    else:
        setattr(message, field.name, value)


def build(cls: type[Message], values: dict) -> Message:
    message = cls()
    for name, value in values.items():
        assign(message, cls.DESCRIPTOR.fields_by_name[name], value)
    return message


def _size(value) -> int:
    """About how many bytes `value` (a drawn field value) takes on the wire."""
    if isinstance(value, Message):
        return max(1, value.ByteSize())
    if isinstance(value, str | bytes):
        return max(1, len(value))
    return 8


def _random_bytes(seed: int, size: int) -> bytes:
    # Drawn from a seed: Hypothesis's own Random would record every byte as a choice, far too slow for megabytes.
    return random.Random(seed).randbytes(size)


def unknown_fields(descriptor: Descriptor) -> st.SearchStrategy[bytes]:
    """Well-formed wire fields with numbers the message does not declare, of every wire type."""
    known = {field.number for field in descriptor.fields}
    numbers = (st.integers(1, 32) | st.integers(20_000, 2**29 - 1)).filter(lambda number: number not in known)
    payloads = st.one_of(
        st.integers(0, 2**64 - 1).map(lambda v: (0, varint(v))),
        st.binary(min_size=8, max_size=8).map(lambda b: (1, b)),
        st.binary(max_size=64).map(lambda b: (2, varint(len(b)) + b)),
        st.binary(min_size=4, max_size=4).map(lambda b: (5, b)),
    )

    def encode(fields: list[tuple[int, tuple[int, bytes]]]) -> bytes:
        return b"".join(varint(number << 3 | wire) + payload for number, (wire, payload) in fields)

    return st.lists(st.tuples(numbers, payloads), min_size=1, max_size=4).map(encode)


def _with_unknown_fields(message: Message, fields: bytes) -> Message:
    message.MergeFromString(fields)
    return message


@st.composite
def consistent_arrays(draw) -> common_pb2.Array:
    """An Array whose bytes match its dtype and shape: random values of a random dtype, any rank."""
    dtype = draw(st.sampled_from(sorted(ITEM_BYTES)))
    shape = draw(st.lists(st.integers(0, 64), max_size=3))
    data = _random_bytes(draw(st.integers(0, 2**32)), math.prod(shape) * ITEM_BYTES[dtype])
    return common_pb2.Array(dtype=dtype, shape=shape, data=data)
