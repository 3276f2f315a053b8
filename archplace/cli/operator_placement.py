"""``archplace`` ``place-ops``: every operator of a training step on the GPUs of a machine (GDP).

Each ``cmd_*`` turns argv into a request and returns the result's ``to_dict()`` (the ``--json`` output);
each ``print_*`` writes the human summary; each ``add_*_parser`` declares the flags."""

from __future__ import annotations

import argparse
from typing import Any

from archplace import api
from archplace.api.operator_placement import CALL_BUDGET_MIN, MACHINES, MAX_BUDGET_CALLS
from archplace.cli import status
from archplace.cli.common import connect_if_needed, fmt_bytes
from archplace.cli.pipelining import add_op_model_args
from archplace.cli.vocabulary import (
    BUDGETS_KEY,
    add_devices,
    budgets,
    count,
    gpu_choice,
    note,
    positive,
    refuse,
    renamed,
)


def cmd_place_ops(args) -> dict[str, Any]:
    """Every operator of a model's training step on one GPU of a multi-GPU machine (GDP)."""
    budget = _budget(args)
    req = api.PlaceOpsRequest(args.model, devices=args.devices, algo=args.algo, machine=args.gpu,
                              batch=args.batch, seed=args.seed, budget=budget,
                              pretrained=args.pretrained, zero_shot=args.zero_shot, op_model=args.op_model,
                              dtype=args.dtype, profile=args.profile)
    connect_if_needed(req, args.address)
    res = api.place_ops(req, progress=status.stages({
        "graph": lambda i: f"placing {i.get('nodes')} operators ({args.algo})",
        "place": "simulating the training step"})).to_dict()
    if args.algo == "exact":
        res[BUDGETS_KEY] = budgets(timeout_s=req.budget_value)
    elif args.algo in CALL_BUDGET_MIN:
        res[BUDGETS_KEY] = budgets(max_evals=int(req.budget_value))
    else:  # the fast placers take no budget
        res[BUDGETS_KEY] = {}
    return res


def _budget(args) -> float | None:
    """The request's ``budget``: ``--max-evals`` (sa, lns, gdp*: simulator calls) or ``--timeout``
    (exact: CP-SAT wall-clock seconds); the old ``--budget`` means either, by ``--algo``."""
    evals = ", ".join(CALL_BUDGET_MIN)
    if args.algo != "exact" and args.timeout is not None:
        raise ValueError(f"--timeout applies to --algo exact (CP-SAT seconds); --algo {args.algo} "
                         + ("counts --max-evals simulator calls" if args.algo in CALL_BUDGET_MIN
                            else "takes no budget"))
    if args.algo not in CALL_BUDGET_MIN and args.max_evals is not None:
        raise ValueError(f"--max-evals applies to --algo {evals}; --algo {args.algo} "
                         + ("takes --timeout SEC" if args.algo == "exact" else "takes no budget"))
    if args.budget is not None:
        note("--budget", "--timeout" if args.algo == "exact" else "--max-evals")
        if args.timeout is not None or args.max_evals is not None:
            raise ValueError("give --max-evals or --timeout, not also the old --budget")
        return args.budget
    return args.timeout if args.algo == "exact" else args.max_evals


def print_place_ops(res: dict[str, Any]) -> None:
    print(f"{res['model']} ({res['nodes']} ops) on {res['devices']} x {res['machine']} [{res['algo']}, "
          f"{res['wall_s']:.1f} s]")
    state = "valid" if res["valid"] else f"INVALID: {res['reason']}"
    sp = res["speedup_over_single"]
    print(f"  step time    {res['step_time_s'] * 1e3:.2f} ms ({state})"
          + (f"; {sp:.2f}x one GPU's {res['single_device_step_time_s'] * 1e3:.2f} ms" if sp else ""))
    if "solver_status" in res:
        print(f"  CP-SAT       {res['solver_status']}, gap {res['gap']:.1%}, lower bound "
              f"{res['lower_bound_s'] * 1e3:.2f} ms")
    if "answer_source" in res:
        def ms(t: float, ok: bool) -> str:
            return f"{t * 1e3:.2f} ms" + ("" if ok else " (invalid)")

        warm = ms(res["warm_start_step_time_s"], res["warm_start_valid"])
        print(f"  GDP          warm start {res['warm_start_algo']} {warm}, cloned in {res['bc_steps']} steps "
              f"(greedy agreement {res['bc_agreement']:.1%}); {res['samples']} PPO samples in "
              f"{res['ppo_iterations']} iterations; {res['simulator_calls']} of {res['budget_calls']} "
              "simulator calls")
        print(f"  candidates   greedy {ms(res['greedy_step_time_s'], res['greedy_valid'])}, best sample "
              f"{ms(res['best_sample_step_time_s'], res['best_sample_valid'])}, warm start {warm}: the "
              f"answer is the {res['answer_source'].replace('_', ' ')}")
    elif "ppo_iterations" in res:
        g = res["greedy_policy_step_time_s"]
        print(f"  GDP          {res['mode']}: {res['samples']} placements in {res['ppo_iterations']} PPO "
              f"iterations; the result is the {res['result_is']}; the greedy policy's placement: "
              f"{g * 1e3:.2f} ms{'' if res['greedy_policy_valid'] else ' (invalid)'}")
    if "start_algo" in res:
        sp = res["speedup_over_start"]
        print(f"  search       from {res['start_algo']} ({res['start_step_time_s'] * 1e3:.2f} ms"
              f"{'' if res['start_valid'] else ', invalid'}): "
              + (f"{sp:.3f}x faster" if sp else "no speed-up")
              + f"; {res['simulator_calls']} of {res['budget_calls']} simulator calls, "
                f"{res['accepted_moves']} moves accepted in {res['search_steps']} steps")
    if res.get("op_model"):
        om = res["op_model"]
        print(f"  op model     {om['op_model']}, {om['dtype']}: {om['note']}")
    mem = ", ".join(fmt_bytes(b) for b in res["peak_memory_bytes"])
    print(f"  peak memory  {mem} (of {fmt_bytes(res['memory_bytes'])} each)")
    busy = ", ".join(f"{b * 1e3:.1f}" for b in res["compute_busy_s"])
    print(f"  busy (ms)    {busy}; transfers {fmt_bytes(res['transfer_bytes'])}")


def add_place_ops_parser(sub) -> None:
    po = sub.add_parser("place-ops", help="place every operator of a training step on the GPUs of a machine "
                                          "(GDP)")
    po.add_argument("model", help="GDP preset: rnnlm-2|4|8, gnmt-2|4|8, txl-2|4|8, inception-v3, "
                                  "wavenet-2x18, wavenet-4x36, ...")
    add_devices(po, "GPUs (default: the preset's, as in GDP's Table 1)",
                type=count("GPUs", high=64, why=" (a GDP machine)"))
    po.add_argument("--algo", choices=api.PLACE_OPS_ALGOS, default="m-etf",
                    help="gdp: the best fast placer cloned into the GDP policy, then PPO; the answer is the "
                         "fastest of the policy's greedy placement, its best sample and that warm start, and "
                         "says which (answer_source)")
    po.add_argument("--gpu", type=gpu_choice(MACHINES), default="p100-pcie", metavar="NAME|FILE",
                    help="p100-pcie (default) and v100-nvlink are GDP's machines (P100s on PCIe, V100s on "
                         "NVLink, as the paper timed them); any other GPU preset ("
                         + ", ".join(n for n in MACHINES if n not in ("p100-pcie", "v100-nvlink"))
                         + ") or a GPU's .json file is --devices of it on NVLink")
    renamed(po, "--machine", "--gpu", "gpu", type=gpu_choice(MACHINES))
    refuse(po, ("--arch",), "place-ops places operators on GPUs: it takes --gpu NAME; accelerator "
                            "templates are placed by place and estimate --arch")
    add_op_model_args(po, "fp32 (GDP's TensorFlow graphs)")
    po.add_argument("--batch", type=int, default=None)
    po.add_argument("--max-evals", type=count("simulator calls", high=MAX_BUDGET_CALLS), default=None,
                    metavar="N",
                    help="sa, lns: simulator calls, the 5 fast placers' start evaluations included "
                         "(default 2000); gdp: simulator calls, the 5 fast placers of its warm start, every "
                         "PPO sample and the greedy placement's evaluation included (default 2000, at "
                         "least 6); gdp-pretrained: simulator calls, the PPO samples and the greedy "
                         "evaluation (default 2000). Wall time bounds gdp* only as an outer safety limit "
                         "(1 h of PPO)")
    po.add_argument("--timeout", type=positive(float, "seconds"), default=None, metavar="SEC",
                    help="exact: the CP-SAT solve's wall-clock limit in seconds (default 30); the answer "
                         "can depend on the machine's load")
    po.add_argument("--budget", type=float, default=None, help=argparse.SUPPRESS)  # old: either, by --algo
    po.add_argument("--pretrained", default=None, help="gdp-pretrained: policy weights (.npz)")
    po.add_argument("--zero-shot", action="store_true",
                    help="gdp-pretrained: the pre-trained policy's placement, no updates")
    po.add_argument("--address", help="gdp: attach to a running Ray cluster: auto or HOST:PORT "
                                      "(default: an embedded local Ray)")
    po.add_argument("--seed", type=int, default=0)
    po.add_argument("--json", action="store_true")
