"""The one-entry memo of masks derived per layer: a hit only for the same memory viewed the same way and not
written since, so a model that changes its mask (another length, padding, an in-place edit) never gets a stale one."""

import torch

from bet_fairseq.attention.base import SelfAttentionVariant
from bet_fairseq.core.masks import LastMaskMemo

NEG = float("-inf")


def counting_memo():
    calls = []

    def fn(mask, scale):
        calls.append(1)
        return mask.float() * scale

    return LastMaskMemo(fn), calls


def test_hits_for_views_of_the_same_memory_and_misses_otherwise():
    memo, calls = counting_memo()
    buffered = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    first = memo(buffered[:2, :2], 2)
    assert first.tolist() == [[2.0, 0.0], [2.0, 2.0]] and len(calls) == 1
    assert memo(buffered[:2, :2], 2) is first and len(calls) == 1  # a new view object, same memory: a hit
    assert memo(buffered[:2, :2], 3).tolist() == [[3.0, 0.0], [3.0, 3.0]] and len(calls) == 2  # other extras
    assert memo(buffered[1:3, :2], 3).tolist() == [[3.0, 3.0], [3.0, 3.0]] and len(calls) == 3  # other offset
    assert memo(buffered.clone()[1:3, :2], 3).tolist() == [[3.0, 3.0], [3.0, 3.0]] and len(calls) == 4  # other memory
    view = buffered[1:3, :2]
    memo(view, 1)
    buffered[2, 1] = 0.0  # written in place: the version counter moves
    assert memo(view, 1).tolist() == [[1.0, 1.0], [1.0, 0.0]] and len(calls) == 6


def test_inference_tensors_are_never_remembered():
    memo, calls = counting_memo()
    with torch.inference_mode():
        mask = torch.ones(2, 2)
        memo(mask, 1)
        mask[0, 0] = 0.0
        assert memo(mask, 1).tolist() == [[0.0, 1.0], [1.0, 1.0]] and len(calls) == 2


def test_allowed_keys_follows_the_float_mask_it_is_given():
    future = torch.triu(torch.full((4, 4), NEG), 1)
    allowed = SelfAttentionVariant.allowed_keys(3, 3, future[:3, :3], None, "cpu")
    assert allowed.shape == (1, 1, 3, 3) and allowed[0, 0].tolist() == [[True, False, False], [True, True, False],
                                                                       [True, True, True]]
    future[2, 0] = NEG  # an in-place edit of the buffered mask shows in the next call
    assert SelfAttentionVariant.allowed_keys(3, 3, future[:3, :3], None, "cpu")[0, 0, 2].tolist() == [False, True, True]
    padding = torch.tensor([[False, False, True]])
    padded = SelfAttentionVariant.allowed_keys(3, 3, future[:3, :3], padding, "cpu")
    assert padded[0, 0].tolist() == [[True, False, False], [True, True, False], [False, True, False]]
