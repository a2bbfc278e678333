"""Prompt leases: expiry, completion, epochs, end of data."""

from __future__ import annotations

import pytest
from buffer_helpers import write_prompts

from zerobubble.buffer.leases import PromptLeases
from zerobubble.buffer.prompts import PromptSource
from zerobubble.common.errors import InvalidInput


@pytest.fixture
def leases(tmp_path, clock):
    source = PromptSource.load(write_prompts(tmp_path / "p.jsonl", 6), seed=1)
    return PromptLeases(source, epochs=2, timeout_seconds=10, clock=clock)


def test_hands_out_the_epoch_in_its_seeded_order(leases):
    lease = leases.lease("w", 4)
    assert [index for _, index in lease.prompts] == list(leases.source.order(0)[:4])
    assert {epoch for epoch, _ in lease.prompts} == {0}


def test_expired_lease_comes_back_first(leases, clock):
    first = set(leases.lease("w1", 2).prompts)
    leases.lease("w2", 2)
    clock.advance(9.9)
    assert leases.expire() == 0
    clock.advance(0.2)
    assert leases.expire() == 2 and leases.expirations == 2
    again = leases.lease("w3", 2)
    assert set(again.prompts) == first


def test_complete_returns_only_unfinished_prompts(leases):
    lease = leases.lease("w", 3)
    finished, *others = list(lease.prompts)
    leases.mark_done(finished)
    leases.complete(lease.lease_id)
    assert lease.lease_id not in leases.leases
    again = list(leases.lease("w", 6).prompts)
    assert again[:2] == others and finished not in again


def test_complete_named_prompts_keeps_the_rest_leased(leases):
    lease = leases.lease("w", 3)
    released, *kept = list(lease.prompts)
    leases.complete(lease.lease_id, [released[1]])
    assert list(lease.prompts) == kept
    assert released in leases.lease("w", 1).prompts


def test_unknown_lease_ids_are_refused_but_stale_ones_are_fine(leases):
    lease = leases.lease("w", 1)
    for bad in ["nonsense", "0.5", "7.0"]:
        with pytest.raises(InvalidInput, match="lease_id"):
            leases.complete(bad)
    leases.complete(lease.lease_id)
    leases.complete(lease.lease_id)
    leases.incarnation = 1
    leases.complete(lease.lease_id)


def test_epochs_advance_and_data_ends(leases):
    first = leases.lease("w", 6)
    second = leases.lease("w", 6)
    assert {e for e, _ in first.prompts} == {0} and {e for e, _ in second.prompts} == {1}
    first, second = set(first.prompts), set(second.prompts)
    assert leases.lease("w", 1) is None and not leases.end_of_data
    for key in sorted(first | second):
        assert not leases.is_done(key)
        leases.mark_done(key)
        assert leases.is_done(key)
    assert leases.end_of_data and leases.epoch == 2


def test_next_epoch_opens_before_the_previous_one_finishes_but_its_returns_come_first(leases, clock):
    old = set(leases.lease("w", 6).prompts)
    leases.lease("w", 2)
    clock.advance(11)
    leases.expire()
    assert set(leases.lease("w", 6).prompts) == old


def test_key_of_names_the_bad_field(leases):
    with pytest.raises(InvalidInput, match="prompt.prompt_id"):
        leases.key_of("nope", 0)
    with pytest.raises(InvalidInput, match="prompt.epoch"):
        leases.key_of("0", 2)
