"""Activation memory of models/llama.py measured on the CPU, per layout, against the memory plan's figure.

    DS_ACCELERATOR=cpu .venv/bin/python bench/activation_memory.py --json /tmp/actmem.json
    DS_ACCELERATOR=cpu .venv/bin/python bench/activation_memory.py --json /tmp/actmem.json --layouts single --seq-len 256

A CPU rank's peak RSS is mostly Python, torch and DeepSpeed (hundreds of MB), so bench/parallel.py's tiny model says
nothing about models/memory_plan.py's activation figure. Here the model is small in weights (4 blocks, 256 wide,
4M parameters) and large in activations (8 sequences of 512 tokens a micro-batch, fp32: several hundred MB), and
every rank runs training steps through the training stage's own engine (tasks/training/engine.build_engine:
DeepSpeed, ZeRO-0, our AdamW; tp through models/tensor_parallel.py, pp through DeepSpeed's pipeline engine and
its 1F1B schedule), started as 1 or 2 processes of a gloo group. After one warm-up step, three more steps are
each measured one way:

  allocator  torch's own accounting of the CPU allocator: the profiler's memory events (profile_memory=True;
             every allocation and free of c10's CPU allocator, with its address) over one whole step, summed in
             order. Gradients of the parameters are told apart by address (a post-accumulate-grad hook marks
             each one) and left out, as the plan counts them with the model states. The peak of what is left
             is the activation peak: what autograd saves, plus the transient tensors of forward and backward
             (logits, the loss's gradient), plus (pp) DeepSpeed's pipeline buffers. This is the figure the
             plan's activations are compared with.
  saved      the unique storages autograd saves for backward during the step's forwards
             (torch.autograd.graph.saved_tensors_hooks, deduplicated by storage, parameters left out): what
             is held between forward and backward, without the transients. pp: over all micro-batches of
             the step (stage 0 holds them all at once under 1F1B; the last stage one at a time).
  rss        the OS's view: VmHWM - VmRSS around the step (peak reset through /proc/self/clear_refs, glibc's
             free memory returned first with malloc_trim); it includes the gradients (allocated in backward),
             the optimizer's temporaries and whatever malloc keeps, so it is a cross-check, not the figure.

Layouts: single (1 rank), ckpt (1 rank, every block under torch.utils.checkpoint, non-reentrant: the plan's
"full activation checkpointing"; the training stage itself has no such switch), tp2 and pp2 (2 ranks each,
per-rank figures; pp2 runs grad_accum = 2 micro-batches, so stage 0 has both in flight).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = {"dim": 256, "n_layers": 4, "n_heads": 8, "n_kv_heads": 4, "ffn_hidden": 704, "max_seq_len": 1024}
VOCAB, SEQ_LEN, MICRO_BATCH = 4096, 512, 8
LAYOUTS = {  # name: (ranks, tp, pp, activation checkpointing)
    "single": (1, 1, 1, False),
    "ckpt": (1, 1, 1, True),
    "tp2": (2, 2, 1, False),
    "pp2": (2, 1, 2, False),
}
GRAD_MARK = "llmforge.grad "
FORWARD_MARK = "llmforge.forward"
TOLERANCE = 0.20  # the goal: the plan's activation figure within 20% of the measured peak


# ----------------------------------------------------------------------------- the three measurements


def _local(t):
    """The plain tensor behind a wrapper subclass (a DTensor's shard on this rank, a functional collective's
    AsyncCollectiveTensor), or t itself."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    while is_traceable_wrapper_subclass(t):
        inner, _ = t.__tensor_flatten__()
        t = getattr(t, inner[0])
    return t


def _storage(t):
    """t's storage, or None for one without data (a meta tensor, a storage already freed)."""
    try:
        st = _local(t).untyped_storage()
        return st if st.data_ptr() else None
    except (RuntimeError, NotImplementedError):
        return None


def weight_storages(module) -> set[int]:
    """Data pointers of the parameters' storages (a view of a weight shares its storage)."""
    return {st.data_ptr() for p in module.parameters() if (st := _storage(p)) is not None}


def saved_bytes(step, weights: set[int]) -> int:
    """Bytes of the unique non-weight storages autograd saves during `step()` (each storage kept alive until the
    end of the step, so that a freed one's address reused by a later micro-batch is not mistaken for it)."""
    import torch

    saved: dict[int, object] = {}

    def pack(t):
        st = _storage(t)
        if st is not None and st.data_ptr() not in weights:
            saved.setdefault(st.data_ptr(), st)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    total = sum(st.nbytes() for st in saved.values())
    saved.clear()
    return total


def allocator_timeline(step, params, keep: Path | None = None) -> dict[str, int]:
    """Run `step()` under torch's profiler with memory profiling; from its CPU allocator events: the peak of all
    bytes allocated in the step, the peak without the parameters' gradients, the gradients' bytes, and (when
    the step marks its forward with FORWARD_MARK) the bytes held when the last forward ended. `keep`: where to
    copy the profiler's trace (chrome://tracing or Perfetto open it)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    def mark(p) -> None:
        st = _storage(p.grad)
        if st is not None:
            with record_function(f"{GRAD_MARK}{st.data_ptr()}"):
                pass

    hooks = [p.register_post_accumulate_grad_hook(mark) for p in params if p.requires_grad]
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step()
    finally:
        for h in hooks:
            h.remove()
    with tempfile.TemporaryDirectory() as tmp:
        trace_path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace_path))
        events = json.loads(trace_path.read_text())["traceEvents"]
        if keep is not None:
            keep.write_bytes(trace_path.read_bytes())
    return timeline_peaks(events)


def timeline_peaks(events: list[dict]) -> dict[str, int]:
    """The peaks of a profiler trace's CPU memory events (see allocator_timeline)."""
    mem = [e for e in events if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == 0]
    mem.sort(key=lambda e: (float(e["ts"]), e["args"].get("Ev Idx", 0)))
    marks = [(float(e["ts"]), int(e["name"][len(GRAD_MARK):])) for e in events
             if e.get("name", "").startswith(GRAD_MARK)]
    forward_ends = [float(e["ts"]) + float(e.get("dur", 0)) for e in events if e.get("name") == FORWARD_MARK]
    # A gradient's allocation: the last allocation at its address before the hook that saw it there.
    allocs_at: dict[int, list[int]] = {}
    for i, e in enumerate(mem):
        if e["args"]["Bytes"] > 0:
            allocs_at.setdefault(int(e["args"]["Addr"]), []).append(i)
    grad_allocs = set()
    for ts, addr in marks:
        before = [i for i in allocs_at.get(addr, []) if float(mem[i]["ts"]) <= ts]
        if before:
            grad_allocs.add(before[-1])
    live = grads = peak = peak_no_grads = grad_bytes = 0
    held_after_forward = None
    open_grads: dict[int, int] = {}
    last_forward_end = max(forward_ends) if forward_ends else None
    for i, e in enumerate(mem):
        if last_forward_end is not None and held_after_forward is None and float(e["ts"]) > last_forward_end:
            held_after_forward = live
        nbytes, addr = int(e["args"]["Bytes"]), int(e["args"]["Addr"])
        live += nbytes
        if i in grad_allocs:
            open_grads[addr] = nbytes
            grads += nbytes
            grad_bytes += nbytes
        elif nbytes < 0 and addr in open_grads:
            grads -= open_grads.pop(addr)
        peak = max(peak, live)
        peak_no_grads = max(peak_no_grads, live - grads)
    out = {"alloc_peak_bytes": peak, "alloc_peak_without_grads_bytes": peak_no_grads, "grad_bytes": grad_bytes}
    if last_forward_end is not None:
        out["alloc_held_after_forward_bytes"] = live if held_after_forward is None else held_after_forward
    return out


def _proc_status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def rss_delta(step) -> int | None:
    """VmHWM after `step()` minus VmRSS before it (None where the peak cannot be reset)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    except OSError:
        return None
    before = _proc_status_kib("VmRSS")
    step()
    return (_proc_status_kib("VmHWM") - before) * 1024


# ----------------------------------------------------------------------------- one rank


def model_config(seq_len: int):
    from models.llama import ModelConfig

    return ModelConfig(**{**MODEL, "max_seq_len": max(MODEL["max_seq_len"], seq_len), "vocab_size": VOCAB})


def checkpoint_blocks(model) -> None:
    """Run every block of `model` (a models.llama.Transformer) under torch.utils.checkpoint, non-reentrant, in
    place: a block keeps only its inputs and is rebuilt in backward (the plan's full activation checkpointing)."""
    import torch
    from torch.utils.checkpoint import checkpoint

    class Checkpointed(torch.nn.Module):
        def __init__(self, block):
            super().__init__()
            self.block = block

        def forward(self, x, cos, sin, cache):
            return checkpoint(self.block, x, cos, sin, cache, use_reentrant=False)

    model.layers = torch.nn.ModuleList(Checkpointed(b) for b in model.layers)


def run_rank(rank: int, world: int, port: int, layout: str, seq_len: int, micro_batch: int, out: str,
             traces: str | None = None) -> None:
    """One rank: the engine the training stage builds for this layout, a warm-up step, three measured steps."""
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "DS_ACCELERATOR": "cpu"})
    import torch
    from torch.profiler import record_function

    from models.llama import Transformer
    from models.losses import next_token_loss
    from tasks.training.config import LaunchConfig, OptimConfig
    from tasks.training.distributed import init_distributed
    from tasks.training.engine import build_engine
    from tasks.training.parallel import RankLayout

    torch.set_num_threads(1)  # two ranks on a shared 2-core machine
    init_distributed()  # as tasks/training/loop.py does, before the model is wrapped
    _, tp, pp, ckpt = LAYOUTS[layout]
    cfg = model_config(seq_len)
    torch.manual_seed(0)
    model = Transformer(cfg)
    if ckpt:
        checkpoint_blocks(model)
    launch = LaunchConfig(num_procs=world, tp=tp, pp=pp, zero="zero0", precision="fp32", torch_threads=1)
    rank_layout = RankLayout.of(launch, rank, world)
    grad_accum = pp  # pp: as many micro-batches as stages, so that stage 0 has pp of them in flight
    model = rank_layout.wrap(model, seed=0)
    engine = build_engine(model, OptimConfig(lr=1e-4, warmup_steps=0), launch, micro_batch, grad_accum, steps=100,
                          layout=rank_layout)
    gen = torch.Generator().manual_seed(1)
    batch = (torch.randint(0, cfg.vocab_size, (micro_batch, seq_len), generator=gen),
             torch.randint(0, cfg.vocab_size, (micro_batch, seq_len), generator=gen))

    def step() -> None:
        if pp > 1:
            engine.train_batch(data_iter=iter([batch] * grad_accum))
            return
        with record_function(FORWARD_MARK):
            loss = next_token_loss(engine(batch[0]), batch[1])
        engine.backward(loss)
        engine.step()

    t0 = time.perf_counter()
    step()  # warm-up: the optimizer's state, oneDNN's kernels, DeepSpeed's buffers
    warm_s = time.perf_counter() - t0
    module = engine.module
    params = [p for p in module.parameters()]
    weights = weight_storages(module)
    result = {"rank": rank, "layout": layout, "warm_step_s": round(warm_s, 1),
              "param_bytes": sum(_local(p).numel() * _local(p).element_size() for p in params)}
    result["rss_delta_bytes"] = rss_delta(step)
    keep = Path(traces) / f"{layout}.rank{rank}.trace.json" if traces else None
    result.update(allocator_timeline(step, params, keep))
    result["saved_bytes"] = saved_bytes(step, weights)
    result["micro_batches"] = grad_accum
    Path(out).write_text(json.dumps(result))
    if world > 1:
        import torch.distributed as dist

        dist.barrier()


def run_layout(layout: str, seq_len: int, micro_batch: int, work: Path, traces: Path | None = None) -> list[dict]:
    """Start the layout's ranks (spawned processes of one gloo group) and collect what each measured."""
    import multiprocessing as mp

    from infra.launch.launcher import free_port

    world = LAYOUTS[layout][0]
    port = free_port()
    ctx = mp.get_context("spawn")
    outs = [work / f"{layout}.rank{r}.json" for r in range(world)]
    procs = [ctx.Process(target=run_rank, args=(r, world, port, layout, seq_len, micro_batch, str(outs[r]),
                                                      str(traces) if traces else None))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    bad = [r for r, p in enumerate(procs) if p.exitcode != 0]
    if bad:
        raise SystemExit(f"{layout}: rank(s) {bad} failed (exit codes {[procs[r].exitcode for r in bad]})")
    return [json.loads(o.read_text()) for o in outs]


# ----------------------------------------------------------------------------- the plan's figures


def plan_figures(layout: str, seq_len: int, micro_batch: int) -> list[int]:
    """The plan's activation bytes for each rank of the layout (pp: each stage's; tp: every rank alike)."""
    from models.memory_plan import PRECISIONS, stage_activation_bytes

    ranks, tp, pp, ckpt = LAYOUTS[layout]
    cfg, e = model_config(seq_len), PRECISIONS["fp32"]
    return [stage_activation_bytes(cfg, seq_len, micro_batch, tp, pp, stage=r if pp > 1 else pp - 1, e=e,
                                   checkpointed=ckpt) for r in range(ranks)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, required=True, help="where to write the results")
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--seq-len", type=int, default=SEQ_LEN)
    parser.add_argument("--micro-batch", type=int, default=MICRO_BATCH)
    parser.add_argument("--traces", type=Path, default=None, help="keep each rank's profiler trace in this folder")
    args = parser.parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    if args.traces is not None:
        args.traces.mkdir(parents=True, exist_ok=True)
    report = {"model": {**MODEL, "vocab_size": VOCAB}, "seq_len": args.seq_len, "micro_batch": args.micro_batch,
              "precision": "fp32", "layouts": {}}
    rows = []
    with tempfile.TemporaryDirectory(prefix="llmforge-actmem-") as tmp:
        for name in args.layouts:
            t0 = time.perf_counter()
            ranks = run_layout(name, args.seq_len, args.micro_batch, Path(tmp), args.traces)
            plans = plan_figures(name, args.seq_len, args.micro_batch)
            for r, plan in zip(ranks, plans):
                r["plan_activation_bytes"] = plan
                r["ratio"] = plan / r["alloc_peak_without_grads_bytes"]
                rows.append((name, r))
            report["layouts"][name] = {"ranks": ranks, "wall_s": round(time.perf_counter() - t0, 1)}
            print(f"{name}: done in {time.perf_counter() - t0:.0f} s", flush=True)
    args.json.write_text(json.dumps(report, indent=1))
    mib = 2**20
    print(f"\nfp32, {args.micro_batch} x {args.seq_len} tokens a micro-batch, model {MODEL}, vocab {VOCAB}")
    print("| layout | rank | allocator peak, grads left out (MiB) | saved for backward (MiB) | RSS delta (MiB) "
          "| plan's activations (MiB) | plan / allocator peak |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    ok = True
    for name, r in rows:
        rss = "-" if r["rss_delta_bytes"] is None else f"{r['rss_delta_bytes'] / mib:.0f}"
        print(f"| {name} | {r['rank']} | {r['alloc_peak_without_grads_bytes'] / mib:.1f} | {r['saved_bytes'] / mib:.1f} "
              f"| {rss} | {r['plan_activation_bytes'] / mib:.1f} | {r['ratio']:.2f} |")
        ok &= abs(r["ratio"] - 1) <= TOLERANCE
    print(f"\nplan within {TOLERANCE:.0%} of the allocator peak on every rank: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
