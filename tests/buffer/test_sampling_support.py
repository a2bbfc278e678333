"""A group's sampling support (per token, how many tokens top-k / top-p kept) is checked where the buffer takes the
group: one count per token, from 0 to the vocabulary size, or the refusal names the field."""

from __future__ import annotations

import numpy as np
import pytest
from buffer_helpers import make_config, make_group

from zerobubble.buffer.validation import check_group
from zerobubble.common.codec import encode_array
from zerobubble.common.errors import InvalidInput
from zerobubble.v1 import common_pb2


def with_support(counts: np.ndarray) -> common_pb2.ExperienceGroup:
    group = make_group(common_pb2.Prompt(prompt_id="p", epoch=0), tokens=8)
    group.trajectories[2].sampling_support.CopyFrom(encode_array(counts.astype(np.int32)))
    return group


def test_a_count_per_token_is_taken(tmp_path):
    config = make_config(tmp_path, run_spec__model__vocab_size=300)
    group = with_support(np.array([20, 3, 1, 0, 7, 300, 2, 5]))
    check_group(group, group.ByteSize(), config, policy_version=0)


@pytest.mark.parametrize("counts", [np.array([3] * 7), np.array([3] * 7 + [-1]), np.array([3] * 7 + [301])],
                         ids=["short", "negative", "past_the_vocabulary"])
def test_a_support_that_does_not_fit_is_refused_naming_it(tmp_path, counts):
    config = make_config(tmp_path, run_spec__model__vocab_size=300)
    group = with_support(counts)
    with pytest.raises(InvalidInput) as refused:
        check_group(group, group.ByteSize(), config, policy_version=0)
    assert refused.value.field == "trajectories[2].sampling_support"
