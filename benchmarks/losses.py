"""Peak memory and time of forward+backward: chunked divergences vs the naive materialised computation.

Run:  .venv/bin/python benchmarks/losses.py            # B=4, T=1024, V=32000 (a few minutes)
      .venv/bin/python benchmarks/losses.py --quick    # small shapes, seconds

Each (divergence, variant) runs in a fresh subprocess so that its peak resident memory can be read
reliably: the child creates the inputs (float32 student logits as a leaf requiring grad, teacher
logits, an all-ones mask), records ``ru_maxrss`` (the process's high-water mark), runs one
forward+backward, and reports the growth of the high-water mark: the peak extra memory of the loss
including the gradient it leaves in ``student.grad`` (the same for both variants). PyTorch on CPU has
no allocator statistics, and RSS after the fact misses transient peaks, hence this design. The child
then times ``--repeats`` more forward+backward runs. Naive and chunked children alternate for
``--rounds`` rounds, so that load from other jobs on a shared machine hits both alike; the table
reports the median peak and the median time over all rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from children import maxrss_mib, run_child

from distill.losses import DIVERGENCES, build_divergence

PARAMS = {"jsd": {"beta": 0.5}, "skew_kl": {"alpha": 0.1}, "skew_reverse_kl": {"alpha": 0.1}}
PARAMS["interpolated_kl"] = {"weight": 0.5}


def _kl(p, logp, logq):
    return (p * (logp - logq)).sum(-1)


def naive_per_token(name: str, s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Textbook float32 computation with every [B, T, V] intermediate materialised by autograd."""
    ls, lt = torch.log_softmax(s.float(), -1), torch.log_softmax(t.float(), -1)
    ps, pt = ls.exp(), lt.exp()
    if name == "forward_kl":
        return _kl(pt, lt, ls)
    if name == "reverse_kl":
        return _kl(ps, ls, lt)
    if name == "jsd":
        m = torch.log(0.5 * ps + 0.5 * pt)
        return 0.5 * _kl(pt, lt, m) + 0.5 * _kl(ps, ls, m)
    if name == "skew_kl":
        return _kl(pt, lt, torch.log(0.1 * pt + 0.9 * ps))
    if name == "skew_reverse_kl":
        return _kl(ps, ls, torch.log(0.9 * pt + 0.1 * ps))
    if name == "tvd":
        return 0.5 * (ps - pt).abs().sum(-1)
    if name == "interpolated_kl":
        return 0.5 * _kl(pt, lt, ls) + 0.5 * _kl(ps, ls, lt)
    raise KeyError(name)


def worker(name: str, variant: str, b: int, t: int, v: int, repeats: int, chunk_size: int | None) -> dict:
    torch.manual_seed(0)
    student = torch.randn(b, t, v).requires_grad_()
    teacher = torch.randn(b, t, v)
    mask = torch.ones(b, t)
    opts = {} if chunk_size is None else {"chunk_size": chunk_size}
    div = build_divergence(name, **opts, **PARAMS.get(name, {}))

    def step():
        if variant == "naive":
            loss = (naive_per_token(name, student, teacher) * mask).sum() / mask.sum()
        else:
            loss = div(student, teacher, mask)
        loss.backward()
        student.grad = None
        return loss.item()

    base = maxrss_mib()
    value = step()
    peak = maxrss_mib() - base
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return {"peak_mib": peak, "times": times, "value": value}


def _spawn(name, variant, args) -> dict:
    child = ["--worker", name, variant, "--shape", *map(str, args.shape), "--repeats", str(args.repeats)]
    if args.chunk_size is not None:
        child += ["--chunk-size", str(args.chunk_size)]
    return run_child(__file__, child, f"{name}/{variant}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shapes (B=2, T=1024, V=8192, chunk 256)")
    parser.add_argument("--shape", type=int, nargs=3, metavar=("B", "T", "V"), default=None)
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per child process")
    parser.add_argument("--rounds", type=int, default=3, help="alternating naive/chunked children")
    parser.add_argument("--chunk-size", type=int, default=None, help="chunk_size (default: the library's)")
    parser.add_argument("--divergences", nargs="*", default=list(DIVERGENCES), choices=list(DIVERGENCES))
    parser.add_argument("--worker", nargs=2, metavar=("NAME", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.shape is None:
        args.shape = [2, 1024, 8192] if args.quick else [4, 1024, 32000]
    if args.quick and args.chunk_size is None:
        args.chunk_size = 256  # so that the small shape is still split into several chunks
    if args.worker:
        print(json.dumps(worker(*args.worker, *args.shape, args.repeats, args.chunk_size)))
        return
    b, t, v = args.shape
    input_mib = b * t * v * 4 / 2**20
    print(f"shape B={b} T={t} V={v} float32; one [B,T,V] float32 tensor = {input_mib:.0f} MiB")
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.rounds} rounds x "
        f"{args.repeats} timed runs per variant; chunk_size={args.chunk_size or 'default'}"
    )
    header = f"{'divergence':<16} {'naive MiB':>10} {'chunked MiB':>12} {'mem ratio':>9} "
    header += f"{'naive s':>8} {'chunked s':>9} {'time ratio':>10} {'|dvalue|':>9}"
    print(header)
    for name in args.divergences:
        runs = {"naive": [], "chunked": []}
        for _ in range(args.rounds):
            for variant in runs:
                runs[variant].append(_spawn(name, variant, args))
        naive, chunked = (
            {
                "peak_mib": statistics.median(r["peak_mib"] for r in rs),
                "time_s": statistics.median(x for r in rs for x in r["times"]),
                "value": rs[0]["value"],
            }
            for rs in runs.values()
        )
        print(
            f"{name:<16} {naive['peak_mib']:>10.0f} {chunked['peak_mib']:>12.0f} "
            f"{chunked['peak_mib'] / naive['peak_mib']:>9.2f} {naive['time_s']:>8.2f} "
            f"{chunked['time_s']:>9.2f} {chunked['time_s'] / naive['time_s']:>10.2f} "
            f"{abs(naive['value'] - chunked['value']):>9.1e}",
            flush=True,
        )


if __name__ == "__main__":
    main()
