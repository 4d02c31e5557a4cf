"""Table 1 statistics as the paper defines them (docs/analysis.md), on a tiny attention worked by hand.

Defaults (the paper's): CA is the mean of ALL diagonal weights, row 0 included; HA(mean), HA(std) and
Ratio are taken over the entries of the head-averaged matrix (the attention fairseq reports). The old
definitions stay as options: ``ca_rows="skip-first"`` (row 0 left out of CA) and ``ha_over="heads"``
(statistics over every head's own entries)."""

import math

import pytest
import torch

from bet_fairseq.tools.analysis import cli as analyze
from bet_fairseq.tools.analysis.attention_stats import AttentionStatsAccumulator, markdown_report, markdown_table

# One sentence, 2 heads, 3 real positions, then one padding position (its row is NaN: no visible key).
NAN = float("nan")
HEAD0 = [[1.0, 0.0, 0.0, 0.0],
         [0.5, 0.5, 0.0, 0.0],
         [0.2, 0.3, 0.5, 0.0],
         [NAN, NAN, NAN, NAN]]
HEAD1 = [[1.0, 0.0, 0.0, 0.0],
         [0.9, 0.1, 0.0, 0.0],
         [0.6, 0.2, 0.2, 0.0],
         [NAN, NAN, NAN, NAN]]
PROBS = torch.tensor([[HEAD0, HEAD1]], dtype=torch.float64)  # (B=1, H=2, T=4, T=4)
VALID = torch.tensor([[True, True, True, False]])

# By hand.
# CA, all rows: diagonals (1, .5, .5) and (1, .1, .2); the head mean's diagonal (1, .3, .35) gives the same.
CA_ALL = (1 + .5 + .5 + 1 + .1 + .2) / 6  # 0.55
# CA without row 0 (the old default): (.5, .5) and (.1, .2).
CA_SKIP_FIRST = (.5 + .5 + .1 + .2) / 4  # 0.325
# Head-averaged historical entries: A[1,0] = .7, A[2,0] = .4, A[2,1] = .25.
HA_MEAN = (.7 + .4 + .25) / 3  # 0.45 (the same over per-head entries: the mean is linear)
HA_STD_HEAD_MEAN = math.sqrt(((.7 - .45) ** 2 + (.4 - .45) ** 2 + (.25 - .45) ** 2) / 3)  # sqrt(.035)
# Per-head historical entries (the old default): .5, .2, .3 and .9, .6, .2.
HA_STD_HEADS = math.sqrt(sum((x - .45) ** 2 for x in (.5, .2, .3, .9, .6, .2)) / 6)  # 0.25


def stats(**options):
    acc = AttentionStatsAccumulator(1, **options)
    acc.add("final", 0, PROBS, VALID)
    return acc.result()["final"][0]


def test_hand_numbers():
    assert CA_ALL == pytest.approx(0.55) and CA_SKIP_FIRST == pytest.approx(0.325)
    assert HA_STD_HEAD_MEAN == pytest.approx(math.sqrt(0.035)) and HA_STD_HEADS == pytest.approx(0.25)


def test_defaults_are_the_papers():
    got = stats()
    assert got["CA"] == pytest.approx(CA_ALL, abs=1e-12)
    assert got["HA_mean"] == pytest.approx(HA_MEAN, abs=1e-12)
    assert got["HA_std"] == pytest.approx(HA_STD_HEAD_MEAN, abs=1e-12)
    assert got["Ratio"] == pytest.approx(CA_ALL / HA_MEAN, rel=1e-12)
    # Counts are entries of the head-averaged matrix: 3 diagonal, 3 historical.
    assert got["diag_count"] == 3 and got["hist_count"] == 3


@pytest.mark.parametrize("ca_rows, ca", [("all", CA_ALL), ("skip-first", CA_SKIP_FIRST)])
@pytest.mark.parametrize("ha_over, ha_std, heads", [("head-mean", HA_STD_HEAD_MEAN, 1), ("heads", HA_STD_HEADS, 2)])
def test_options_give_each_definition(ca_rows, ca, ha_over, ha_std, heads):
    got = stats(ca_rows=ca_rows, ha_over=ha_over)
    assert got["CA"] == pytest.approx(ca, abs=1e-12)
    assert got["HA_mean"] == pytest.approx(HA_MEAN, abs=1e-12)
    assert got["HA_std"] == pytest.approx(ha_std, abs=1e-12)
    assert got["Ratio"] == pytest.approx(ca / HA_MEAN, rel=1e-12)
    assert got["diag_count"] == heads * (3 if ca_rows == "all" else 2)
    assert got["hist_count"] == heads * 3


def test_old_definitions_still_available():
    """The numbers the analysis gave before the paper's definitions became the default."""
    got = stats(ca_rows="skip-first", ha_over="heads")
    assert (got["CA"], got["HA_std"]) == (pytest.approx(CA_SKIP_FIRST), pytest.approx(HA_STD_HEADS))
    # include_first_row stays a Python alias for ca_rows.
    assert stats(include_first_row=False, ha_over="heads")["CA"] == pytest.approx(CA_SKIP_FIRST)
    assert stats(include_first_row=True)["CA"] == pytest.approx(CA_ALL)


def test_streaming_over_batches_equals_one_batch():
    acc = AttentionStatsAccumulator(1)
    for _ in range(3):
        acc.add("final", 0, PROBS, VALID)
    got = acc.result()["final"][0]
    assert got["CA"] == pytest.approx(CA_ALL) and got["HA_std"] == pytest.approx(HA_STD_HEAD_MEAN)
    assert got["diag_count"] == 9 and got["hist_count"] == 9


def test_bad_option_is_an_error():
    with pytest.raises(ValueError, match="ca_rows"):
        AttentionStatsAccumulator(1, ca_rows="first")
    with pytest.raises(ValueError, match="ha_over"):
        AttentionStatsAccumulator(1, ha_over="mean")


def test_tables_and_json_name_their_definition():
    acc = AttentionStatsAccumulator(1)
    acc.add("final", 0, PROBS, VALID)
    fields = acc.definition()
    assert fields["ca_rows"] == "all" and fields["ha_over"] == "head-mean"
    assert "row 0 included" in fields["definition"] and "head-averaged" in fields["definition"]
    result = dict(split="valid", sentences=1, tokens=3, matrices=acc.result(), **fields)
    md = markdown_report(result, "tiny")
    assert "| CA | 0.5500 |" in md and f"| HA(std) | {HA_STD_HEAD_MEAN:.4f} |" in md
    table_end = md.index("| Ratio |")
    assert fields["definition"] in md[table_end:]  # the line under the table
    assert fields["definition"] in markdown_table(acc.result()["final"], definition=fields["definition"])

    old = AttentionStatsAccumulator(1, ca_rows="skip-first", ha_over="heads")
    old.add("final", 0, PROBS, VALID)
    old_fields = old.definition()
    assert old_fields["ca_rows"] == "skip-first" and old_fields["ha_over"] == "heads"
    assert "row 0 excluded" in old_fields["definition"] and "every head" in old_fields["definition"]
    old_md = markdown_report(dict(matrices=old.result(), **old_fields), "tiny")
    assert "| CA | 0.3250 |" in old_md and "| HA(std) | 0.2500 |" in old_md
    assert old_fields["definition"] in old_md[old_md.index("| Ratio |"):]


def test_cli_defaults_and_options():
    parse = analyze.build_parser().parse_args
    args = parse(["stats", "ckpt.pt", "--data", "bin"])
    assert (args.ca_rows, args.ha_over) == ("all", "head-mean")
    args = parse(["stats", "ckpt.pt", "--data", "bin", "--ca-rows", "skip-first", "--ha-over", "heads"])
    assert (args.ca_rows, args.ha_over) == ("skip-first", "heads")
    assert parse(["stats", "ckpt.pt", "--data", "bin", "--include-first-row"]).ca_rows == "all"
    with pytest.raises(SystemExit):
        parse(["stats", "ckpt.pt", "--data", "bin", "--ca-rows", "first"])
