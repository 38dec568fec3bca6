"""`neuro-deploy estimate` and the cost so far in `status`.

The stack comes from a moto server on loopback; moto has no Price List API and no realistic
Spot price history, so those clients are botocore Stubbers holding responses shaped as AWS
sends them. Nothing here leaves the machine.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from botocore.stub import ANY, Stubber
from cfnlint.decode import decode_str

from deploy import cli, cost, fleet, stack
from deploy.stack import Clients
from tests.support.aws import aws_test_env
from tests.support.processes import REPO

pytestmark = pytest.mark.filterwarnings("ignore:Tried to parse:UserWarning")
IMAGES = ["--master-image", "example.org/neuro-master:1", "--worker-image", "example.org/w:1"]
DATA_FILE = REPO / "deploy" / "throughput.json"
PUBLISHED = "2026-11-01T00:00:00Z"
# Fargate Spot, Linux x86, us-east-1, as the Price List gives them (USD per vCPU-hour, per GB-hour).
FARGATE_SPOT_VCPU = "0.01264794"
FARGATE_SPOT_GB = "0.00138855"
MASTER_ON_DEMAND = "0.0850000000"
SPOT_HISTORY = [
    # (type, AZ, USD per instance-hour, minutes ago): the newest price per pool counts.
    ("c5.9xlarge", "us-east-1a", "0.612300", 5),
    ("c5.9xlarge", "us-east-1a", "0.700000", 90),
    ("c5.9xlarge", "us-east-1b", "0.598100", 12),
    ("c5a.8xlarge", "us-east-1a", "0.481000", 3),
    ("c6i.8xlarge", "us-east-1c", "0.552800", 30),
    ("c6a.8xlarge", "us-east-1d", "0.467200", 8),
]
VCPUS = {"c5.9xlarge": 36, "c5a.8xlarge": 32, "c6i.8xlarge": 32, "c6a.8xlarge": 32}
TEMPLATE_TYPES = ["c5.9xlarge", "c5a.8xlarge", "c6i.8xlarge", "c6a.8xlarge"]


def data_figure(key: str = "deepga/int8-static") -> float:
    """Frames/s per vCPU as the data file states it, read here without deploy.cost."""
    return float(json.loads(DATA_FILE.read_text())["figures"][key]["frames_per_s_per_vcpu"])


def busy(workers: int) -> float:
    """The simulated utilisation of a fleet this size running one run of the paper's generation
    (deploy/fleet_utilisation.json, tests/deploy/test_fleet_model.py)."""
    return fleet.utilisation_table().at(workers, 1, 1000 + 10 * 30)


def price_item(service: str, attributes: dict[str, str], usd: str, unit: str = "Hrs") -> str:
    """One Price List product as get_products returns it: a JSON document in a string."""
    sku = f"SKU{abs(hash(json.dumps(attributes, sort_keys=True))) % 10**10:010d}"
    term, rate = f"{sku}.JRTCKXETXF", f"{sku}.JRTCKXETXF.6YS6EN2CT7"
    return json.dumps({
        "product": {"productFamily": "Compute", "sku": sku,
                    "attributes": {"servicecode": service, "locationType": "AWS Region",
                                   **attributes}},
        "serviceCode": service,
        "terms": {"OnDemand": {term: {
            "priceDimensions": {rate: {
                "unit": unit, "endRange": "Inf", "beginRange": "0", "appliesTo": [],
                "rateCode": rate, "description": f"{attributes.get('usagetype')} at {usd}",
                "pricePerUnit": {"USD": usd}}},
            "sku": sku, "effectiveDate": PUBLISHED, "offerTermCode": "JRTCKXETXF",
            "termAttributes": {}}}},
        "version": "20261101000000",
        "publicationDate": PUBLISHED,
    })  # fmt: skip


def fargate_products(region: str) -> list[str]:
    """The region's AmazonECS products: Fargate Spot among on-demand, ARM and storage SKUs."""
    prefix = {"us-east-1": "USE1", "eu-west-1": "EU"}[region]
    where = {"regionCode": region, "location": "US East (N. Virginia)"}
    return [
        price_item("AmazonECS", {**where, "usagetype": f"{prefix}-{usage}"}, usd)
        for usage, usd in [
            ("Fargate-vCPU-Hours:perCPU", "0.04048"),
            ("Fargate-GB-Hours", "0.004445"),
            ("SpotUsage-Fargate-ARM-vCPU-Hours:perCPU", "0.01012"),
            ("SpotUsage-Fargate-vCPU-Hours:perCPU", FARGATE_SPOT_VCPU),
            ("SpotUsage-Fargate-GB-Hours", FARGATE_SPOT_GB),
            ("Fargate-EphemeralStorage-GB-Hours", "0.000111"),
        ]
    ]


def master_products(region: str, instance_type: str = "c5.large") -> list[str]:
    attributes = {"regionCode": region, "instanceType": instance_type, "operatingSystem": "Linux",
                  "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used",
                  "usagetype": f"BoxUsage:{instance_type}"}  # fmt: skip
    return [price_item("AmazonEC2", attributes, MASTER_ON_DEMAND)]


def expect_products(stub: Stubber, service: str, filters: dict[str, str], items: list[str]) -> None:
    stub.add_response(
        "get_products",
        {"FormatVersion": "aws_v1", "PriceList": items},
        {
            "ServiceCode": service,
            "Filters": [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in filters.items()],
            "FormatVersion": "aws_v1",
        },
    )


def expect_fargate(stub: Stubber, region: str, items: list[str] | None = None) -> None:
    products = fargate_products(region) if items is None else items
    expect_products(stub, "AmazonECS", {"regionCode": region}, products)


def expect_master(stub: Stubber, region: str, items: list[str] | None = None) -> None:
    filters = {"regionCode": region, "instanceType": "c5.large", "operatingSystem": "Linux",
               "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used"}  # fmt: skip
    expect_products(stub, "AmazonEC2", filters, master_products(region) if items is None else items)


def expect_spot(stub: Stubber, history: list[tuple[str, str, str, int]]) -> None:
    now = datetime.now(UTC)
    stub.add_response(
        "describe_spot_price_history",
        {"SpotPriceHistory": [
            {"AvailabilityZone": az, "InstanceType": kind, "ProductDescription": "Linux/UNIX",
             "SpotPrice": usd, "Timestamp": now - timedelta(minutes=ago)}
            for kind, az, usd, ago in history]},
        {"InstanceTypes": TEMPLATE_TYPES, "ProductDescriptions": ["Linux/UNIX"], "StartTime": ANY},
    )  # fmt: skip
    if history:
        kinds = sorted({kind for kind, *_ in history})
        stub.add_response(
            "describe_instance_types",
            {"InstanceTypes": [{"InstanceType": k, "VCpuInfo": {"DefaultVCpus": VCPUS[k]}}
                               for k in kinds]},
            {"InstanceTypes": kinds},
        )  # fmt: skip


class Stubs:
    """A Clients whose ec2 and pricing clients answer from Stubbers, for `neuro-deploy`."""

    def __init__(self, region: str, base: Clients | None = None) -> None:
        self.ec2 = boto3.client("ec2", region_name=region)
        self.pricing = boto3.client("pricing", region_name="us-east-1")
        self.ec2_stub, self.pricing_stub = Stubber(self.ec2), Stubber(self.pricing)
        self.ec2_stub.activate()
        self.pricing_stub.activate()
        fields: dict[str, Any] = dict.fromkeys(("cloudformation", "ecs", "logs", "s3", "ssm"))
        if base is not None:
            fields = {name: getattr(base, name) for name in fields}
        self.clients = Clients(**fields, ec2=self.ec2, pricing=self.pricing, region=region)

    def assert_used_up(self) -> None:
        self.ec2_stub.assert_no_pending_responses()
        self.pricing_stub.assert_no_pending_responses()


@pytest.fixture
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fake credentials and an endpoint on loopback nothing listens on, for stub-only tests."""
    for name, value in aws_test_env("http://127.0.0.1:9").items():
        monkeypatch.setenv(name, value)
    yield


def use_clients(monkeypatch: pytest.MonkeyPatch, clients: Clients) -> None:
    monkeypatch.setattr(cli.Clients, "connect", lambda region=None, profile=None: clients)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["--stack-name", "run1", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def estimate_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code, out, err = run_cli(capsys, "estimate", *argv, "--json")
    assert code == 0, err
    return json.loads(out)


# ------------------------------------------------------------------------------ estimate


def test_the_paper_frostbite_budget_on_fargate_spot(
    loopback_only: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stubs = Stubs("us-east-1")
    expect_fargate(stubs.pricing_stub, "us-east-1")
    expect_master(stubs.pricing_stub, "us-east-1")
    use_clients(monkeypatch, stubs.clients)
    code, out, err = run_cli(capsys, "estimate", "--workers", "720")
    assert code == 0, err
    stubs.assert_used_up()
    vcpu_hours = 1e9 / (data_figure() * 3600)
    # A 1-vCPU, 4096 MiB worker (the template's defaults): one vCPU and 4 GB at Spot list price.
    per_vcpu_hour = float(FARGATE_SPOT_VCPU) + float(FARGATE_SPOT_GB) * 4
    # The fleet is paid for its idle hours too: one run keeps 720 workers busy part of the time.
    wall = vcpu_hours / (720 * busy(720))
    workers_usd, master_usd = 720 * wall * per_vcpu_hour, wall * float(MASTER_ON_DEMAND)
    assert "budget: 1,000,000,000 frames (the paper's budget)" in out
    assert f"throughput: {data_figure():,.0f} training frames/s per vCPU, deepga/int8-static" in out
    assert f"compute: {vcpu_hours:,.2f} vCPU-hours of workers' work" in out
    assert f"fleet: 720 workers busy {busy(720):.1%} of the time with 1 run served at once" in out
    assert f"wall clock: {wall:,.2f} h at 720 workers (fargate-spot, 1 vCPU and 4096 MiB" in out
    assert (
        f"worker price: {per_vcpu_hour:.4f} USD per vCPU-hour, AWS Price List, Fargate Spot" in out
    )
    assert f"as of {PUBLISHED}" in out
    assert f"workers: {workers_usd:,.2f} USD" in out
    assert f"master: c5.large on demand for {wall:,.2f} h at 0.0850 USD per hour" in out
    assert f"total: {workers_usd + master_usd:,.2f} USD\n" in out
    assert "not included:" in out


def test_the_estimate_is_the_data_file_arithmetic_exactly(
    loopback_only: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stubs = Stubs("us-east-1")
    expect_fargate(stubs.pricing_stub, "us-east-1")
    expect_master(stubs.pricing_stub, "us-east-1")
    use_clients(monkeypatch, stubs.clients)
    result = estimate_json(capsys, "--frames", "1e9")
    vcpu_hours = 1e9 / (data_figure() * 3600)
    price = (float(FARGATE_SPOT_VCPU) * 1024 / 1024 + float(FARGATE_SPOT_GB) * 4096 / 1024) / 1
    assert result["throughput"]["frames_per_s_per_vcpu"] == data_figure()
    assert result["cost"]["vcpu_hours"] == vcpu_hours
    assert result["cost"]["workers"] == 16  # the template's WorkerCount default
    # The same arithmetic, summed in another order: equal to the last bit or two.
    assert result["cost"]["utilisation"] == pytest.approx(busy(16), rel=1e-12, abs=0)
    assert result["cost"]["wall_hours"] == pytest.approx(vcpu_hours / (16 * busy(16)))
    assert result["worker_price"]["usd"] == price
    assert result["cost"]["worker_usd"] == pytest.approx(vcpu_hours / busy(16) * price)
    assert result["cost"]["master_usd"] == pytest.approx(
        vcpu_hours / (16 * busy(16)) * float(MASTER_ON_DEMAND)
    )


def test_ec2_spot_prices_the_newest_price_per_pool_per_vcpu(
    loopback_only: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stubs = Stubs("us-east-1")
    expect_spot(stubs.ec2_stub, SPOT_HISTORY)
    expect_master(stubs.pricing_stub, "us-east-1")
    use_clients(monkeypatch, stubs.clients)
    result = estimate_json(capsys, "--capacity", "ec2-spot", "--frames", "1000000000")
    stubs.assert_used_up()
    newest: dict[tuple[str, str], tuple[int, str]] = {}
    for kind, az, usd, ago in SPOT_HISTORY:
        if (kind, az) not in newest or ago < newest[kind, az][0]:
            newest[kind, az] = (ago, usd)
    median = statistics.median(float(usd) / VCPUS[kind] for (kind, _), (_, usd) in newest.items())
    assert result["worker_price"]["usd"] == median
    assert "median of 5 pools" in result["worker_price"]["source"]
    assert result["cost"]["worker_usd"] == pytest.approx(
        1e9 / (data_figure() * 3600) / busy(16) * median
    )


def test_generations_budget(
    loopback_only: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    result = estimate_json(capsys, "--generations", "200", "--population", "500",
                           "--episode-steps", "1500", "--price", "0.02")  # fmt: skip
    frames = 200 * (500 + 10 * 30) * 1500 * 4
    assert result["cost"]["frames"] == frames
    assert result["cost"]["vcpu_hours"] == frames / (data_figure() * 3600)


def test_price_overrides_and_asks_aws_nothing(
    loopback_only: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def refuse(region: str | None = None, profile: str | None = None) -> Clients:
        raise AssertionError("estimate --price must not connect to AWS")

    monkeypatch.setattr(cli.Clients, "connect", refuse)
    code, out, err = run_cli(capsys, "estimate", "--price", "0.02")
    assert code == 0, err
    vcpu_hours = 1e9 / (data_figure() * 3600)
    paid = vcpu_hours / busy(16)
    assert f"compute: {vcpu_hours:,.2f} vCPU-hours" in out
    assert "worker price: 0.0200 USD per vCPU-hour, --price (given)" in out
    assert f"workers: {paid * 0.02:,.2f} USD" in out
    assert "master: c5.large on demand" in out and "excluded" in out and "--master-price" in out
    assert f"total: {paid * 0.02:,.2f} USD (workers only)" in out
    result = estimate_json(capsys, "--price", "0.02", "--master-price", "0.1",
                           "--inference-dtype", "bfloat16", "--workers", "100")  # fmt: skip
    vcpu_hours = 1e9 / (data_figure("deepga/bfloat16") * 3600)
    wall = vcpu_hours / (100 * busy(100))
    assert result["cost"]["worker_usd"] == pytest.approx(100 * wall * 0.02)
    assert result["cost"]["master_usd"] == pytest.approx(wall * 0.1)
    assert result["total_usd"] == pytest.approx(100 * wall * 0.02 + wall * 0.1)


def test_the_estimate_states_what_other_measured_hosts_would_take(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Per-vCPU speed is the host's: int8 was measured on other hosts at about half the rate.
    monkeypatch.setattr(cli.Clients, "connect", lambda *a, **k: None)
    figures = json.loads(DATA_FILE.read_text())["figures"]
    for key, dtype in (("deepga/int8", "int8"), ("deepga/float32", "float32")):
        others = figures[key].get("elsewhere", [])
        assert others, key  # both have been measured on more than one host
        code, out, err = run_cli(capsys, "estimate", "--price", "0.02", "--inference-dtype", dtype)
        assert code == 0, err
        for other in others:
            hours = 1e9 / (other["frames_per_s_per_vcpu"] * 3600)
            assert (
                f"  measured elsewhere: {other['frames_per_s_per_vcpu']:,.0f} frames/s per vCPU "
                f"on {other['machine']} ({other['measured']}): {hours:,.2f} vCPU-hours, "
                f"{hours / busy(16) * 0.02:,.2f} USD of workers at the price below"
            ) in out
        result = estimate_json(capsys, "--price", "0.02", "--inference-dtype", dtype)
        listed = result["throughput"]["elsewhere"]
        assert [o["frames_per_s_per_vcpu"] for o in listed] == [
            o["frames_per_s_per_vcpu"] for o in others
        ]
        assert [o["machine"] for o in listed] == [o["machine"] for o in others]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--frames", "-5"], "--frames: expected a number above 0, got '-5'"),
        (["--frames", "lots"], "--frames: expected a number, got 'lots'"),
        (["--capacity", "spot"], "--capacity: invalid choice: 'spot'"),
        (["--workers", "0"], "--workers: expected 1 or more, got '0'"),
        (["--price", "-0.01"], "--price: a price cannot be negative, got '-0.01'"),
        (["--generations", "10", "--frames", "1e9"], "not allowed with argument"),
    ],
)
def test_bad_values_are_named(
    capsys: pytest.CaptureFixture[str], argv: list[str], named: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["estimate", *argv])
    assert exit_.value.code == 2
    assert named in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--generations", "10"], "--generations needs --episode-steps"),
        (["--episode-steps", "100"], "go with --generations"),
        (["--network", "nature"], "no measured throughput for 'nature/int8-static'"),
    ],
)
def test_incomplete_budgets_are_refused(
    loopback_only: None, capsys: pytest.CaptureFixture[str], argv: list[str], named: str
) -> None:
    code, _, err = run_cli(capsys, "estimate", *argv, "--price", "0.02")
    assert code == 1
    assert named in err


def test_no_fargate_price_for_the_region_suggests_price(
    loopback_only: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stubs = Stubs("eu-south-9")
    expect_fargate(stubs.pricing_stub, "eu-south-9", items=[])
    use_clients(monkeypatch, stubs.clients)
    code, _, err = run_cli(capsys, "estimate")
    assert code == 1
    assert "no Fargate Spot price in the AWS Price List for eu-south-9" in err
    assert "pass --price USD_PER_VCPU_HOUR" in err


def test_no_spot_history_for_the_region_suggests_price(
    loopback_only: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stubs = Stubs("eu-south-9")
    expect_spot(stubs.ec2_stub, [])
    use_clients(monkeypatch, stubs.clients)
    code, _, err = run_cli(capsys, "estimate", "--capacity", "ec2-spot")
    assert code == 1
    assert "no Spot price history in eu-south-9 for c5.9xlarge" in err
    assert "pass --price USD_PER_VCPU_HOUR" in err


def test_an_unpriced_master_is_stated_not_fatal(
    loopback_only: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stubs = Stubs("us-east-1")
    expect_fargate(stubs.pricing_stub, "us-east-1")
    expect_master(stubs.pricing_stub, "us-east-1", items=[])
    use_clients(monkeypatch, stubs.clients)
    code, out, err = run_cli(capsys, "estimate")
    assert code == 0, err
    assert "excluded (no on-demand price in the AWS Price List for c5.large in us-east-1" in out
    assert "(workers only)" in out


# ------------------------------------------------------------------------------ status


def put_status(info: stack.StackInfo, document: dict[str, Any]) -> None:
    bucket, prefix = stack.split_s3_uri(info.outputs["RunS3Uri"])
    key = f"{prefix}/status.json" if prefix else "status.json"
    boto3.client("s3").put_object(Bucket=bucket, Key=key, Body=json.dumps(document).encode())


def test_status_shows_the_cost_so_far(
    aws_endpoint: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(capsys, "up", *IMAGES, "--workers", "64", "--poll-seconds", "0.1")
    assert code == 0, err
    real = Clients.connect()
    info = stack.require(real, "run1")
    frames = 250_000_000
    now = datetime.now(UTC).timestamp()
    put_status(info, {"run_id": "r1", "env_id": "Frostbite-v4", "generation": 40,
                      "phase": "offspring", "frames": frames, "workers": 64,
                      "run_complete": False, "updated_at": now})  # fmt: skip
    stubs = Stubs("us-east-1", base=real)
    expect_fargate(stubs.pricing_stub, "us-east-1")
    expect_master(stubs.pricing_stub, "us-east-1")
    use_clients(monkeypatch, stubs.clients)
    code, out, err = run_cli(capsys, "status", "--cost")
    assert code == 0, err
    vcpu_hours = frames / (data_figure() * 3600)
    per_vcpu_hour = float(FARGATE_SPOT_VCPU) + float(FARGATE_SPOT_GB) * 4
    assert (
        f"cost so far: {vcpu_hours:,.2f} worker vCPU-hours for {frames:,} frames x "
        f"{per_vcpu_hour:.4f} USD = {vcpu_hours * per_vcpu_hour:,.2f} USD" in out
    )
    assert "  master c5.large: " in out and "x 0.0850 USD" in out
    assert "  model: worker vCPU-hours = frames so far / measured frames per vCPU-hour" in out

    expect_fargate(stubs.pricing_stub, "us-east-1")
    expect_master(stubs.pricing_stub, "us-east-1")
    code, out, err = run_cli(capsys, "status", "--json", "--cost")
    assert code == 0, err
    spent = json.loads(out)["cost"]
    assert spent["vcpu_hours"] == vcpu_hours
    assert spent["worker_usd"] == vcpu_hours * per_vcpu_hour
    assert 0 <= spent["master_hours"] < 1  # the stack was created moments ago
    assert spent["master_usd"] == spent["master_hours"] * float(MASTER_ON_DEMAND)
    assert spent["total_usd"] == spent["worker_usd"] + spent["master_usd"]

    # --price with --cost: the worker price given, the master's from the Price List.
    expect_master(stubs.pricing_stub, "us-east-1")
    code, out, err = run_cli(capsys, "status", "--cost", "--price", "0.03")
    assert code == 0, err
    assert f"x 0.0300 USD = {vcpu_hours * 0.03:,.2f} USD (--price (given)" in out
    assert "x 0.0850 USD" in out
    stubs.assert_used_up()

    # Without --cost, status asks AWS for no price (the stubs hold none: a call would fail).
    code, out, err = run_cli(capsys, "status")
    assert code == 0, err
    assert f"cost so far: {vcpu_hours:,.2f} worker vCPU-hours for {frames:,} frames\n" in out
    assert "  not priced: --cost prices it at the region's current prices" in out
    code, out, err = run_cli(capsys, "status", "--price", "0.03", "--master-price", "0.1")
    assert code == 0, err
    assert f"= {vcpu_hours * 0.03:,.2f} USD (--price (given)" in out
    assert "  master c5.large: " in out and "x 0.1000 USD" in out


def test_status_without_prices_still_reports(
    aws_endpoint: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(capsys, "up", *IMAGES, "--poll-seconds", "0.1")
    assert code == 0, err
    real = Clients.connect()
    stubs = Stubs("us-east-1", base=real)
    use_clients(monkeypatch, stubs.clients)
    code, out, err = run_cli(capsys, "status", "--cost")
    assert code == 0, err
    assert "cost so far: none counted yet (no status.json)" in out

    put_status(stack.require(real, "run1"), {"frames": 1_000_000, "generation": 0})
    expect_fargate(stubs.pricing_stub, "us-east-1", items=[])
    code, out, err = run_cli(capsys, "status", "--cost")
    assert code == 0, err
    assert (
        f"cost so far: {1e6 / (data_figure() * 3600):,.2f} worker vCPU-hours for 1,000,000" in out
    )
    assert "not priced: no Fargate Spot price in the AWS Price List for us-east-1" in out
    # An endpoint that fails says so in one line, and status still reports.
    stubs.pricing_stub.add_client_error(
        "get_products", "AccessDeniedException", "not authorized to perform pricing:GetProducts"
    )
    code, out, err = run_cli(capsys, "status", "--cost")
    assert code == 0, err
    assert (
        "not priced: no fargate-spot price for us-east-1: AWS said AccessDeniedException: "
        "not authorized to perform pricing:GetProducts; pass --price USD_PER_VCPU_HOUR" in out
    )


# ------------------------------------------------------------------------------ data


def test_the_data_file_agrees_with_docs_performance() -> None:
    """docs/performance.md states the figures `estimate` uses on one marked line."""
    figures = json.loads(DATA_FILE.read_text())["figures"]
    text = (REPO / "docs" / "performance.md").read_text()
    # The line is a list item: its wrapped continuation lines are indented by two spaces.
    unwrapped = re.sub(r"\n  (?=\S)", " ", text)
    [line] = [row for row in unwrapped.splitlines() if "`neuro-deploy estimate` uses:" in row]
    quoted = {
        key: (float(rate.replace(",", "")), float(hours))
        for key, rate, hours in re.findall(
            r"`([\w]+/[\w-]+)` ([\d,]+) frames/s per vCPU, ([\d.]+) core-hours per 1B frames", line
        )
    }
    assert quoted == {
        key: (entry["frames_per_s_per_vcpu"], entry["core_hours_per_1b_frames"])
        for key, entry in figures.items()
    }
    for key, entry in figures.items():
        # The core-hours are the rate's, to the 0.1 the docs quote.
        assert (
            round(1e9 / entry["frames_per_s_per_vcpu"] / 3600, 1)
            == entry["core_hours_per_1b_frames"]
        ), key
        assert {"measured", "machine", "command", "source"} <= set(entry), key
        for other in entry.get("elsewhere", []):
            hours = round(1e9 / other["frames_per_s_per_vcpu"] / 3600, 1)
            assert hours == other["core_hours_per_1b_frames"], key
            assert {"measured", "machine", "command", "source"} <= set(other), key
            assert (REPO / other["source"].split(":")[0]).is_file(), key
    assert json.loads(DATA_FILE.read_text())["default"] in figures


def test_the_packaged_data_file_is_the_one_estimate_reads() -> None:
    assert cost.throughput_table() == json.loads(DATA_FILE.read_text())
    assert cost.throughput().frames_per_s_per_vcpu == data_figure()


def test_template_defaults_read_without_yaml_match_cloudformation() -> None:
    template, errors = decode_str(stack.template_body())
    assert not errors, errors
    expected = {
        name: ",".join(d) if isinstance(d := spec["Default"], list) else str(d)
        for name, spec in template["Parameters"].items()
        if "Default" in spec
    }
    assert cost.template_parameter_defaults(stack.template_body()) == expected
    assert cost.worker_cpu_units() == 1024


def test_readme_states_what_a_run_costs() -> None:
    readme = (REPO / "README.md").read_text()
    aws = readme[readme.index("## Run on AWS") : readme.index("## Run on Kubernetes")]
    assert "### What a run costs" in aws
    assert "neuro-deploy estimate" in aws
