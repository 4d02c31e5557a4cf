"""fairseq's own distributed training (torchrun, gloo, --cpu) with BET architectures.

Two processes on one machine train for a few updates. Run as a script, this file is the per-rank
launcher: it runs ``fairseq_cli.train.cli_main`` unchanged and records, per rank, the sample ids
of every batch it trained on, every checkpoint file it wrote, and its parameters before the first
and after the last update. The test then checks what only working data parallelism gives: the
ranks trained on DISJOINT batches (so the data was sharded) and still hold IDENTICAL parameters
that moved away from the initial ones (so gradients were all-reduced), and only rank 0 wrote
checkpoints. (Two unsynchronised processes with one seed would also end identical, but only by
training on the same batches; a replica that skipped synchronisation would differ.)
"""

import glob
import os
import socket
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, also under torchrun
from cli_utils import (  # noqa: E402
    BIN, COMMON_TRAIN, ROOT, TINY_LM, TINY_TRANSLATION, USER_DIR, binarise_multi30k, binarise_wikitext2, session_corpus,
)

LAUNCHER = os.path.abspath(__file__)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_train(data, arch, save_dir, record_dir, extra, nproc=2):
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", BET_TEST_RECORD_DIR=str(record_dir))
    cmd = [
        os.path.join(BIN, "torchrun"), "--nproc_per_node", str(nproc), "--nnodes", "1",
        "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
        LAUNCHER, str(data), "--user-dir", USER_DIR, "--arch", arch, *COMMON_TRAIN,
        "--max-update", "3", "--save-dir", str(save_dir), "--distributed-backend", "gloo", *extra,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, f"torchrun failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-6000:]
    return proc


def check_replicas(save_dir, record_dir, output):
    records = {}
    for rank in (0, 1):
        path = os.path.join(record_dir, f"rank{rank}.pt")
        assert os.path.exists(path), f"rank {rank} recorded nothing: did it run?\n{output[-3000:]}"
        records[rank] = torch.load(path, weights_only=False)
    r0, r1 = records[0], records[1]
    for rank, rec in records.items():
        assert rec["dist_rank"] == rank and rec["world_size"] == 2, (rank, rec["dist_rank"], rec["world_size"])
        assert rec["trainer_world_size"] == 2 and rec["trainer_rank"] == rank
        assert rec["num_updates"] == 3
        assert rec["ids"], f"rank {rank} trained on no real batch"
    # data parallelism: each rank saw its own shard of the batches ...
    assert not set(r0["ids"]) & set(r1["ids"]), "both ranks trained on the same sentences"
    # ... and yet both replicas hold the same parameters, which training changed.
    assert r0["final"].keys() == r1["final"].keys()
    for name in r0["final"]:
        assert torch.equal(r0["final"][name], r1["final"][name]), f"replicas differ in {name}"
    assert torch.equal(r0["initial"]["decoder.embed_tokens.weight"], r1["initial"]["decoder.embed_tokens.weight"])
    bet_w = [n for n in r0["final"] if n.endswith("self_attn.bet_w")]
    assert bet_w, "no BET(SF) parameter in the model"
    for name in bet_w + ["decoder.embed_tokens.weight"]:
        assert not torch.equal(r0["initial"][name], r0["final"][name]), f"{name} did not train"
    # exactly one checkpoint writer, and its checkpoint holds the replicas' parameters
    assert r1["written"] == [], f"rank 1 wrote checkpoints: {r1['written']}"
    assert r0["written"], "rank 0 wrote no checkpoint"
    assert not glob.glob(os.path.join(save_dir, "*.tmp"))
    last = torch.load(os.path.join(save_dir, "checkpoint_last.pt"), weights_only=False)
    for name, value in last["model"].items():
        assert torch.equal(value, r0["final"][name]), f"checkpoint_last.pt differs from the replicas in {name}"
    assert "Saved checkpoint" in output


def test_translation_bet_sf_two_processes(tmp_path_factory, tmp_path):
    data = session_corpus(tmp_path_factory, binarise_multi30k, n_test=37)
    proc = torchrun_train(
        data, "bet_sf_iwslt", tmp_path / "ckpt", tmp_path / "rec",
        [*TINY_TRANSLATION, "--max-tokens", "400", "--criterion", "label_smoothed_cross_entropy",
         "--label-smoothing", "0.1"],
    )
    check_replicas(tmp_path / "ckpt", tmp_path / "rec", proc.stdout + proc.stderr)


def test_language_model_bet_sf_two_processes(tmp_path_factory, tmp_path):
    data = session_corpus(tmp_path_factory, binarise_wikitext2)
    proc = torchrun_train(
        data, "bet_sf_lm", tmp_path / "ckpt", tmp_path / "rec",
        [*TINY_LM, "--task", "language_modeling", "--tokens-per-sample", "32", "--max-tokens", "256"],
    )
    check_replicas(tmp_path / "ckpt", tmp_path / "rec", proc.stdout + proc.stderr)


def test_torchrun_environment_is_authoritative(monkeypatch):
    """The config fix on its own: world size and rank come from torchrun, without any GPU."""
    from fairseq.dataclass.configs import DistributedTrainingConfig
    from fairseq.distributed import utils as dist_utils  # (patched by bet_fairseq.register(), in conftest)

    for name, value in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT="29555", WORLD_SIZE="4", RANK="3",
                            LOCAL_RANK="1").items():
        monkeypatch.setenv(name, value)
    cfg = DistributedTrainingConfig()
    dist_utils.infer_init_method(cfg)
    assert (cfg.distributed_world_size, cfg.distributed_rank, cfg.device_id) == (4, 3, 1)
    assert cfg.distributed_init_method == "env://" and cfg.distributed_no_spawn
    assert not dist_utils.is_master(cfg)

    monkeypatch.setenv("RANK", "4")
    with pytest.raises(ValueError, match="RANK=4"):
        dist_utils.infer_init_method(DistributedTrainingConfig())


# ---------------------------------------------------------------------------------------------
def _launch():
    """Per-rank launcher: fairseq-train plus records for the test (see the module docstring)."""
    from fairseq import checkpoint_utils
    from fairseq.trainer import Trainer
    from fairseq_cli import train

    record_dir = os.environ["BET_TEST_RECORD_DIR"]
    os.makedirs(record_dir, exist_ok=True)
    state = dict(ids=[], written=[], initial=None)

    def clone(model):
        return {k: v.detach().clone() for k, v in model.state_dict().items()}

    original_step = Trainer.train_step

    def train_step(self, samples, raise_oom=False):
        if state["initial"] is None:
            state["initial"] = clone(self.get_model())
        for sample in samples:
            if sample and "id" in sample:
                state["ids"].extend(int(i) for i in sample["id"].tolist())
        return original_step(self, samples, raise_oom)

    original_write = checkpoint_utils.torch_persistent_save

    def torch_persistent_save(obj, filename, *args, **kwargs):
        state["written"].append(str(filename))
        return original_write(obj, filename, *args, **kwargs)

    original_save = checkpoint_utils.save_checkpoint

    def save_checkpoint(cfg, trainer, epoch_itr, val_loss):
        result = original_save(cfg, trainer, epoch_itr, val_loss)
        initialised = torch.distributed.is_initialized()
        rank = torch.distributed.get_rank() if initialised else -1
        record = dict(
            state, final=clone(trainer.get_model()), dist_rank=rank,
            world_size=torch.distributed.get_world_size() if initialised else 1,
            trainer_rank=trainer.data_parallel_rank, trainer_world_size=trainer.data_parallel_world_size,
            num_updates=trainer.get_num_updates(),
        )
        name = f"rank{rank if rank >= 0 else os.environ.get('RANK', 'x')}"
        torch.save(record, os.path.join(record_dir, name + ".pt.tmp"))
        os.replace(os.path.join(record_dir, name + ".pt.tmp"), os.path.join(record_dir, name + ".pt"))
        return result

    # (checkpoint_utils keeps its best score on the module-level function: now this wrapper.)
    Trainer.train_step = train_step
    checkpoint_utils.torch_persistent_save = torch_persistent_save
    checkpoint_utils.save_checkpoint = save_checkpoint
    train.cli_main()


if __name__ == "__main__":
    _launch()
