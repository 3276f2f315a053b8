"""An autotuning loop outside archplace, driving a study on the archplace service (ask/tell).

The service suggests architectures (the study's searcher, Phaze by default) and stores what the
tuner reports; the tuner decides how a suggestion is measured. Two ways:

* own evaluator (default): the tuner scores each suggested architecture with its own cost function
  (here a made-up analytical one, ``my_cost_model``) and reports the score, or reports the trial
  INFEASIBLE with a reason when its own rule says the architecture cannot work;
* ``--managed``: the tuner asks the service to evaluate each suggestion (``POST /v1/evaluations``:
  placement and throughput of the model on ``--devices`` copies of the suggested architecture,
  the same computation as ``archplace place``), waits for the operations and reports the
  throughput, or INFEASIBLE with the placement's reason, or FAILED with the operation's error.

Start a service and make a token first, e.g.::

    archplace serve token create alice --db ~/archplace-service.db
    archplace serve --db ~/archplace-service.db &
    python examples/external_tuner.py --url http://127.0.0.1:8000 --token TOKEN --trials 6
    python examples/external_tuner.py --url http://127.0.0.1:8000 --token TOKEN --managed --trials 4

The study is created if it does not exist (the same command run again continues it: a study that
already has ``--trials`` trials suggests nothing more). ``--study`` names it.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from archplace.client import Client, ServiceError

ARCH_FIELDS = ("num_tc", "num_vc", "pe_x", "pe_y", "pe_vc", "glb_mb")


def my_cost_model(params: dict[str, Any]) -> tuple[float | None, str | None]:
    """A made-up analytical model: multiply-accumulates per cycle, discounted when the global buffer
    is too small to keep the cores fed, per mm² of die. Returns (score, None), or (None, reason) when
    the architecture is infeasible under this model's own rule."""
    if params["glb_mb"] < 4:
        return None, f"global buffer of {params['glb_mb']:g} MB holds no layer's working set (< 4 MB)"
    macs = params["num_tc"] * params["pe_x"] * params["pe_y"] + params["num_vc"] * params["pe_vc"]
    fed = min(1.0, params["glb_mb"] / 32.0)
    return macs * (0.3 + 0.7 * fed) / params["area_mm2"], None


def arch_of(trial: dict[str, Any]) -> dict[str, Any]:
    """The six architecture fields of a suggested trial, as ``evaluate`` takes them."""
    return {f: trial["params"][f] for f in ARCH_FIELDS}


def own_loop(c: Client, study: str, client_id: str, batch: int) -> None:
    while True:
        resp = c.suggest_response(study, count=batch, client_id=client_id)
        if not resp["trials"]:
            print(f"the study suggests nothing more: {resp.get('done_reason')}")
            return
        for t in resp["trials"]:
            score, reason = my_cost_model(t["params"])
            if score is None:
                c.complete(study, t["number"], infeasible=True, reason=reason)
                print(f"trial {t['number']:3d} {t['params']['label']:<34s} infeasible: {reason}")
            else:
                c.complete(study, t["number"], value=score)
                print(f"trial {t['number']:3d} {t['params']['label']:<34s} score {score:10.3f}")


def managed_loop(c: Client, study: str, client_id: str, batch: int, model: str, accelerators: int,
                 global_batch: int, timeout_s: float) -> None:
    while True:
        resp = c.suggest_response(study, count=batch, client_id=client_id)
        if not resp["trials"]:
            print(f"the study suggests nothing more: {resp.get('done_reason')}")
            return
        # submit the whole batch, then wait: the service runs the evaluations in parallel
        ops = [(t, c.evaluate(model, arch=arch_of(t), wait=False, accelerators=accelerators,
                              global_batch=global_batch, sequential=True))
               for t in resp["trials"]]
        for t, op in ops:
            op = op if op["done"] else c.wait(op["id"], timeout_s=timeout_s)
            label = t["params"]["label"]
            if op["state"] != "DONE":
                reason = f"evaluation {op['state'].lower()}: {op.get('error') or 'no detail'}"
                c.complete(study, t["number"], failed=True, reason=reason[:2000])
                print(f"trial {t['number']:3d} {label:<34s} failed: {reason}")
                continue
            result = op["result"]
            placement = result["placement"]
            if placement["feasible"]:
                c.complete(study, t["number"], value=result["throughput"])
                print(f"trial {t['number']:3d} {label:<34s} {result['throughput']:10.1f} samples/s "
                      f"(p={placement['p']} d={placement['d']} t={placement['t']}, "
                      f"{'cached' if op['cached'] else 'evaluated'})")
            else:
                reason = placement.get("reason") or "no feasible placement"
                c.complete(study, t["number"], infeasible=True, reason=reason[:2000])
                print(f"trial {t['number']:3d} {label:<34s} infeasible: {reason}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--token", default=os.environ.get("ARCHPLACE_TOKEN"),
                    help="bearer token (default: $ARCHPLACE_TOKEN)")
    ap.add_argument("--managed", action="store_true", help="let the service evaluate each suggestion")
    ap.add_argument("--trials", type=int, default=8, help="the study's max_trials")
    ap.add_argument("--batch", type=int, default=2, help="trials asked for at once")
    ap.add_argument("--study", default=None, help="default: tuner-own or tuner-managed")
    ap.add_argument("--searcher", default="phaze", choices=["phaze", "optuna", "random", "grid"])
    ap.add_argument("--model", default="bert-base")
    ap.add_argument("--devices", "--accelerators", dest="accelerators", type=int, default=64,
                    help="accelerators per placement (the service field accelerators)")
    ap.add_argument("--global-batch", type=int, default=256)
    ap.add_argument("--client-id", default="external-tuner",
                    help="the same id again gets its unfinished trials back (a resumed run)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds to wait for one evaluation")
    args = ap.parse_args(argv)

    c = Client(args.url, args.token)
    study = args.study or ("tuner-managed" if args.managed else "tuner-own")
    # the objective is what the tuner reports: the service's throughput, or this tuner's own score
    objective = "throughput" if args.managed else "score"
    try:
        s = c.create_study(name=study, models=[args.model], max_trials=args.trials, searcher=args.searcher,
                           objectives=[{"name": objective, "goal": "maximize"}],
                           accelerators=args.accelerators, global_batch=args.global_batch)
    except ServiceError as e:
        print(f"cannot create study {study!r}: {e.message}", file=sys.stderr)
        return 1
    print(f"study {s['resource']}: searcher {s['config']['searcher']}, {s['space_size']:,} architectures, "
          f"{s['trials']} trials so far, at most {args.trials}")
    if args.managed:
        managed_loop(c, study, args.client_id, args.batch, args.model, args.accelerators, args.global_batch,
                     args.timeout)
    else:
        own_loop(c, study, args.client_id, args.batch)
    try:
        best = c.best(study)
    except ServiceError as e:
        print(f"no best trial: {e.message}")
        return 0
    print(f"best: trial {best['number']} {best['params']['label']} {objective} {best['value']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
