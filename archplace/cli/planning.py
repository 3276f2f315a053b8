"""``archplace`` ``plan``: the fastest way to train a model on N GPUs (tensor, pipeline, data and context
parallel sizes, micro-batch, recomputation, sequence parallelism, ZeRO stage, attention), its memory per
GPU and price, and the configuration to launch it (``--export megatron|torchtitan|deepspeed``).

Each ``cmd_*`` turns argv into a request and returns the result's ``to_dict()`` (the ``--json`` output);
each ``print_*`` writes the human summary; each ``add_*_parser`` declares the flags."""

from __future__ import annotations

import argparse
from typing import Any

from archplace.api.planning import GRAD_DTYPES, OP_MODELS, PlanRequest, instances, parse_fixed, plan
from archplace.cli import status
from archplace.cli.common import add_model_args, connect_if_needed, fmt_bytes, model_ref
from archplace.cli.vocabulary import BUDGETS_KEY, budgets, count, gpu_choice, gpu_help, refuse
from archplace.hardware.gpus import GPUS

EXPORTS = ("megatron", "torchtitan", "deepspeed")


def cmd_plan(args) -> dict[str, Any]:
    if args.export and not args.out:
        raise ValueError("--export needs --out DIR (the folder the launch files are written to)")
    if args.out and not args.export:
        raise ValueError("--out applies to --export; give --export megatron|torchtitan|deepspeed")
    req = PlanRequest(model_ref(args), gpus=args.devices, global_batch=args.global_batch, gpu=args.gpu,
                      gpus_per_node=args.gpus_per_node, network=args.network, instance=args.instance,
                      seq=args.seq, optimizer=args.optimizer, grad_reduce_dtype=args.grad_reduce_dtype,
                      fixed=parse_fixed(args.fixed) or None, top_k=args.top, max_mbs=args.max_mbs,
                      op_model=args.op_model, overlap=not args.no_overlap, ray_tasks=args.address is not None,
                      memory_headroom=args.memory_headroom)
    connect_if_needed(req, None if args.address == "local" else args.address)
    status.phase(f"planning {req.model} on {args.devices} GPUs")
    res = plan(req).to_dict()
    res[BUDGETS_KEY] = budgets()   # exhaustive: every configuration is priced or bounded
    if args.export:
        from archplace.api.plan_export import export_plan, write_export

        if res["best"] is None:
            raise ValueError(f"nothing to export: {res['reason']}")
        files = export_plan(res["best"], res["model"], fmt=args.export, gpus=res["gpus"],
                            gpus_per_node=res["gpus_per_node"], optimizer=res["optimizer"],
                            grad_reduce_dtype=res["grad_reduce_dtype"])
        res["exported"] = {"format": args.export, "files": write_export(files, args.out)}
    return res


def _knobs(c: dict[str, Any]) -> str:
    sp = " sp" if c["sequence_parallel"] else ""
    return (f"tp {c['tp']:>2} pp {c['pp']:>3} dp {c['dp']:>4} cp {c['cp']} v {c['vp']} mbs {c['mbs']:>2} "
            f"{c['recompute']:<9}{sp:<3} zero {c['zero']} {c['attention']:<5}")


def print_plan(res: dict[str, Any]) -> None:
    m = res["model"]
    net = res["network"]
    print(f"{m['name']} ({m['layers']} layers, hidden {m['hidden']}) on {res['gpus']} x "
          f"{res['gpu']['label']}, "
          f"{res['gpus_per_node']} per node, {net['bytes_per_s_per_gpu'] * 8 / 1e9:.0f} Gb/s per GPU across "
          f"nodes{' (' + net['name'] + ')' if net['name'] else ''}; global batch {res['global_batch']} x "
          f"seq {res['seq']}, {res['optimizer']}, op model {res['op_model']}")
    print(f"  {res['evaluated']:,} configurations priced ({res['splits_priced']:,} layer splits), "
          f"{res['pruned']['memory']:,} skipped by the memory bound, {res['pruned']['time']:,} by the time "
          "bound, "
          f"{res['invalid']:,} invalid; {res['timed']} layer timings [{res['wall_s']:.1f} s]")
    if not res["fits"]:
        print(f"  nothing fits: {res['reason']}")
        return
    price = "  $/Mtok" if res["price"] else ""
    print(f"  {'configuration':<72}  step s   tok/s/GPU   MFU   GiB/GPU{price}")
    for c in res["top"]:
        cost = f"  {c['usd_per_million_tokens']:6.2f}" if "usd_per_million_tokens" in c else ""
        print(f"  {_knobs(c):<72} {c['step_time_s']:7.2f} {c['tokens_per_s'] / res['gpus']:10,.0f} "
              f"{c['mfu']:6.1%} {c['memory_per_gpu_bytes'] / 1024 ** 3:8.1f}{cost}")
    b = res["best"]
    t, mem = b["time"], b["memory"]
    print(f"  best: layers per stage {_stages(b['layers_per_stage'])}, {b['microbatches']} micro-batch"
          f"{'es' if b['microbatches'] > 1 else ''} per pipeline; pipeline {t['pipeline_s']:.2f} s (bubble "
          f"{t['bubble_s']:.2f}), gradient sync "
          f"{t['dp_sync_s']:.2f} s, optimizer {t['optimizer_s']:.3f} s; memory "
          f"{fmt_bytes(mem['total_bytes'])} on stage {mem['stage']} (weights "
          f"{fmt_bytes(mem['weight_bytes'])},"
          f" activations {fmt_bytes(mem['activation_bytes'])})")
    for note in b.get("unvalidated", []):
        print(f"  note: {note}")
    if res["price"]:
        p = res["price"]
        print(f"  price: ${b['usd_per_hour']:,.0f}/h at ${p['usd_per_gpu_hour']:.2f}/GPU-h ({p['basis']}; "
              f"{p['provider']} {p['region']}, {p['date']})")
    if res.get("exported"):
        print(f"  {res['exported']['format']} launch files: {', '.join(res['exported']['files'])}")


def _stages(n: list[int]) -> str:
    if len(set(n)) == 1:
        return f"{n[0]} x {len(n)}"
    if len(n) == 2:
        return f"{n[0]}, {n[1]}"
    return f"{n[0]}, {n[1]} x {len(n) - 2}, {n[-1]}"


def add_plan_parser(sub) -> None:
    p = sub.add_parser("plan", help="the fastest tensor/pipeline/data/context-parallel configuration to "
                                    "train a model on N GPUs, its memory, price and launch files",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", help="model preset (gpt3-175b, llama2-7b, ...) or --hf-config")
    add_model_args(p)
    p.add_argument("--gpu", type=gpu_choice(GPUS), default=None, metavar="NAME|FILE",
                   help=gpu_help(GPUS, "; default: the --instance's"))
    p.add_argument("--devices", "--gpus", dest="devices", type=count("GPUs"), required=True, metavar="N",
                   help="GPUs to train on (--gpus is the same flag)")
    p.add_argument("--gpus-per-node", type=count("GPUs per node", high=64), default=None, metavar="N",
                   help="GPUs per server on NVLink (default: the instance's, else 8)")
    p.add_argument("--network", default=None, metavar="NAME",
                   help="the servers' network class (eth-25g, efa-100g, ib-hdr-200g, efa-400g, efa-3200g; "
                        "default: the instance's, else one NIC per GPU as the GPU preset's DGX has)")
    p.add_argument("--instance", default=None, metavar="NAME", choices=sorted(instances()),
                   help=f"cloud instance type ({', '.join(sorted(instances()))}): its GPU, node, network and "
                        "price")
    p.add_argument("--global-batch", type=count("sequences"), required=True, metavar="B",
                   help="sequences per optimizer step")
    p.add_argument("--seq", type=count("tokens"), default=None, metavar="S",
                   help="tokens per sequence (default: the model's positions)")
    p.add_argument("--optimizer", choices=("adam", "sgd", "adafactor"), default="adam")
    p.add_argument("--grad-reduce-dtype", choices=GRAD_DTYPES, default="bf16",
                   help="the gradients' dtype: their memory and the data-parallel sync's bytes "
                        "(default bf16)")
    p.add_argument("--fixed", default=None, metavar="KNOB=V,...",
                   help="hold knobs at a value, search the rest: tp, pp, dp, cp, vp, mbs, recompute "
                        "(none|selective|full), sequence_parallel (true|false), zero (0|1|2|3), attention "
                        "(sdpa|eager); e.g. tp=8,pp=16")
    p.add_argument("--top", type=count("configurations", high=100), default=5, metavar="K",
                   help="configurations listed (default 5)")
    p.add_argument("--max-mbs", type=count("sequences", high=1024), default=8, metavar="B",
                   help="the largest micro-batch tried, powers of two (default 8)")
    p.add_argument("--op-model", choices=OP_MODELS, default="calibrated",
                   help="op times: calibrated (default, H200 micro-benchmarks scaled to the GPU) or roofline")
    p.add_argument("--memory-headroom", type=float, default=0.1, metavar="FRACTION",
                   help="fraction of each GPU's memory kept free for the CUDA context, NCCL buffers and the "
                        "allocator's fragmentation, which the memory model does not count (default 0.1)")
    p.add_argument("--no-overlap", action="store_true",
                   help="every collective on the critical path (default: backward tensor-parallel "
                        "all-reduces and data-parallel collectives overlap compute, as Megatron-LM and FSDP "
                        "run them)")
    p.add_argument("--export", choices=EXPORTS, default=None,
                   help="write the best configuration's launch files for this framework to --out")
    p.add_argument("--out", default=None, metavar="DIR", help="--export: the folder for the launch files")
    p.add_argument("--address", default=None, metavar="HOST:PORT|auto|local",
                   help="run the enumeration in Ray tasks, one per (tp, pp) slice, on this cluster ('local': "
                        "an embedded Ray); the answer is the same")
    p.add_argument("--json", action="store_true")
    refuse(p, ("--arch",), "plan trains on GPUs: it takes --gpu NAME or --instance NAME")
