"""What a GPU-cluster shape costs to rent, in US dollars per hour, from public on-demand list prices.

One provider, one region, one purchase option, so that GPUs are compared on the same footing: **Amazon
EC2, US East (N. Virginia) ``us-east-1``, Linux On-Demand**, the list prices AWS published on its
instance-type pages from the P5 launch (2023-07-26) until its P4/P5 price reduction of June 2025 (the
window in which all of these were listed at once; the date of each row says which page).

| GPU preset  | instance        | GPUs | USD/h    | USD/GPU-h | network   | page (aws.amazon.com/ec2/..)  |
|-------------|-----------------|------|----------|-----------|-----------|-------------------------------|
| v100-sxm2   | p3dn.24xlarge   | 8    | 31.212   | 3.9015    | efa-100g  | instance-types/p3/, 100 Gb/s  |
| a100-40gb   | p4d.24xlarge    | 8    | 32.7726  | 4.0966    | efa-400g  | instance-types/p4/, 4x100 EFA |
| a100-80gb   | p4de.24xlarge   | 8    | 40.9657  | 5.1207    | efa-400g  | instance-types/p4/, 4x100 EFA |
| h100-sxm    | p5.48xlarge     | 8    | 98.32    | 12.29     | efa-3200g | instance-types/p5/, 3,200 EFA |
| h200        | (p5e.48xlarge)  | 8    | 108.1445 | 13.5181   | efa-3200g | derived, see below            |

(V100 SXM2 32 GB, A100 SXM 40 / 80 GB, H100 SXM 80 GB; network classes in ``gpu_cluster_space.NETWORKS``.)

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

**The network has a price.** No public list sells these GPUs with another network, so the price of a
network class is taken from AWS's price for network alone, on the same page, region and purchase option:
the c6in.32xlarge (128 vCPU, 256 GiB, 200 Gb/s) at $7.2576/h against the c6i.32xlarge (same vCPUs and
memory, 50 Gb/s) at $5.44/h: 150 Gb/s for $1.8176/h, **$0.012117 per Gb/s-hour**
(:data:`NETWORK_USD_PER_GBPS_HOUR`; also recorded here, not re-read from a live page). A class costs its
server's Gb/s times that, per server-hour (:func:`network_usd_per_hour`): ``eth-25g`` $0.30,
``efa-100g`` $1.21, ``ib-hdr-200g`` $2.42, ``efa-400g`` $4.85, ``efa-3200g`` $38.78. Linear in Gb/s is a
model: it is what AWS charges between those two sizes, carried to the p5's 3,200 Gb/s, where it says
the network is 39 % of the p5's price (a DGX-class build's NICs, switches and optics are nearer 10-15 %
of its capital cost), so it is more likely high than low there; ``bench/gpu/codesign_gpu.py`` reports the
front at other rates (its ``network_price_sensitivity``).

**A shape's price.** A shape that *is* an instance (its GPU, 8 GPUs per server, NVLink, and the
instance's network class) is ``listed``: servers x the instance's price. Any other shape is built from
parts: its GPUs at the instance's per-GPU rate less the instance's network
(:func:`gpu_usd_per_hour_without_network`: (instance price - its network's price) / 8), plus its
servers times its network class's price. For a listed shape the two agree, so the price is one function
of the shape. Why per GPU: AWS prices the sizes of one family linearly in GPUs: p3.2xlarge (1 x V100
16 GB) $3.06/h, p3.8xlarge (4 GPUs) $12.24/h, p3.16xlarge (8 GPUs) $24.48/h on the P3 page. The
intra-server class is not priced (a PCIe server costs what an NVLink one does): no list sells the
difference.

``price_basis`` says for each shape whether it is listed or built, and from which rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from .gpu_cluster_space import CLUSTER_GPUS, NETWORKS, ClusterShape


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
    network: str             # the instance's network class (gpu_cluster_space.NETWORKS)
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
# the network's price (module doc): c6in.32xlarge (200 Gb/s) - c6i.32xlarge (50 Gb/s), us-east-1
# on-demand, same 128 vCPUs and 256 GiB (aws.amazon.com/ec2/instance-types/c6i/, .../c6in/)
C6IN_32XLARGE_USD_PER_HOUR = 7.2576
C6I_32XLARGE_USD_PER_HOUR = 5.44
NETWORK_USD_PER_GBPS_HOUR = (C6IN_32XLARGE_USD_PER_HOUR - C6I_32XLARGE_USD_PER_HOUR) / (200.0 - 50.0)

PRICE_TABLE: dict[str, Listing] = {row.gpu: row for row in (
    Listing("v100-sxm2", _AWS, "p3dn.24xlarge", _USE1, _WINDOW, 8, 31.212, "efa-100g",
            "https://aws.amazon.com/ec2/instance-types/p3/"),
    Listing("a100-40gb", _AWS, "p4d.24xlarge", _USE1, _WINDOW, 8, 32.7726, "efa-400g",
            "https://aws.amazon.com/ec2/instance-types/p4/"),
    Listing("a100-80gb", _AWS, "p4de.24xlarge", _USE1, _WINDOW, 8, 40.9657, "efa-400g",
            "https://aws.amazon.com/ec2/instance-types/p4/"),
    Listing("h100-sxm", _AWS, "p5.48xlarge", _USE1, _WINDOW, 8, P5_ON_DEMAND_USD_PER_HOUR,
            "efa-3200g", "https://aws.amazon.com/ec2/instance-types/p5/"),
    Listing("h200", _AWS, "p5e.48xlarge", _USE1, "Capacity Blocks rates valid to 2025-01-01", 8,
            P5_ON_DEMAND_USD_PER_HOUR * H200_CAPACITY_BLOCK_USD_PER_HOUR / H100_CAPACITY_BLOCK_USD_PER_HOUR,
            "efa-3200g",
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


def _check_rate(rate: float) -> float:
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate >= 0:
        raise ValueError(f"network_usd_per_gbps_hour is {rate!r}; allowed: a number >= 0")
    return float(rate)


def network_usd_per_hour(inter_class: str,
                         network_usd_per_gbps_hour: float = NETWORK_USD_PER_GBPS_HOUR) -> float:
    """USD per server-hour of network class ``inter_class``: its Gb/s per server times the rate (module
    doc: AWS's c6in - c6i difference)."""
    if inter_class not in NETWORKS:
        raise ValueError(f"inter_class is {inter_class!r}; allowed: {list(NETWORKS)}")
    return NETWORKS[inter_class].gbps_per_server * _check_rate(network_usd_per_gbps_hour)


def gpu_usd_per_hour_without_network(gpu: str,
                                     network_usd_per_gbps_hour: float = NETWORK_USD_PER_GBPS_HOUR) -> float:
    """USD per GPU-hour of preset ``gpu`` without a network: (its instance's price - the price of the
    instance's network class) / its GPUs."""
    row = listing(gpu)
    return (row.usd_per_hour - network_usd_per_hour(row.network, network_usd_per_gbps_hour)) / row.gpus


def is_listed(shape: ClusterShape) -> bool:
    """Whether ``shape`` is copies of its GPU's instance: the GPU, its GPUs per server, NVLink and its
    network class all match."""
    if not isinstance(shape, ClusterShape):
        raise ValueError(f"shape must be a ClusterShape, got {type(shape).__name__}")
    row = listing(shape.gpu)
    return (shape.gpus_per_server == row.gpus and shape.intra_class == "nvlink"
            and shape.inter_class == row.network)


def price_per_hour_usd(shape: ClusterShape,
                       network_usd_per_gbps_hour: float = NETWORK_USD_PER_GBPS_HOUR) -> float:
    """USD per hour to rent ``shape``: servers x the instance's price when it is listed, else its GPUs at
    :func:`gpu_usd_per_hour_without_network` plus its servers at :func:`network_usd_per_hour` (the two
    agree on a listed shape; module doc)."""
    if is_listed(shape):
        return shape.num_servers * listing(shape.gpu).usd_per_hour
    return (shape.num_gpus * gpu_usd_per_hour_without_network(shape.gpu, network_usd_per_gbps_hour)
            + shape.num_servers * network_usd_per_hour(shape.inter_class, network_usd_per_gbps_hour))


def price_basis(shape: ClusterShape) -> str:
    """How :func:`price_per_hour_usd` priced ``shape``, in words, naming the rows it came from."""
    row = listing(shape.gpu)
    tag = f"{row.provider} {row.instance_type} {row.region} on-demand ({row.date})"
    if row.derived:
        tag += " [derived, not a listed on-demand price]"
    if is_listed(shape):
        if shape.num_servers == 1:
            return f"listed: {tag}"
        return f"listed: {shape.num_servers} x {tag}"
    gbps = NETWORKS[shape.inter_class].gbps_per_server
    return (f"built (shape not listed): {shape.num_gpus} GPU x "
            f"${gpu_usd_per_hour_without_network(shape.gpu):.4f}/GPU-h ({tag} less its {row.network} "
            f"network) + {shape.num_servers} server x ${network_usd_per_hour(shape.inter_class):.4f}/h "
            f"({shape.inter_class}, {gbps:g} Gb/s at ${NETWORK_USD_PER_GBPS_HOUR:.6f}/Gb/s-h)")


def _check_table() -> None:
    if set(PRICE_TABLE) != set(CLUSTER_GPUS):
        raise ImportError(f"cluster_prices: priced GPUs {sorted(PRICE_TABLE)} differ from the space's "
                          f"{sorted(CLUSTER_GPUS)}")
    bad = {g: r.network for g, r in PRICE_TABLE.items() if r.network not in NETWORKS}
    if bad:
        raise ImportError(f"cluster_prices: instance networks {bad} are not network classes {list(NETWORKS)}")


_check_table()
