"""Whole models built from their --arch names: parameter counts, decoder incremental == full."""

import pytest
import torch
from fairseq import options, tasks

import bet_fairseq  # noqa: F401
from bet_fairseq.modules import bird_eye_self_attentions


def write_dict(path, n=50):
    with open(path, "w") as f:
        for i in range(n):
            f.write(f"w{i} {100 - i}\n")


def build(tmp_path, arch, *extra, lm=False):
    if lm:
        write_dict(tmp_path / "dict.txt")
        argv = [str(tmp_path), "--task", "language_modeling", "--arch", arch, *extra]
    else:
        for lang in ("de", "en"):
            write_dict(tmp_path / f"dict.{lang}.txt")
        argv = [str(tmp_path), "--task", "translation", "-s", "de", "-t", "en", "--arch", arch, *extra]
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    task = tasks.setup_task(args)
    return task.build_model(args), task


def n_params(model):
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("base, bet, lm", [
    ("transformer_iwslt_de_en", "bet_sf_iwslt", False),
    ("transformer_wmt_en_de", "bet_sf_wmt_en_de", False),
    ("transformer_lm_wikitext2", "bet_sf_lm", True),
    ("transformer_lm_enwik8", "bet_sf_lm_enwik8", True),
])
def test_bet_adds_exactly_w(tmp_path, base, bet, lm):
    vanilla, _ = build(tmp_path, base, lm=lm)
    model, _ = build(tmp_path, bet, lm=lm)
    layers = model.decoder.layers
    heads, head_dim = layers[0].self_attn.num_heads, layers[0].self_attn.head_dim
    assert n_params(model) - n_params(vanilla) == len(layers) * heads * 2 * head_dim
    shared, _ = build(tmp_path, bet, "--bet-share-w", lm=lm)
    assert n_params(shared) - n_params(vanilla) == len(layers) * 2 * head_dim
    assert [m.mode for m in bird_eye_self_attentions(model)] == ["bet_sf"] * len(layers)


def test_architecture_sizes(tmp_path):
    model, _ = build(tmp_path, "bet_sf_iwslt")
    assert model.decoder.embed_dim == 512 and len(model.decoder.layers) == 6
    assert model.decoder.layers[0].self_attn.num_heads == 4
    assert model.encoder.layers[0].self_attn.__class__.__name__ == "MultiheadAttention"  # encoder untouched
    assert model.decoder.layers[0].encoder_attn.__class__.__name__ == "MultiheadAttention"
    lm, _ = build(tmp_path, "bet_sf_lm", lm=True)
    assert lm.decoder.embed_dim == 300 and lm.decoder.layers[0].self_attn.num_heads == 4
    lm, _ = build(tmp_path, "transformer_lm_enwik8_reduced_diag", lm=True)
    assert lm.decoder.embed_dim == 512 and lm.decoder.layers[0].self_attn.diag_scale == 0.2


SMALL = ("--encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 32 --decoder-embed-dim 32 "
         "--encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 --dropout 0").split()


@pytest.mark.parametrize("arch", ["bet_sf_iwslt", "bet_sf_nodiagmask_iwslt", "transformer_iwslt_de_en_diagfree",
                                  "transformer_iwslt_de_en_reduced_diag", "bet_vanilla_iwslt"])
def test_decoder_incremental_equals_full(tmp_path, arch):
    torch.manual_seed(0)
    model, task = build(tmp_path, arch, *SMALL)
    model.eval()
    bsz, src_len, tgt_len = 3, 6, 7
    src = torch.randint(4, 50, (bsz, src_len))
    src[0, :2] = task.source_dictionary.pad()  # left-padded source, as fairseq batches it
    src_lengths = (src != task.source_dictionary.pad()).sum(1)
    prev = torch.randint(4, 50, (bsz, tgt_len))
    prev[:, 0] = task.target_dictionary.eos()
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=src_lengths)
        full, _ = model.decoder(prev, encoder_out=enc)
        state = {}
        steps = [model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)[0] for t in range(tgt_len)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
