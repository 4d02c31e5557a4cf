"""BET(SG)'s pointer loss beside fairseq's adaptive softmax: lambda = 0 is fairseq's adaptive_loss exactly,
the pointer term is the hand-looped -log(mean_h A[t, hint_t]) of the captured attention, the logged nll_loss
is the token loss alone, and the command line reaches it (the cutoffs, its options and their defaults)."""

import copy
import math

import pytest
import torch

from cli_utils import build_model, toy_dictionaries

from bet_fairseq import catalog, recipes
from bet_fairseq.criterions.adaptive_loss_with_pointer import AdaptiveLossWithPointer
from bet_fairseq.attention.capture import decoder_self_attentions
from fairseq.criterions.adaptive_loss import AdaptiveLoss


def build(tmp_path, extra=()):
    torch.manual_seed(0)
    model, task, args = build_model([
        toy_dictionaries(tmp_path, 40), "--task", "language_modeling_syntax_hints", "--arch", "bet_sg_lm",
        "--criterion", "adaptive_loss_with_pointer", "--adaptive-softmax-cutoff", "10,20", "--ddp-backend",
        "legacy_ddp", "--decoder-layers", "2", "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "32",
        "--decoder-attention-heads", "2", "--dropout", "0", "--attention-dropout", "0", "--tokens-per-sample", "8",
        "--cpu", *extra])
    return task, model, args


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    task, model, args = build(tmp_path_factory.mktemp("dicts"))
    return task, model, args


def make_sample(task, with_hints=True):
    d = task.target_dictionary
    torch.manual_seed(2)
    tgt = torch.randint(d.nspecial, len(d), (2, 5))
    tgt[1, 4] = d.pad()
    src = torch.cat([torch.full((2, 1), d.eos()), tgt[:, :-1]], 1)
    src[1, 4] = d.pad()
    sample = {"id": torch.tensor([0, 1]), "net_input": {"src_tokens": src, "src_lengths": torch.tensor([5, 4])},
              "target": tgt, "ntokens": int(tgt.ne(d.pad()).sum()), "nsentences": 2}
    if with_hints:
        sample["syntax_hints"] = torch.tensor([[0, 0, 1, 2, 2], [0, 1, 1, 0, -1]])
    return sample


def test_lambda_zero_is_fairseqs_adaptive_loss(built):
    task, model = built[0], copy.deepcopy(built[1])
    model.eval()
    sample = make_sample(task)
    base_loss, base_size, base_log = AdaptiveLoss(task, False)(model, sample)
    loss, size, log = AdaptiveLossWithPointer(task, False, 0.0, "mean")(model, sample)
    assert torch.equal(loss, base_loss) and size == base_size and "pointer_loss" not in log
    assert torch.equal(log["nll_loss"], base_log["loss"])
    # lambda > 0 on a batch without hints: the same
    loss, _, _ = AdaptiveLossWithPointer(task, False, 0.5, "mean")(model, make_sample(task, with_hints=False))
    assert torch.equal(loss, base_loss)


@pytest.mark.parametrize("heads", ["mean", "first"])
def test_pointer_term_matches_a_loop_over_captured_attention(built, heads):
    task, model = built[0], copy.deepcopy(built[1])
    model.eval()
    sample = make_sample(task)
    lam = 0.3
    loss, _, log = AdaptiveLossWithPointer(task, False, lam, heads)(model, sample)
    modules = decoder_self_attentions(model)
    assert all(not m.capture_attention and m.captured_attention is None for m in modules)  # off again
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
                p = float(a[b, 0, t, h]) if heads == "first" else sum(float(a[b, k, t, h]) for k in range(a.size(1))) / a.size(1)
                expected -= math.log(p)
        m.capture_attention = False
        m.captured_attention = None
    base_loss, _, _ = AdaptiveLoss(task, False)(model, sample)
    assert float(log["pointer_loss"]) == pytest.approx(expected, rel=1e-5)
    assert float(loss - base_loss) == pytest.approx(lam * expected, rel=1e-4)
    # the token loss alone (the capturing forward takes the exact attention path: equal up to rounding)
    assert float(log["nll_loss"]) == pytest.approx(float(base_loss), rel=1e-5)
    assert log["pointer_ntokens"] == 9


def test_logged_metrics_are_per_token_in_bits():
    from fairseq.logging import metrics

    logs = [{"loss": torch.tensor(12.0), "nll_loss": torch.tensor(10.0), "pointer_loss": torch.tensor(20.0),
             "pointer_ntokens": 5, "ntokens": 5, "sample_size": 5}]
    with metrics.aggregate() as agg:
        AdaptiveLossWithPointer.reduce_metrics(logs)
        values = agg.get_smoothed_values()
    assert values["loss"] == pytest.approx(12 / 5 / math.log(2), abs=1e-3)
    assert values["nll_loss"] == pytest.approx(10 / 5 / math.log(2), abs=1e-3)
    assert values["pointer_loss"] == pytest.approx(20 / 5 / math.log(2), abs=1e-3)
    assert values["ppl"] == pytest.approx(2 ** values["nll_loss"], rel=1e-2)


def test_cli_options_and_defaults(tmp_path, built):
    task, _, args = built
    crit = task.build_criterion(args)
    assert isinstance(crit, AdaptiveLossWithPointer)
    assert (crit.pointer_lambda, crit.pointer_heads) == tuple(catalog.POINTER_DEFAULT.values())
    task, _, args = build(tmp_path, ["--pointer-lambda", "0.25", "--pointer-heads", "first"])
    crit = task.build_criterion(args)
    assert crit.pointer_lambda == 0.25 and crit.pointer_heads == "first"
    with pytest.raises(ValueError, match="pointer-lambda"):
        AdaptiveLossWithPointer(task, False, -1.0, "mean")


def test_the_criterion_follows_the_output_layer():
    flags = {"--criterion": "label_smoothed_cross_entropy_with_pointer", "--label-smoothing": 0.0,
             "--adaptive-softmax-cutoff": "2000,10000"}
    assert sorted(recipes.to_argv(recipes.for_softmax(flags))) == sorted(
        ["--criterion", "adaptive_loss_with_pointer", "--adaptive-softmax-cutoff", "2000,10000"])
    assert recipes.for_softmax({"--criterion": "cross_entropy", "--adaptive-softmax-cutoff": "5,9"})["--criterion"] \
        == "adaptive_loss"
    plain = {"--criterion": "cross_entropy"}
    assert recipes.for_softmax(plain) == plain
    with pytest.raises(ValueError, match="label smoothing"):
        recipes.for_softmax({**flags, "--label-smoothing": 0.1})
