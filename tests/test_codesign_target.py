"""``archplace search --target``: the dispatch to the co-design targets, and ``--target gpu-cluster`` end to
end through the CLI and the API (issue 32 item 2; the core pieces are ``hardware/gpu_cluster_space.py``,
``hardware/cluster_prices.py`` and ``platform/gpu_cluster_trial.py``)."""

import json

import pyarrow.parquet as pq
import pytest

from archplace import api
from archplace.cli import main
from archplace.hardware.gpu_cluster_space import shape_from_config
from archplace.platform.gpu_cluster_trial import evaluate_cluster

TWO = ("cluster: {gpu: [a100-40gb], gpus_per_server: [8], num_servers: [2], intra_class: [pcie, nvlink], "
       "inter_class: [efa-400g]}\n")


def test_target_checks_name_the_field():
    with pytest.raises(ValueError, match="target must be one of"):
        api.SearchRequest(models=("bert-large",), target="tpu-pod").validate()
    with pytest.raises(ValueError, match="placer"):
        api.SearchRequest(models=("bert-large",), target="gpu-cluster", placer="cpsat").validate()
    with pytest.raises(ValueError, match="global_batch applies to --target accelerator, not gpu-cluster"):
        api.SearchRequest(models=("bert-large",), target="gpu-cluster", global_batch=8).validate()


@pytest.mark.slow   # about 35 s on the shared 2-core machine (two trial workers each build the profile)
def test_gpu_cluster_search_end_to_end(ray_session, tmp_path, capsys):
    """Two shapes with the same GPUs, count, network and price (the intra-server class is not priced);
    one has NVLink inside the servers, where each stage all-reduces: it is strictly faster at the same
    price, so it is the best design and the whole Pareto front; best.json's plan is the trial's
    (evaluate_cluster's) plan."""
    space = tmp_path / "two.yaml"
    space.write_text(TWO)
    out = tmp_path / "o"
    assert main(["search", "--target", "gpu-cluster", "bert-large", "--space", str(space), "--searcher",
                 "grid", "--budget", "2", "--out", str(out), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["target"] == "gpu-cluster" and res["evaluated"] == 2 and res["failed"] == 0
    fast = {"gpu": "a100-40gb", "gpus_per_server": 8, "num_servers": 2, "intra_class": "nvlink",
            "inter_class": "efa-400g"}
    want = evaluate_cluster(shape_from_config(fast), ["bert-large"])
    c = res["common"]
    assert c["hardware"]["intra_class"] == "nvlink"
    assert c["cost_usd"] == pytest.approx(want["price_per_hour_usd"], rel=1e-12)
    p = c["per_model"]["bert-large"]
    assert p["iteration_time_s"] == want["bert-large.iteration_time_s"]
    assert p["throughput"] == want["bert-large.throughput_samples_per_s"]
    assert p["plan"]["cuts"] == want["bert-large.cuts"] and p["plan"]["devices"] == want["bert-large.devices"]
    assert [d["arch_key"] for d in res["pareto"]] == [shape_from_config(fast).name]
    rows = pq.read_table(out / "evaluations.parquet").to_pylist()
    slow = next(r for r in rows if "pcie" in r["arch_key"])
    assert slow["price_per_hour_usd"] == pytest.approx(want["price_per_hour_usd"])
    assert 0 < slow["throughput"] < p["throughput"]
    assert "Pareto front" in (out / "report.md").read_text()
    # archplace report rebuilds the co-design report from the directory
    assert main(["report", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["report"].endswith("report.md")
    # resume with nothing left: no new trial, the same best
    again = api.search(api.SearchRequest(models=("bert-large",), target="gpu-cluster", out_dir=str(out),
                                         space=str(space), searcher="grid", budget=2, resume=True))
    assert again.stats["resumed"] == 2 and again.stats["new_trials"] == 0
    assert again.common["arch_key"] == c["arch_key"]
