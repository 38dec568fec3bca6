"""What a run on the stack costs: vCPU-hours from measured throughput, dollars from AWS prices.

The throughput comes from the packaged deploy/throughput.json (frames/s per vCPU, measured by
bench/throughput.py); prices from the EC2 Spot price history or the AWS Price List API. Nothing
here prints or reads flags; deploy/cli.py does that.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import Any

from deploy.stack import DeployError, template_body

THROUGHPUT_NAME = "throughput.json"
PAPER_FRAMES = 1_000_000_000
"""The paper's Atari budget per run."""
FRAME_SKIP = 4
"""Emulator frames per agent step (the paper's frameskip): episode lengths are in steps."""
ELITE_CANDIDATES = 10
ELITE_EPISODES = 30
"""The master's elite re-evaluation defaults, which the stack does not override."""
FARGATE_SPOT_VCPU = "SpotUsage-Fargate-vCPU-Hours:perCPU"
FARGATE_SPOT_GB = "SpotUsage-Fargate-GB-Hours"
"""Ends of the Price List usage types of Fargate Spot, Linux x86 (the region prefix varies)."""
CAPACITIES = ("fargate-spot", "ec2-spot")

# Bounds on what `estimate` is asked, each for a reason: inside them every figure it prints is
# finite, and outside them the input is a typo, not a plan.
MAX_WORKERS = 5000
"""The stack runs every worker as a task of one ECS service, and ECS's default quota is 5,000
tasks per service (on ec2-spot hosts also 5,000 container instances per cluster)."""
WORKER_MEMORY_MIB = (1024, 8192)
"""The template's WorkerMemory MinValue and MaxValue."""
FARGATE_WORKER_MEMORY_MIB = (2048, 3072, 4096, 5120, 6144, 7168, 8192)
"""The memory sizes Fargate offers a 1-vCPU task (the template's FargateWorkerMemory rule)."""
MAX_FRAMES = 10**15
"""More than MAX_WORKERS workers play in a year at any measured rate (5,000 workers x ~2,000
frames/s x 3.2e7 s is 3e14): a million times the paper's budget."""
MAX_GENERATIONS = 10_000_000
MAX_POPULATION = 10_000_000
MAX_ELITE = 100_000
"""Elite candidates, and episodes each: the paper's are 10 and 30."""
MAX_EPISODE_STEPS = 10_000_000
"""A worker's own cap on a task's steps per episode (worker/limits.py MAX_EPISODE_STEPS)."""
MAX_PRICE_PER_VCPU_HOUR = 100.0
MAX_PRICE_PER_HOUR = 10_000.0
"""EC2's on-demand list prices, its largest memory and GPU instances included, stay under
1 USD per vCPU-hour and 500 USD per instance-hour: prices far above both are typos."""


@dataclass(frozen=True)
class Throughput:
    """One measured figure of deploy/throughput.json."""

    key: str
    frames_per_s_per_vcpu: float
    core_hours_per_1b_frames: float
    measured: str
    machine: str
    command: str
    elsewhere: tuple[Throughput, ...] = ()
    """The same network and dtype measured on other hosts: how far the figure can move."""

    @property
    def frames_per_vcpu_hour(self) -> float:
        return self.frames_per_s_per_vcpu * 3600.0

    def vcpu_hours(self, frames: float) -> float:
        """vCPU-hours of workers that `frames` training frames take at this throughput."""
        return frames / self.frames_per_vcpu_hour


def throughput_table() -> dict[str, Any]:
    """The packaged deploy/throughput.json."""
    return json.loads(resources.files("deploy").joinpath(THROUGHPUT_NAME).read_text())


def throughput(key: str | None = None) -> Throughput:
    """The figure for 'network/dtype' (the file's default when None); DeployError if unknown."""
    table = throughput_table()
    key = key or table["default"]
    figures = table["figures"]
    if key not in figures:
        raise DeployError(
            f"no measured throughput for {key!r} in deploy/{THROUGHPUT_NAME}; "
            f"measured: {', '.join(sorted(figures))}"
        )
    entry = figures[key]
    return _figure(key, entry, tuple(_figure(key, other) for other in entry.get("elsewhere", ())))


def _figure(key: str, entry: dict[str, Any], elsewhere: tuple[Throughput, ...] = ()) -> Throughput:
    return Throughput(
        key=key,
        frames_per_s_per_vcpu=float(entry["frames_per_s_per_vcpu"]),
        core_hours_per_1b_frames=float(entry["core_hours_per_1b_frames"]),
        measured=entry["measured"],
        machine=entry["machine"],
        command=entry["command"],
        elsewhere=elsewhere,
    )


def frames_for_generations(
    generations: int,
    population: int,
    episode_steps: float,
    elite_candidates: int = ELITE_CANDIDATES,
    elite_episodes: int = ELITE_EPISODES,
) -> float:
    """Frames of `generations` generations: every offspring plays one episode, each elite
    candidate `elite_episodes`, all of `episode_steps` agent steps on average."""
    episodes = population + elite_candidates * elite_episodes
    return generations * episodes * episode_steps * FRAME_SKIP


@dataclass(frozen=True)
class Price:
    """A price in USD per `unit`, where it came from and when AWS published or recorded it."""

    usd: float
    unit: str
    source: str
    as_of: str


def given_price(usd: float, unit: str, flag: str) -> Price:
    """A price from a flag; stamped with the time it was used."""
    return Price(usd, unit, f"{flag} (given)", _now())


def spot_price_per_vcpu(ec2: Any, region: str, instance_types: list[str]) -> Price:
    """Median over the Spot pools (type x AZ) of the newest Linux/UNIX price per vCPU-hour.

    The median, not the minimum: price-capacity-optimized also weighs capacity, so the ASG does
    not always get the cheapest pool.
    """
    newest: dict[tuple[str, str], dict[str, Any]] = {}
    # StartTime now: AWS returns the price in effect now for each pool, not a history.
    pages = ec2.get_paginator("describe_spot_price_history").paginate(
        InstanceTypes=instance_types,
        ProductDescriptions=["Linux/UNIX"],
        StartTime=datetime.now(UTC),
    )
    for page in pages:
        for item in page.get("SpotPriceHistory", []):
            pool = (item["InstanceType"], item["AvailabilityZone"])
            if pool not in newest or item["Timestamp"] > newest[pool]["Timestamp"]:
                newest[pool] = item
    if not newest:
        raise DeployError(
            f"no Spot price history in {region} for {', '.join(instance_types)} (Linux/UNIX): "
            "pass --price USD_PER_VCPU_HOUR"
        )
    described = ec2.describe_instance_types(InstanceTypes=sorted({t for t, _ in newest}))
    vcpus = {t["InstanceType"]: t["VCpuInfo"]["DefaultVCpus"] for t in described["InstanceTypes"]}
    per_vcpu = [float(item["SpotPrice"]) / vcpus[t] for (t, _), item in newest.items()]
    latest = max(item["Timestamp"] for item in newest.values())
    low, high = min(per_vcpu), max(per_vcpu)
    return Price(
        statistics.median(per_vcpu),
        "vCPU-hour",
        f"EC2 Spot price history, {region}, Linux/UNIX, median of {len(per_vcpu)} pools "
        f"({', '.join(sorted({t for t, _ in newest}))}; {low:.4f}-{high:.4f} per vCPU-hour)",
        _stamp(latest),
    )


def fargate_spot_price_per_vcpu(
    pricing: Any, region: str, cpu_units: int, memory_mib: int
) -> Price:
    """Fargate Spot price of one worker task per vCPU-hour: its vCPUs and GBs at list price."""
    found: dict[str, tuple[float, str]] = {}
    for item in _products(pricing, "AmazonECS", {"regionCode": region}):
        usage = item["product"]["attributes"].get("usagetype", "")
        for end in (FARGATE_SPOT_VCPU, FARGATE_SPOT_GB):
            # A region prefix (USE1-) and the end: not ARM or Windows, not on-demand Fargate.
            if re.fullmatch(r"(?:[A-Z0-9]+-)?" + re.escape(end), usage):
                found[end] = _on_demand_usd(item)
    missing = [end for end in (FARGATE_SPOT_VCPU, FARGATE_SPOT_GB) if end not in found]
    if missing:
        raise DeployError(
            f"no Fargate Spot price in the AWS Price List for {region} ({', '.join(missing)}): "
            "pass --price USD_PER_VCPU_HOUR"
        )
    vcpus, gb = cpu_units / 1024, memory_mib / 1024
    (vcpu_usd, vcpu_date), (gb_usd, gb_date) = found[FARGATE_SPOT_VCPU], found[FARGATE_SPOT_GB]
    return Price(
        (vcpu_usd * vcpus + gb_usd * gb) / vcpus,
        "vCPU-hour",
        f"AWS Price List, Fargate Spot in {region}: {vcpu_usd:.8g} per vCPU-hour + "
        f"{gb_usd:.8g} per GB-hour x {gb:g} GB per {vcpus:g}-vCPU worker",
        max(vcpu_date, gb_date),
    )


def on_demand_instance_price(pricing: Any, region: str, instance_type: str) -> Price:
    """On-demand Linux price per hour of one shared-tenancy instance."""
    filters = {
        "regionCode": region,
        "instanceType": instance_type,
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
    }
    prices = [_on_demand_usd(item) for item in _products(pricing, "AmazonEC2", filters)]
    # Reserved-only and free SKUs carry no positive on-demand price.
    prices = [(usd, date) for usd, date in prices if usd > 0]
    if not prices:
        raise DeployError(
            f"no on-demand price in the AWS Price List for {instance_type} in {region}: "
            "pass --master-price USD_PER_HOUR"
        )
    usd, date = min(prices)
    return Price(usd, "hour", f"AWS Price List, {instance_type} on demand in {region}", date)


def worker_price(
    clients: Any, capacity: str, region: str, instance_types: list[str], memory_mib: int
) -> Price:
    """The region's current price per worker vCPU-hour for a capacity mode of the template."""
    if capacity == "ec2-spot":
        return spot_price_per_vcpu(clients.ec2, region, instance_types)
    if capacity == "fargate-spot":
        return fargate_spot_price_per_vcpu(clients.pricing, region, worker_cpu_units(), memory_mib)
    raise DeployError(f"unknown capacity {capacity!r}: one of {', '.join(CAPACITIES)}")


@dataclass(frozen=True)
class Cost:
    """vCPU-hours, wall-clock hours and dollars of a number of training frames."""

    frames: float
    vcpu_hours: float
    workers: int
    wall_hours: float
    worker_usd: float
    master_hours: float
    master_usd: float | None
    utilisation: float = 1.0
    """The share of the workers' hours spent on the frames' work (deploy/fleet.py)."""


def cost(
    frames: float,
    rate: Throughput,
    workers: int,
    price: Price,
    master_price: Price | None,
    master_hours: float | None = None,
    utilisation: float = 1.0,
) -> Cost:
    """Workers: frames / measured frames per vCPU-hour of work, done at `utilisation` (the
    rest of their hours idle but paid for), at `price`; the master: its hours (the workers'
    wall clock unless given) at `master_price`."""
    if workers < 1:
        raise DeployError(f"workers must be 1 or more to finish a run, got {workers}")
    if not 0 < utilisation <= 1:
        raise DeployError(f"utilisation must be in (0, 1], got {utilisation}")
    vcpu_hours = rate.vcpu_hours(frames)
    wall_hours = vcpu_hours / (workers * utilisation)
    hours = wall_hours if master_hours is None else master_hours
    return Cost(
        frames=frames,
        vcpu_hours=vcpu_hours,
        workers=workers,
        wall_hours=wall_hours,
        worker_usd=vcpu_hours / utilisation * price.usd,
        master_hours=hours,
        master_usd=None if master_price is None else hours * master_price.usd,
        utilisation=utilisation,
    )


def template_parameter_defaults(body: str) -> dict[str, str]:
    """Each parameter's Default in the template's `Parameters:` section, as text.

    Read with a pattern, not a YAML parser: the template's short-form tags (!Ref) need a
    CloudFormation-aware loader, and the `aws` extra installs boto3 only.
    """
    section = re.search(r"^Parameters:\n(.*?)(?=^\S)", body, re.MULTILINE | re.DOTALL)
    if section is None:
        raise DeployError("the template has no Parameters section")
    defaults = {}
    for match in re.finditer(r"^  (\w+):\n((?:    .*\n|\s*\n)*)", section.group(1), re.MULTILINE):
        default = re.search(r"^    Default: *(.*?) *$", match.group(2), re.MULTILINE)
        if default:
            defaults[match.group(1)] = default.group(1).strip("\"'")
    return defaults


def worker_cpu_units() -> int:
    """CPU units (1024 = 1 vCPU) of the template's worker task definitions."""
    units = set(re.findall(r'^\s+Cpu: "(\d+)"', template_body(), re.MULTILINE))
    if len(units) != 1:
        raise DeployError(f"the template's worker tasks disagree on Cpu: {sorted(units)}")
    return int(units.pop())


def _products(pricing: Any, service: str, filters: dict[str, str]) -> list[dict[str, Any]]:
    """Price List products of a service matching every attribute in `filters`, decoded."""
    pages = pricing.get_paginator("get_products").paginate(
        ServiceCode=service,
        Filters=[{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in filters.items()],
        FormatVersion="aws_v1",
    )
    return [json.loads(text) for page in pages for text in page.get("PriceList", [])]


def _on_demand_usd(item: dict[str, Any]) -> tuple[float, str]:
    """(USD per unit, publication date) of a Price List product's on-demand term."""
    for term in item.get("terms", {}).get("OnDemand", {}).values():
        for dimension in term.get("priceDimensions", {}).values():
            usd = dimension.get("pricePerUnit", {}).get("USD")
            if usd is not None:
                date = item.get("publicationDate") or term.get("effectiveDate") or "?"
                return float(usd), date
    return 0.0, "?"


def _stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _now() -> str:
    return _stamp(datetime.now(UTC))
