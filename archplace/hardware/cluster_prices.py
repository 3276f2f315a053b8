"""What a GPU-cluster shape costs to rent, in US dollars per hour, from public on-demand list prices.

One provider, one region, one purchase option, so that GPUs are compared on the same footing: **Amazon
EC2, US East (N. Virginia) ``us-east-1``, Linux On-Demand**, the list prices AWS published on its
instance-type pages from the P5 launch (2023-07-26) until its P4/P5 price reduction of June 2025 (the
window in which all of these were listed at once; the date of each row says which page).

| GPU preset  | instance        | GPUs | USD/h    | USD/GPU-h | page (aws.amazon.com/ec2/instance-types/..) |
|-------------|-----------------|------|----------|-----------|----------------------------------------------|
| v100-sxm2   | p3dn.24xlarge   | 8    | 31.212   | 3.9015    | p3/  (8 x V100 SXM2 32 GB, 100 Gb/s)         |
| a100-40gb   | p4d.24xlarge    | 8    | 32.7726  | 4.0966    | p4/  (8 x A100 SXM 40 GB, 4 x 100 Gb/s EFA)  |
| a100-80gb   | p4de.24xlarge   | 8    | 40.9657  | 5.1207    | p4/  (8 x A100 SXM 80 GB, 4 x 100 Gb/s EFA)  |
| h100-sxm    | p5.48xlarge     | 8    | 98.32    | 12.29     | p5/  (8 x H100 SXM 80 GB, 3,200 Gb/s EFA)    |
| h200        | (p5e.48xlarge)  | 8    | 108.1445 | 13.5181   | derived, see below                           |

Corroboration in public copies read for this table: p5.48xlarge at $98.32/h (The Next Platform, "H100
GPU Instance Pricing On AWS: Grin And Bear It", 2023-07-27) and p4d.24xlarge at $32.77/h in US East
("as of Q2 2024", xither.com GPU compute cost comparison). The p3dn and p4de rows are the AWS pages'
figures as recorded here; they were not re-read from a live page (this repository's machines have no
web access), so check them against the AWS pages before quoting a dollar figure from a sweep.

**H200** had no on-demand listing in that window (the p5e was sold through EC2 Capacity Blocks). Its
price is derived from AWS's own relative pricing: the EC2 Capacity Blocks for ML pricing page (rates
valid until 2025-01-01, read in a public copy of that page) lists, in US East (Ohio), 8 x H100
(p5.48xlarge) at $39.33/h and 8 x H200 (the p5e.48xlarge) at $43.26/h; the H200 row is the p5.48xlarge
on-demand price times 43.26 / 39.33 (``price_basis`` says "derived").

**Per-GPU price and shapes no one lists.** The per-GPU rate is the 8-GPU instance's price / 8. A
shape of N GPUs costs N times that rate, whatever its GPUs per server, server count or link classes:

- linear in GPUs, because AWS prices the sizes of one family that way: p3.2xlarge (1 x V100 16 GB)
  $3.06/h, p3.8xlarge (4 GPUs) $12.24/h, p3.16xlarge (8 GPUs) $24.48/h on the same P3 page: exactly
  $3.06 per GPU-hour at every size;
- not dependent on the link classes, because no public on-demand list sells these GPUs with a slower or
  faster network at another price (an instance comes with the network it has). So in a sweep a
  slower-class shape costs what the faster one does and is dominated by it: the space measures what a
  slower fabric costs in *time*, which is what someone building a cluster wants to know.

``price_basis`` says for each shape whether it is a listed instance (8 GPUs per server on NVLink, the
layout of every row) or priced at the per-GPU rate, and from which row.
"""

from __future__ import annotations

from dataclasses import dataclass

from .gpu_cluster_space import CLUSTER_GPUS, ClusterShape


@dataclass(frozen=True)
class Listing:
    """One public on-demand price: ``usd_per_hour`` for an instance of ``gpus`` GPUs of preset ``gpu``."""

    gpu: str                 # GPU preset (hardware/gpus.py)
    provider: str
    instance_type: str
    region: str
    date: str                # when the price was listed (ISO dates; a range: from..to)
    gpus: int                # GPUs in the instance
    usd_per_hour: float      # On-Demand, Linux, per instance-hour
    network: str             # what the instance has between instances (informational)
    source: str              # the page
    derived: bool = False    # True: not a listed on-demand price (how it was derived is in ``source``)

    @property
    def usd_per_gpu_hour(self) -> float:
        return self.usd_per_hour / self.gpus


_AWS = "Amazon EC2"
_USE1 = "us-east-1"
_WINDOW = "2023-07-26..2025-06"   # P5 launch .. AWS's P4/P5 on-demand price reduction
H100_CAPACITY_BLOCK_USD_PER_HOUR = 39.33   # 8 x H100, US East (Ohio), Capacity Blocks page
H200_CAPACITY_BLOCK_USD_PER_HOUR = 43.26   # 8 x H200, US East (Ohio), same page
P5_ON_DEMAND_USD_PER_HOUR = 98.32

PRICE_TABLE: dict[str, Listing] = {row.gpu: row for row in (
    Listing("v100-sxm2", _AWS, "p3dn.24xlarge", _USE1, _WINDOW, 8, 31.212, "100 Gb/s",
            "https://aws.amazon.com/ec2/instance-types/p3/"),
    Listing("a100-40gb", _AWS, "p4d.24xlarge", _USE1, _WINDOW, 8, 32.7726, "4 x 100 Gb/s EFA",
            "https://aws.amazon.com/ec2/instance-types/p4/"),
    Listing("a100-80gb", _AWS, "p4de.24xlarge", _USE1, _WINDOW, 8, 40.9657, "4 x 100 Gb/s EFA",
            "https://aws.amazon.com/ec2/instance-types/p4/"),
    Listing("h100-sxm", _AWS, "p5.48xlarge", _USE1, _WINDOW, 8, P5_ON_DEMAND_USD_PER_HOUR,
            "32 x 100 Gb/s EFA (3,200 Gb/s)", "https://aws.amazon.com/ec2/instance-types/p5/"),
    Listing("h200", _AWS, "p5e.48xlarge", _USE1, "Capacity Blocks rates valid to 2025-01-01", 8,
            P5_ON_DEMAND_USD_PER_HOUR * H200_CAPACITY_BLOCK_USD_PER_HOUR / H100_CAPACITY_BLOCK_USD_PER_HOUR,
            "32 x 100 Gb/s EFA (3,200 Gb/s)",
            "derived: p5.48xlarge on-demand x (p5e / p5 Capacity Block rate, "
            "https://aws.amazon.com/ec2/capacityblocks/pricing/)", derived=True),
)}


def listing(gpu: str) -> Listing:
    """The price row of GPU preset ``gpu`` (one-line error listing the priced presets otherwise)."""
    try:
        return PRICE_TABLE[gpu]
    except (KeyError, TypeError):
        raise ValueError(f"gpu is {gpu!r}; priced: {sorted(PRICE_TABLE)}") from None


def price_per_gpu_hour_usd(gpu: str) -> float:
    """USD per GPU-hour of preset ``gpu``: its instance's price / its GPUs."""
    return listing(gpu).usd_per_gpu_hour


def price_per_hour_usd(shape: ClusterShape) -> float:
    """USD per hour to rent ``shape``: its GPUs times the per-GPU rate (module doc: why linear, why the
    link classes do not change it)."""
    if not isinstance(shape, ClusterShape):
        raise ValueError(f"shape must be a ClusterShape, got {type(shape).__name__}")
    return shape.num_gpus * price_per_gpu_hour_usd(shape.gpu)


def price_basis(shape: ClusterShape) -> str:
    """How :func:`price_per_hour_usd` priced ``shape``, in words, naming the row it came from."""
    row = listing(shape.gpu)
    tag = f"{row.provider} {row.instance_type} {row.region} on-demand ({row.date})"
    if row.derived:
        tag += " [derived, not a listed on-demand price]"
    if shape.gpus_per_server == row.gpus and shape.intra_class == "nvlink":
        if shape.num_servers == 1:
            return f"listed: {tag}"
        return f"listed: {shape.num_servers} x {tag}"
    return f"per-GPU rate of {tag}: {shape.num_gpus} x ${row.usd_per_gpu_hour:.4f}/GPU-h (shape not listed)"


def _check_table() -> None:
    if set(PRICE_TABLE) != set(CLUSTER_GPUS):
        raise ImportError(f"cluster_prices: priced GPUs {sorted(PRICE_TABLE)} differ from the space's "
                          f"{sorted(CLUSTER_GPUS)}")


_check_table()
