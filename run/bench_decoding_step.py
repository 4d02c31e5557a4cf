#!/usr/bin/env python
"""One incremental decoding step of one decoder self-attention layer, profiled: fairseq's vanilla
``MultiheadAttention`` against the bet_fairseq variants (BET(SF) in its forms and diagonal settings, DiagFree).

    python run/bench_decoding_step.py                         # IWSLT size: 512 dim, 4 heads, 250 hypotheses
    python run/bench_decoding_step.py --batch 1 --keys 64     # interactive latency, one sentence
    python run/bench_decoding_step.py --table bet_sf          # the (op, calls, time) table of one module

Each module first decodes ``--keys - 1`` steps (untimed) so that its cache holds that many keys, then the
profiler (``torch.profiler``, CPU) records ``--steps`` further single-token steps on copies of that cache, as
beam search runs them (``need_weights=False``, no padding, no attention mask). Reports per step: the top-level
operators (those the module's code calls, not views: "the op count"), the operators that run a kernel (the
bottom of each call chain, not views or metadata: what a GPU launches one by one; ``linear`` counts as the bias
copy and the ``addmm``), every aten call (views included: what a CPU spends in the dispatcher), the median CPU
time of a step outside the profiler (modules interleaved over ``--rounds``), and the (op, calls, time) table of
the top-level operators of the modules named by ``--table``. bench_speed.py measures the whole model.
"""

import argparse

import torch

from bet_fairseq.tools import timing

# operators that only make a new view or read metadata: no kernel runs
VIEW_OPS = {
    "aten::view", "aten::_unsafe_view", "aten::as_strided", "aten::transpose", "aten::permute", "aten::unsqueeze",
    "aten::squeeze", "aten::slice", "aten::select", "aten::expand", "aten::reshape", "aten::_reshape_alias",
    "aten::alias", "aten::t", "aten::detach", "aten::resolve_conj", "aten::resolve_neg", "aten::contiguous",
    "aten::empty", "aten::empty_strided", "aten::lift_fresh", "aten::numpy_T", "aten::split", "aten::chunk",
    "aten::narrow", "aten::unbind", "aten::dropout", "aten::to", "aten::_to_copy_noop", "aten::type_as",
    "aten::result_type", "aten::is_nonzero", "aten::item", "aten::_local_scalar_dense", "aten::size",
}

# name -> (variant or None for fairseq's MultiheadAttention, options)
MODULES = {
    "vanilla (fairseq)": (None, {}),
    "vanilla (variant skeleton)": ("vanilla_skeleton", {}),
    "diag_free": ("diag_free", {}),
    "diag_scale 0.2": ("diag_scale", dict(diag_scale=0.2)),
    "bet_sf": ("bet_sf", {}),
    "bet_sf keep-diagonal": ("bet_sf", dict(bet_keep_diagonal=True)),
    "bet_sf share-w": ("bet_sf", dict(bet_share_w=True)),
    "bet_sf authors": ("bet_sf", dict(bet_form="authors")),
    "bet_sf authors keep-diagonal": ("bet_sf", dict(bet_form="authors", bet_keep_diagonal=True)),
    "bet_sf authors_lm": ("bet_sf", dict(bet_form="authors_lm")),
}


def build_module(name, embed, heads):
    from fairseq.modules.multihead_attention import MultiheadAttention

    from bet_fairseq.attention import VARIANTS, SelfAttentionVariant

    variant, options = MODULES[name]
    torch.manual_seed(0)
    if variant is None:
        return MultiheadAttention(embed, heads, self_attention=True).eval()
    if variant == "vanilla_skeleton":  # the shared skeleton's own cost, without fairseq's delegation
        return SelfAttentionVariant(embed, heads).eval()
    cls = VARIANTS[variant]
    return cls(embed, heads, options=cls.options_class(**options) if cls.options_class else None).eval()


def filled_state(module, batch, keys, embed):
    """The incremental state after ``keys - 1`` decoding steps of random inputs."""
    state = {}
    with torch.no_grad():
        for _ in range(keys - 1):
            x = torch.randn(1, batch, embed)
            module(x, x, x, incremental_state=state, need_weights=False)
    return state


def one_step(module, state, x):
    """One step from the cached ``state`` (copied: the step writes its new keys into the state's dicts)."""
    with torch.no_grad():
        module(x, x, x, incremental_state={k: dict(v) for k, v in state.items()}, need_weights=False)


def runs_kernel(event) -> bool:
    """An operator that computes (not a view) and leaves no computing to an operator it calls: the one launch of
    a composite operator (``linear`` -> ``addmm``) is counted once, at the bottom."""
    if event.name in VIEW_OPS:
        return False
    stack = list(event.cpu_children)
    while stack:
        child = stack.pop()
        if child.name.startswith("aten::") and child.name not in VIEW_OPS:
            return False
        stack.extend(child.cpu_children)
    return True


def top_level(event) -> bool:
    """An operator the module's Python code calls itself (not a view), not one called by another operator."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return False
        parent = parent.cpu_parent
    return event.name not in VIEW_OPS


def count_ops(prof):
    """(all aten calls, top-level computing calls, the calls that run a kernel) over the recorded events."""
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    return len(events), [e for e in events if top_level(e)], [e for e in events if runs_kernel(e)]


def profile(module, state, x, steps):
    from torch.profiler import ProfilerActivity, profile as torch_profile

    one_step(module, state, x)  # warm-up
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            one_step(module, state, x)
    calls, top, kernels = count_ops(prof)
    return prof, dict(calls=calls / steps, top=len(top) / steps, kernels=len(kernels) / steps), top


def step_ms(jobs, rounds):
    """Median CPU ms of one step per module (process time: steadier than the wall clock on a shared machine),
    the modules interleaved in every round so that a change of load hits them alike."""
    clock = timing.Clock("cpu")
    times = timing.repeat(list(jobs), rounds, lambda name: clock.seconds(one_step, *jobs[name]))
    return {name: 1000 * median for name, median in timing.medians(times).items()}


def op_table(top, steps):
    """Markdown (op, calls per step, CPU us per step including what it calls) of the top-level operators."""
    rows = {}
    for e in top:
        count, us = rows.get(e.name, (0, 0.0))
        rows[e.name] = (count + 1, us + e.cpu_time_total)
    lines = ["| op | calls per step | CPU us per step |", "|---|---|---|"]
    for name, (count, us) in sorted(rows.items(), key=lambda r: -r[1][1]):
        lines.append(f"| `{name}` | {count / steps:g} | {us / steps:.1f} |")
    return "\n".join(lines)


def main(argv=None):
    import bet_fairseq

    bet_fairseq.register()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--embed", type=int, default=512)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--batch", type=int, default=250, help="hypotheses (fairseq-generate --batch-size 50 x beam 5)")
    p.add_argument("--keys", type=int, default=15, help="keys in the cache at the profiled step")
    p.add_argument("--steps", type=int, default=20, help="profiled steps")
    p.add_argument("--rounds", type=int, default=50, help="timed steps per module (median), outside the profiler")
    timing.add_threads_option(p)
    p.add_argument("--modules", default=",".join(MODULES), help="comma-separated names of MODULES")
    p.add_argument("--table", default="vanilla (fairseq),bet_sf", help="modules whose op table is printed")
    args = p.parse_args(argv)
    timing.set_threads(args.threads)
    names = [n for n in args.modules.split(",") if n]
    unknown = [n for n in names if n not in MODULES]
    if unknown:
        p.error(f"unknown --modules {unknown}; choose from {list(MODULES)}")
    x = torch.randn(1, args.batch, args.embed)
    print(f"E={args.embed} H={args.heads} hypotheses={args.batch} keys={args.keys} threads={torch.get_num_threads()} "
          f"torch {torch.__version__}\n")
    jobs, counts, tables = {}, {}, {}
    for name in names:
        module = build_module(name, args.embed, args.heads)
        jobs[name] = (module, filled_state(module, args.batch, args.keys, args.embed), x)
        _, counts[name], top = profile(*jobs[name], args.steps)
        if name in args.table.split(","):
            tables[name] = op_table(top, args.steps)
    ms = step_ms(jobs, args.rounds)
    print("| module | top-level ops per step | kernel ops per step | aten calls per step | step CPU ms (median) |")
    print("|---|---|---|---|---|")
    for name in names:
        c = counts[name]
        print(f"| {name} | {c['top']:g} | {c['kernels']:g} | {c['calls']:g} | {ms[name]:.3f} |")
    for name, text in tables.items():
        print(f"\n{name}, top-level operators of one step:\n\n{text}")


if __name__ == "__main__":
    main()
