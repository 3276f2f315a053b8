"""``archplace`` ``partition``: a model over the chiplets of a multi-chip module.

Each ``cmd_*`` turns argv into a request and returns the result's ``to_dict()`` (the ``--json`` output);
each ``print_*`` writes the human summary; each ``add_*_parser`` declares the flags."""

from __future__ import annotations

from typing import Any

from archplace import api
from archplace.cli import status
from archplace.cli.common import connect_if_needed
from archplace.cli.vocabulary import BUDGETS_KEY, add_devices, budgets, count, refuse, renamed


def cmd_partition(args) -> dict[str, Any]:
    req = api.PartitionRequest(args.model, chiplets=args.devices, algo=args.algo, budget=args.max_evals,
                               seed=args.seed, seq=args.seq, mbs=args.mbs, pretrained=args.pretrained,
                               zero_shot=args.zero_shot, env_runners=args.env_runners,
                               learners=args.learners, config=args.config, polish=args.polish,
                               polish_subsolves=args.polish_subsolves)
    connect_if_needed(req, args.address)
    res = api.partition(req, progress=status.stages({
        "graph": lambda i: f"partitioning {i.get('nodes')} nodes: greedy first",
        "greedy": f"searching ({args.algo})" if args.algo != "greedy" else None,
        "search": "polishing" if args.polish else None})).to_dict()
    res[BUDGETS_KEY] = budgets(max_evals=None if args.algo in ("greedy", "ppo-lns") else args.max_evals,
                               polish_s=args.polish or None, polish_subsolves=args.polish_subsolves)
    return res


def exit_status(res: dict[str, Any]) -> int:
    """The command's exit status: 0 with a partition that fits, 1 without one (``status`` "infeasible":
    the memory bound rules every partition out; "invalid": the search found none), as opposed to 2 for
    bad input."""
    return 0 if res.get("valid") else 1


def print_partition(res: dict[str, Any]) -> None:
    imp = res["improvement"]
    print(f"{res['model']} ({res['nodes']} nodes) on {res['chiplets']} chiplets [{res['algo']}, "
          f"{res['samples']} samples, {res['wall_s']:.1f} s]")
    if res.get("status") == "infeasible":
        print(f"  INFEASIBLE   {res['reason']}")
        return
    if not res["valid"]:
        print(f"  INVALID      {res['reason']}")
    print(f"  throughput   {res['throughput']:.2f} /s  ({imp:.3f}× the greedy heuristic's "
          f"{res['greedy_throughput']:.2f} /s)" if imp else f"  throughput   {res['throughput']:.2f} /s")
    lat = res["chip_latency_s"][:res["chips_used"]]
    print(f"  chips used   {res['chips_used']}; slowest chip {max(lat) * 1e3:.3f} ms, "
          f"mean {sum(lat) / len(lat) * 1e3:.3f} ms")
    if "repair_stages" in res:
        print(f"  repairs      {res['repairs']}: by stage {res['repair_stages']}; the chain fallback on "
              f"{res['repair_chain_share']:.1%}")
    print(f"  greedy       repaired in stage {res['greedy_repair_stage'] or 'none (already valid)'}, "
          f"{res['greedy_repair_changed']} nodes changed")
    if "lns_subsolves" in res and "lns_gap" not in res:
        print(f"  ppo-lns      {res['lns_subsolves']} CP-SAT sub-solves chosen by PPO ({res['mode']}, "
              f"{res['ppo_iterations']} iterations) in {res['lns_wall_s']:.1f} s: "
              f"{res['sampler_throughput']:.2f} -> {res['throughput']:.2f} /s")
    elif "lns_subsolves" in res:
        gap = f"; at most {res['lns_gap']:.1%} from the optimum" if res["lns_stopped"] != "optimal" else \
            "; proven optimal"
        print(f"  polish       {res['lns_subsolves']} CP-SAT sub-solves in {res['lns_wall_s']:.1f} s, "
              f"{res['lns_improved']} improvements: {res['sampler_throughput']:.2f} -> "
              f"{res['throughput']:.2f} /s (stopped: {res['lns_stopped']}{gap})")


def add_partition_parser(sub) -> None:
    pa = sub.add_parser("partition", help="partition a model over the chiplets of a multi-chip module")
    pa.add_argument("model", help="preset name, dnn-partitioning .json or archplace .parquet")
    add_devices(pa, "chiplets of the multi-chip module (default 36)", default=36, old=("--chiplets",),
                type=count("chiplets", high=64))
    refuse(pa, ("--arch", "--gpu"), "partition's hardware is the multi-chip module's chiplets: it takes "
                                    "--devices N (chiplets), no --arch or --gpu")
    pa.add_argument("--algo", choices=api.PARTITION_ALGOS, default="sa")
    pa.add_argument("--max-evals", type=count("evaluated partitions", high=10**9), default=200, metavar="N",
                    help="samples: evaluated partitions (default 200)")
    renamed(pa, "--budget", "--max-evals", "max_evals", type=count("evaluated partitions", high=10**9))
    pa.add_argument("--polish", type=float, default=0.0, metavar="SECONDS",
                    help="then CP-SAT large-neighbourhood search on the best partition for SECONDS "
                         "(ppo-lns: the seconds of its learned search)")
    pa.add_argument("--polish-subsolves", type=int, default=None, metavar="N",
                    help="deterministic polish: N CP-SAT sub-solves of fixed deterministic time each (same "
                         "answer under any load; --polish SECONDS is then only the outer safety limit)")
    pa.add_argument("--pretrained", default=None,
                    help="ppo / ppo-lns: start from these pre-trained weights (.npz from "
                         "bench/mcm/mcm_pretrain.py / bench/mcm/mcm_lns_pretrain.py)")
    pa.add_argument("--zero-shot", action="store_true", help="ppo: sample the pre-trained policy, no updates")
    pa.add_argument("--seq", type=int, default=None)
    pa.add_argument("--mbs", type=int, default=1)
    pa.add_argument("--seed", type=int, default=0)
    pa.add_argument("--address", help="ppo: attach to a running Ray cluster: auto or HOST:PORT "
                                      "(default: an embedded local Ray)")
    pa.add_argument("--env-runners", type=int, default=0,
                    help="ppo: remote env runner actors that sample (default 0: in this process)")
    pa.add_argument("--learners", type=int, default=0,
                    help="ppo: remote learner actors (default 0: in this process)")
    pa.add_argument("--config", default=None,
                    help="ppo: YAML overriding mcm_ppo.yaml keys (tune-rl mcm writes best_config.yaml)")
    pa.add_argument("--json", action="store_true")
