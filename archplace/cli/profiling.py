"""``archplace`` ``profile``: a model's training step measured on this machine's CPU or GPU, per node of
its archplace graph (the file ``--op-model profiled --profile FILE`` reads).

Each ``cmd_*`` turns argv into a request and returns the result's ``to_dict()`` (the ``--json`` output);
each ``print_*`` writes the human summary; each ``add_*_parser`` declares the flags."""

from __future__ import annotations

from typing import Any

from archplace import api
from archplace.cli import status
from archplace.cli.common import add_model_args, model_ref


def cmd_profile(args) -> dict[str, Any]:
    """Run the model's training step on ``--device`` and map the measured time to its graph's nodes."""
    req = api.ProfileRequest(model_ref(args), out=args.out, device=args.device, dtype=args.dtype,
                             mbs=args.mbs, seq=args.seq, capture_blocks=args.capture_blocks,
                             method=args.method, steps=args.steps, warmup=args.warmup,
                             threads=args.threads or None, seed=args.seed)
    status.phase(f"building the graph and running {args.steps} training steps on {args.device}")
    return api.profile(req).to_dict()


def print_profile(res: dict[str, Any]) -> None:
    ratio = res["profiled_over_measured"]
    print(f"{res['model']} on {res['device']} ({res['device_name']}), {res['dtype']}, mbs {res['mbs']}, "
          f"seq {res['seq']}: {res['nodes']} graph nodes [{res['wall_s']:.1f} s]")
    print(f"  measured step  {res['measured_step_s'] * 1e3:.2f} ms ({res['details'].get('step_measure')}, "
          f"median of {res['details'].get('steps')}, no instruments)")
    print(f"  profiled step  {res['profiled_step_s'] * 1e3:.2f} ms = {ratio:.3f}x measured "
          f"({res['details'].get('method')}); unmapped {res['unmapped_s'] * 1e3:.2f} ms, "
          f"coverage {res['coverage']:.1%}")
    print("  top ops:")
    for t in res["top_ops"]:
        print(f"    {t['time_s'] * 1e3:9.3f} ms  {t['share']:6.1%}  {t['name']}")
    print(f"  profile written to {res['out']}")


def add_profile_parser(sub) -> None:
    p = sub.add_parser("profile", help="measure a model's training step per graph node on this CPU/GPU")
    p.add_argument("model", nargs="?", help="transformers preset (bert-base), GDP preset (txl-2) or "
                                           "--hf-config")
    add_model_args(p)
    p.add_argument("--device", choices=api.PROFILE_DEVICES, default="cpu")
    p.add_argument("--dtype", choices=api.PROFILE_DTYPES, default="fp32")
    p.add_argument("--mbs", type=int, default=1, help="micro-batch (a GDP preset's batch)")
    p.add_argument("--seq", type=int, default=None, help="sequence length (default: the preset's)")
    p.add_argument("--method", choices=api.PROFILE_METHODS, default=None,
                   help="timer: thread CPU time per op (CPU default); profiler: torch.profiler (CUDA)")
    p.add_argument("--steps", type=int, default=5, help="measured steps after the warm-up")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="CPU intra-op threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="the profile's JSON file")
    p.add_argument("--json", action="store_true")
