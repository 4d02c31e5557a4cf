"""The BET(SG) pointer loss: hand-computed values, the lambda = 0 identity, its gradient, its errors."""

import copy
import math

import pytest
import torch

from cli_utils import build_model, toy_dictionaries

from bet_fairseq.criterions.label_smoothed_cross_entropy_with_pointer import (
    LabelSmoothedCrossEntropyWithPointerCriterion,
    pointer_loss,
)
from bet_fairseq.attention.capture import decoder_self_attentions
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

# Two layers, batch 1, two heads, three positions (causal rows). Hints: [0, 0, 1]; last row padded in
# the second example below.
LAYER1 = torch.tensor([[[[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]],
                        [[1.0, 0.0, 0.0], [0.25, 0.75, 0.0], [0.1, 0.1, 0.8]]]])
LAYER2 = torch.tensor([[[[1.0, 0.0, 0.0], [0.9, 0.1, 0.0], [0.4, 0.4, 0.2]],
                        [[1.0, 0.0, 0.0], [0.3, 0.7, 0.0], [0.6, 0.2, 0.2]]]])
HINTS = torch.tensor([[0, 0, 1]])


def test_hand_computed_mean_first_all():
    # mean over heads, layer 1: rows [1], [0.375 at 0], [0.2 at 1]; layer 2: [1], [0.6 at 0], [0.3 at 1]
    mean = -(math.log(1) + math.log(0.375) + math.log(0.2)) - (math.log(1) + math.log(0.6) + math.log(0.3))
    first = -(math.log(0.5) + math.log(0.3)) - (math.log(0.9) + math.log(0.4))
    every = (-(math.log(0.5) + math.log(0.3)) - (math.log(0.25) + math.log(0.1))) / 2 \
        + (-(math.log(0.9) + math.log(0.4)) - (math.log(0.3) + math.log(0.2))) / 2
    layers = [LAYER1.log(), LAYER2.log()]  # pointer_loss takes log-probabilities
    assert pointer_loss(layers, HINTS, "mean").item() == pytest.approx(mean, rel=1e-6)
    assert pointer_loss(layers, HINTS, "first").item() == pytest.approx(first, rel=1e-6)
    assert pointer_loss(layers, HINTS, "all").item() == pytest.approx(every, rel=1e-6)
    # a padded position (-1) adds nothing
    padded = torch.tensor([[0, 0, -1]])
    assert pointer_loss(layers, padded, "mean").item() == pytest.approx(
        -math.log(0.375) - math.log(0.6), rel=1e-6)
    with pytest.raises(ValueError, match="do not match"):
        pointer_loss(layers, torch.tensor([[0, 0]]), "mean")


# ---------------------------------------------------------------------------------------------
def build(tmp_path, arch="bet_sg_iwslt", extra=()):
    torch.manual_seed(0)
    model, task, args = build_model([
        toy_dictionaries(tmp_path, 20), "--task", "translation_syntax_hints", "-s", "de", "-t", "en", "--arch", arch,
        "--criterion", "label_smoothed_cross_entropy_with_pointer", "--label-smoothing", "0.1",
        "--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
        "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2", "--dropout", "0", "--attention-dropout", "0", "--cpu", *extra,
    ])
    return task, model, args


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(task, model) of a tiny bet_sg_iwslt, built once; tests take a copy of the model."""
    task, model, _ = build(tmp_path_factory.mktemp("dicts"))
    return task, model


def make_sample(task, with_hints=True):
    d = task.tgt_dict
    torch.manual_seed(1)
    tgt = torch.randint(d.nspecial, len(d), (2, 5))
    tgt[:, -1] = d.eos()
    tgt[1, 3] = d.eos()
    tgt[1, 4] = d.pad()  # second sentence: 3 tokens + eos
    prev = torch.full_like(tgt, d.pad())
    prev[:, 0] = d.eos()
    prev[0, 1:] = tgt[0, :-1]
    prev[1, 1:4] = tgt[1, :3]
    sample = {
        "id": torch.tensor([0, 1]),
        "net_input": {"src_tokens": torch.randint(d.nspecial, len(d), (2, 4)), "src_lengths": torch.tensor([4, 4]),
                      "prev_output_tokens": prev},
        "target": tgt, "ntokens": int(tgt.ne(d.pad()).sum()), "nsentences": 2,
    }
    if with_hints:
        sample["syntax_hints"] = torch.tensor([[0, 0, 1, 1, 3], [0, 1, 1, 2, -1]])
    return sample


def test_lambda_zero_is_exactly_the_base_criterion(built):
    task, model = built[0], copy.deepcopy(built[1])
    model.eval()
    sample = make_sample(task)
    base = LabelSmoothedCrossEntropyCriterion(task, False, 0.1)
    zero = LabelSmoothedCrossEntropyWithPointerCriterion(task, False, 0.1, pointer_lambda=0.0)
    l0, s0, log0 = base(model, sample)
    l1, s1, log1 = zero(model, sample)
    assert torch.equal(l0, l1) and s0 == s1 and "pointer_loss" not in log1
    # lambda > 0 but a batch without hints (inference-style data): also the base loss
    some = LabelSmoothedCrossEntropyWithPointerCriterion(task, False, 0.1, pointer_lambda=0.5)
    l2, _, log2 = some(model, make_sample(task, with_hints=False))
    assert torch.equal(l0, l2) and "pointer_loss" not in log2


def test_pointer_term_matches_a_loop_over_captured_attention(built):
    task, model = built[0], copy.deepcopy(built[1])
    model.eval()
    sample = make_sample(task)
    lam = 0.3
    crit = LabelSmoothedCrossEntropyWithPointerCriterion(task, False, 0.1, pointer_lambda=lam, pointer_heads="mean")
    base = LabelSmoothedCrossEntropyCriterion(task, False, 0.1)
    loss, _, log = crit(model, sample)
    modules = decoder_self_attentions(model)
    assert len(modules) == 2
    assert all(not m.capture_attention and m.captured_attention is None for m in modules)  # off again

    # independent: capture by hand, sum -log(mean_h A[b, h, t, hint]) in plain Python loops
    for m in modules:
        m.capture_attention = True
    with torch.no_grad():
        model(**sample["net_input"])
    expected = 0.0
    for m in modules:
        a = m.captured_attention
        for b in range(2):
            for t in range(5):
                h = int(sample["syntax_hints"][b, t])
                if h < 0:
                    continue
                assert float(a[b, :, t, t + 1:].abs().sum()) == 0  # causal: nothing right of t
                expected -= math.log(sum(float(a[b, k, t, h]) for k in range(a.size(1))) / a.size(1))
        m.capture_attention = False
        m.captured_attention = None
    base_loss, _, _ = base(model, sample)
    assert float(log["pointer_loss"]) == pytest.approx(expected, rel=1e-5)
    assert float(loss - base_loss) == pytest.approx(lam * expected, rel=1e-4)
    assert log["pointer_ntokens"] == 9


def test_one_sgd_step_raises_attention_at_the_hints(built):
    task, model = built[0], copy.deepcopy(built[1])
    model.train()
    sample = make_sample(task)
    hints = sample["syntax_hints"]
    modules = decoder_self_attentions(model)

    def attention_at_hints():
        for m in modules:
            m.capture_attention = True
        with torch.no_grad():
            model(**sample["net_input"])
        values = []
        for m in modules:
            a = m.captured_attention.mean(dim=1)
            for b in range(2):
                for t in range(5):
                    if hints[b, t] >= 0 and t > 0:  # row 0 is always 1
                        values.append(float(a[b, t, hints[b, t]]))
            m.capture_attention = False
        return sum(values) / len(values)

    before = attention_at_hints()
    crit = LabelSmoothedCrossEntropyWithPointerCriterion(task, False, 0.0, pointer_lambda=1.0, pointer_heads="mean")
    loss, _, _ = crit(model, sample)
    model.zero_grad()
    loss.backward()
    q_grad = modules[0].q_proj.weight.grad
    assert q_grad is not None and q_grad.abs().sum() > 0  # the loss reaches the attention logits
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= 0.5 * p.grad
    after = attention_at_hints()
    assert after > before + 1e-3, (before, after)


def test_pointer_loss_decreases_and_is_logged(built):
    """A few Adam steps on one batch: the logged pointer_loss goes down (reduce_metrics path)."""
    from fairseq.logging import metrics

    task, model = built[0], copy.deepcopy(built[1])
    model.train()
    sample = make_sample(task)
    crit = LabelSmoothedCrossEntropyWithPointerCriterion(task, False, 0.1, pointer_lambda=1.0)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    values, raw = [], []
    for _ in range(8):
        loss, sample_size, log = crit(model, sample)
        opt.zero_grad()
        (loss / sample_size).backward()
        opt.step()
        with metrics.aggregate() as agg:
            crit.reduce_metrics([log])
        values.append(agg.get_smoothed_values()["pointer_loss"])
        raw.append(float(log["pointer_loss"]))
    assert values[-1] < 0.8 * values[0], values
    # logged per hinted target position (9 here), in bits, like fairseq's loss
    assert values == [pytest.approx(r / 9 / math.log(2), abs=1e-3) for r in raw]


def test_errors(tmp_path):
    task, model, _ = build(tmp_path, "bet_sf_iwslt")
    crit = LabelSmoothedCrossEntropyWithPointerCriterion(task, False, 0.1, pointer_lambda=0.1)
    with pytest.raises(ValueError, match="masks the diagonal"):
        crit(model, make_sample(task))
    task, model, _ = build(tmp_path, "transformer_iwslt_de_en")
    with pytest.raises(ValueError, match="bet_sg_iwslt"):
        crit(model, make_sample(task))
    with pytest.raises(ValueError, match="pointer-lambda"):
        LabelSmoothedCrossEntropyWithPointerCriterion(task, False, 0.1, pointer_lambda=-1.0)
    with pytest.raises(ValueError, match="pointer-heads"):
        LabelSmoothedCrossEntropyWithPointerCriterion(task, False, 0.1, pointer_heads="last")


def test_cli_options_reach_the_criterion(tmp_path):
    task, model, args = build(tmp_path, extra=["--pointer-lambda", "0.25", "--pointer-heads", "all"])
    crit = task.build_criterion(args)
    assert isinstance(crit, LabelSmoothedCrossEntropyWithPointerCriterion)
    assert crit.pointer_lambda == 0.25 and crit.pointer_heads == "all"
    assert all(m.variant_name == "vanilla" for m in decoder_self_attentions(model))


def test_an_underflowing_hinted_probability_keeps_its_true_loss_and_a_gradient(built):
    """Sharpen the attention until the hinted keys' probabilities underflow float32 (exp(-x) for x far
    beyond 87): the loss must be the true -log of the head mean (from the log-space attention, itself
    held to a float64 reference in tests/attention/test_every_variant.py), not a clamp near 87 with no
    gradient, which is what probability space gives."""
    task, model = built[0], copy.deepcopy(built[1])
    model.eval()
    sample = make_sample(task)
    modules = decoder_self_attentions(model)
    with torch.no_grad():
        for m in modules:  # huge logits: every row peaks on one key, the others get exp(-hundreds)
            m.q_proj.weight.mul_(400.0)
            m.k_proj.weight.mul_(400.0)
    crit = LabelSmoothedCrossEntropyWithPointerCriterion(task, False, 0.0, pointer_lambda=1.0, pointer_heads="mean")
    _, _, log = crit(model, sample)

    expected, underflowed, worst = 0.0, 0, 0.0
    for m in modules:
        m.capture_attention = True
    with torch.no_grad():
        model(**sample["net_input"])
    for m in modules:
        probs = m.captured_attention
        log_p = m.captured_log_attention.double()
        hints = sample["syntax_hints"]
        for b in range(hints.size(0)):
            for t in range(hints.size(1)):
                h = int(hints[b, t])
                if h < 0:
                    continue
                per_head = log_p[b, :, t, h]
                nll = -float(torch.logsumexp(per_head, 0) - math.log(per_head.numel()))
                expected += nll
                worst = max(worst, nll)
                underflowed += int(float(probs[b, :, t, h].float().mean()) == 0.0)
        m.capture_attention = False
        m.captured_attention = m.captured_log_attention = None
    assert underflowed > 0 and worst > 200  # the case this test is about does occur
    assert float(log["pointer_loss"]) == pytest.approx(expected, rel=1e-4)

    model.train()
    model.zero_grad()
    loss, _, _ = LabelSmoothedCrossEntropyWithPointerCriterion(task, False, 0.0, pointer_lambda=1.0,
                                                              pointer_heads="mean")(model, sample)
    loss.backward()
    grad = modules[0].q_proj.weight.grad
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0
