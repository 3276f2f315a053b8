"""Does the untrained GDP policy see the graph? (issue 31, deliverable 1)

    python bench/gdp/gdp_policy_probe.py [--graphs txl-2,rnnlm-2,inception-v3] [--seeds 0,1,2] [--out FILE]

For each graph and seed, a freshly initialised :class:`GDPPolicy` (default config, or ``--policy JSON``
overrides, e.g. ``'{"sage_norm": "l2", "skip": false}'`` for the paper's GraphSAGE;
``torch.manual_seed(seed)``) is run once on the graph as the GDP env presents it (``bench/gdp/gdp.py``
``build``: nodes in topological order, ``node_features``). Reported per GraphSAGE layer (the tensors of
:meth:`GDPPolicy.embed_layers`):

* ``rel_spread``: RMS distance of the node embeddings to their centroid over their RMS norm (scale free:
  0 = every node has the same embedding; the L2-normalised layers have norm 1, so there it is the
  plain RMS distance);
* ``cos_to_mean``: mean over nodes of the cosine between the node's embedding and the centroid (1 = collapse).

the same two for the placer's output (``placer_out``: the final LayerNorm's output, the head's input),

and of the placer output: ``logit_std`` (std across nodes of the centred logits of the graph's devices,
mean over devices), ``tv``: mean pairwise total-variation distance between node softmaxes (1,000 random
pairs), and the greedy (argmax) placement's ``busiest_gpu_share`` of the summed op compute time (1.0 = a
single GPU) and GPUs used. No training, no simulator calls beyond one per greedy placement.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _meta
from _meta import command, git_state, machine  # noqa: E402


def layer_stats(h) -> dict:
    import torch

    h = h.double()
    mu = h.mean(0)
    rms_norm = float(h.norm(dim=1).pow(2).mean().sqrt())
    rms_dist = float((h - mu).norm(dim=1).pow(2).mean().sqrt())
    cos = torch.nn.functional.cosine_similarity(h, mu[None], dim=1)
    return {"rel_spread": rms_dist / max(rms_norm, 1e-12), "cos_to_mean": float(cos.mean())}


def diversity(logits, d: int, seed: int = 0) -> dict:
    """``logits [N, >=d]`` of one graph: std across nodes of centred logits, and mean pairwise TV distance."""
    import torch

    lg = logits[:, :d].double()
    centred = lg - lg.mean(1, keepdim=True)
    p = lg.softmax(-1)
    g = torch.Generator().manual_seed(seed)
    n = p.shape[0]
    i = torch.randint(0, n, (1000,), generator=g)
    j = torch.randint(0, n, (1000,), generator=g)
    tv = 0.5 * (p[i] - p[j]).abs().sum(-1)
    return {"logit_std": float(centred.std(0).mean()), "tv": float(tv.mean())}


def probe(gg, seed: int, policy: dict | None = None) -> dict:
    import torch

    from archplace.algorithms.rl.gdp_policy import GDPPolicy, GDPPolicyConfig
    from archplace.simulators.gpu_placement import simulate

    torch.manual_seed(seed)
    pol = GDPPolicy(gg.features.shape[1], GDPPolicyConfig(**(policy or {}))).eval()
    x = torch.as_tensor(gg.features)
    ei = torch.as_tensor(gg.edge_index)
    d = gg.problem.num_devices
    seen = []
    hook = pol.ln_out.register_forward_hook(lambda m, i, o: seen.append(o[0]))
    with torch.no_grad():
        layers = pol.embed_layers(x, ei)
        logits = pol(x, ei, d)
    hook.remove()
    place = gg.placement_of(logits.argmax(-1).numpy())
    busy = np.bincount(place, weights=np.asarray(gg.problem.compute_s, float), minlength=d)
    r = simulate(gg.problem, place)
    return {"layers": [layer_stats(h) for h in layers], "placer_out": layer_stats(seen[0]),
            **diversity(logits, d, seed),
            "busiest_gpu_share": float(busy.max() / busy.sum()), "gpus_used": int(len(np.unique(place))),
            "greedy_step_time_s": r.step_time_s, "greedy_valid": r.valid}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--graphs", default="txl-2,rnnlm-2,inception-v3")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--machine", default="p100-pcie")
    ap.add_argument("--policy", default="{}", help="GDPPolicyConfig overrides, JSON")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    load = os.getloadavg()
    import torch

    torch.set_num_threads(1)
    from gdp import build

    rows = []
    for name in args.graphs.split(","):
        gg = build(name, args.machine)[2]
        for s in (int(v) for v in args.seeds.split(",")):
            r = {"graph": name, "seed": s, "nodes": gg.problem.num_nodes,
                 **probe(gg, s, json.loads(args.policy))}
            rows.append(r)
            stats = [*r["layers"], r["placer_out"]]
            print(f"{name:13s} seed {s}: spread/cos per layer, placer out "
                  + " | ".join(f"{lr['rel_spread']:.3f} {lr['cos_to_mean']:.4f}" for lr in stats)
                  + f" || logit std {r['logit_std']:.3f} tv {r['tv']:.3f}"
                  f" busiest {r['busiest_gpu_share']:.3f} gpus {r['gpus_used']}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({**git_state(), "command": command(), "machine": machine(load),
                                              "policy": json.loads(args.policy), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
