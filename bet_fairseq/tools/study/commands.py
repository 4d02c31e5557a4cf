"""A run's fairseq commands, and when two runs' commands are the same: what a run's markers hold as its settings.

A run is fairseq-train, then fairseq-generate (translation) or fairseq-eval-lm (language model), on the dataset's
recipe with the scale's overrides, the row's flags, the run's setting and its seed. Two runs whose commands differ
only in their folders (the work folder, the plugin, the folder of fairseq's commands) make the same model: a
moved work folder, a run put back from the archive and a run of another name with these commands all count.
"""

import shlex

from bet_fairseq import catalog, recipes
from bet_fairseq.tools import executor
from . import plan


def arch(run):
    return catalog.row(run.row).arch(run.dataset)


def job(run, scale, bin_dir, save_dir, cpu=True) -> executor.Job:
    """The dataset's recipe, the scale's overrides for its kind, the row's flags, the run's setting, the seed
    (and the criterion the output layer needs: ``recipes.for_softmax``)."""
    ds, sc, row = catalog.dataset(run.dataset), plan.SCALE_TABLE[scale], catalog.row(run.row)
    train = recipes.for_softmax(recipes.merge(recipes.train_recipe(ds.key), sc.train[ds.kind],
                                              row.train_flags.get(ds.kind, {}), run.flags, {"--seed": run.seed}))
    ev = recipes.merge(recipes.eval_recipe(ds.key), sc.eval[ds.kind], row.eval_flags.get(ds.kind, {}))
    return executor.Job(arch(run), bin_dir, save_dir, ds, train, ev, cpu=cpu)


def commands(run, scale, bin_dir, save_dir, cpu=True):
    """(train argv, eval argv) of a run."""
    return job(run, scale, bin_dir, save_dir, cpu).commands()


def on_cpu(scale) -> bool:
    return plan.SCALE_TABLE[scale].device == "cpu" or not executor.has_cuda()


def settings(run, scale, save_dir, bin_dir):
    """(job, training settings, run settings): what a run's markers must hold to count."""
    the_job = job(run, scale, bin_dir, save_dir, cpu=on_cpu(scale))
    train_argv, eval_argv = the_job.commands()
    train_settings = {"train": shlex.join(train_argv)}
    return the_job, train_settings, {**train_settings, "eval": shlex.join(eval_argv)}


FOLDER_FLAGS = ("--user-dir", "--save-dir", "--path")


def without_folders(command: str) -> list:
    """A run's command as what it does, not where: the program and the data (before ``--user-dir``) and the
    values of ``FOLDER_FLAGS`` left out (a work folder moved or put back from the archive holds the same runs)."""
    argv = shlex.split(command)
    argv = argv[argv.index("--user-dir"):] if "--user-dir" in argv else argv
    return ["<folder>" if i and argv[i - 1] in FOLDER_FLAGS else a for i, a in enumerate(argv)]


def same_commands(made: dict, now: dict) -> bool:
    """Whether two runs' settings (``{"train": command, "eval": command}``) are the same commands, folders apart."""
    return set(made) == set(now) and all(without_folders(made[k]) == without_folders(now[k]) for k in now)


def key(run, scale) -> tuple:
    """What ``same_commands`` compares of a run, with its dataset: runs with the same key make the same model."""
    return (run.dataset, *(tuple(without_folders(shlex.join(argv))) for argv in commands(run, scale, "BIN", "RUN")))


def extends(before: str, after: str) -> bool:
    """Whether the training command ``after`` is ``before`` with a larger ``--max-update`` and nothing else changed:
    fairseq-train then goes on from ``before``'s checkpoint_last.pt to the same model a run trained to the larger
    number from the start would be (the learning-rate schedule depends on the update number only, the batches
    come in the same order and the dropout seed is the seed plus the update number)."""
    a, b = shlex.split(before), shlex.split(after)
    if len(a) != len(b) or "--max-update" not in a[:-1] or "--max-update" not in b[:-1]:
        return False
    i, j = a.index("--max-update") + 1, b.index("--max-update") + 1
    try:
        larger = int(b[j]) > int(a[i])
    except ValueError:
        return False
    return larger and i == j and a[:i] + a[i + 1:] == b[:j] + b[j + 1:]
