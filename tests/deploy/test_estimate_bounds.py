"""`neuro-deploy estimate` and `status` stay finite: every flag is bounded (each bound for a
stated reason), --json is always JSON a strict parser reads, and a damaged status.json is
reported, not a traceback or a NaN bill."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import boto3
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deploy import cli, cost, stack
from deploy.stack import Clients

pytestmark = pytest.mark.filterwarnings("ignore:Tried to parse:UserWarning")
IMAGES = ["--master-image", "example.org/neuro-master:1", "--worker-image", "example.org/w:1"]
# The bounds docs/deploy.md states, which the flags must take up to and refuse beyond.
MAX_FRAMES, MAX_WORKERS = 1e15, 5000
MAX_PRICE_PER_VCPU_HOUR, MAX_PRICE_PER_HOUR = 100.0, 10_000.0


def _strict_json(text: str) -> Any:
    """json.loads that refuses NaN and Infinity, as every JSON parser but Python's does."""

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def _finite_numbers(value: Any) -> list[float]:
    if isinstance(value, dict):
        return [n for v in value.values() for n in _finite_numbers(v)]
    if isinstance(value, list):
        return [n for v in value for n in _finite_numbers(v)]
    if isinstance(value, float | int) and not isinstance(value, bool):
        assert math.isfinite(value), value
        return [float(value)]
    return []


def _refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exited:
        cli.main(["estimate", *argv])
    assert exited.value.code == 2
    return capsys.readouterr().err


# ------------------------------------------------------------------------------ flags


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--price", "nan"], "--price: expected a finite price in USD, got 'nan'"),
        (["--price", "inf"], "--price: expected a finite price in USD, got 'inf'"),
        (["--price", "1e300"], "--price: expected at most 100 USD per vCPU-hour"),
        (["--master-price", "nan"], "--master-price: expected a finite price in USD, got 'nan'"),
        (["--master-price", "1e9"], "--master-price: expected at most 10000 USD per hour"),
        (["--frames", "1e300"], "--frames: expected at most 1e+15"),
        (["--workers", "1000000000"],
         "--workers: expected at most 5000 (ECS's quota of tasks per service), got '1000000000'"),
        (["--worker-memory", "1"], "--worker-memory: expected 1024 or more, got '1'"),
        (["--worker-memory", "100000"], "--worker-memory: expected at most 8192"),
        # 1500 MiB is a size the template takes on ec2-spot hosts, but no Fargate task's.
        (["--worker-memory", "1500"],
         "--worker-memory 1500: a 1-vCPU Fargate Spot worker takes 2048-8192 MiB"),
        (["--capacity", "fargate-spot", "--worker-memory", "2500"], "--worker-memory 2500"),
        (["--generations", "1" + "0" * 30, "--episode-steps", "100"],
         "--generations: expected at most 10000000"),
        (["--generations", "10", "--episode-steps", "1e300"],
         "--episode-steps: expected at most 1e+07"),
        (["--generations", "10", "--episode-steps", "100", "--population", "1" + "0" * 20],
         "--population: expected at most 10000000"),
        (["--generations", "10", "--episode-steps", "100", "--elite-episodes", "10000000"],
         "--elite-episodes: expected at most 100000"),
        # Each within its bound, together beyond the frames bound.
        (["--generations", "1000000", "--population", "1000000", "--episode-steps", "1000000"],
         "is 4e+18 frames, more than 1e+15"),
    ],
)  # fmt: skip
def test_a_value_beyond_its_bound_is_refused_at_parse_time_by_name(
    capsys: pytest.CaptureFixture[str], argv: list[str], named: str
) -> None:
    assert named in _refused(capsys, *argv, "--price", "0.02")


def test_the_largest_accepted_inputs_give_finite_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["estimate", "--frames", "1e15", "--workers", "1", "--price", "100",
                     "--master-price", "10000", "--json"])  # fmt: skip
    assert code == 0
    result = _strict_json(capsys.readouterr().out)
    assert _finite_numbers(result)
    assert result["total_usd"] > 1e9  # huge, and a number
    code = cli.main(["estimate", "--frames", "1e15", "--workers", "1", "--price", "100"])
    assert code == 0
    out = capsys.readouterr().out
    assert not re.search(r"\b(inf|nan)\b", out, re.IGNORECASE), out


def test_a_size_ec2_spot_hosts_take_is_kept(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["estimate", "--capacity", "ec2-spot", "--worker-memory", "1500",
                     "--price", "0.02", "--json"])  # fmt: skip
    assert code == 0
    assert _strict_json(capsys.readouterr().out)["settings"]["worker_memory"] == 1500


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    frames=st.floats(min_value=1e-300, max_value=MAX_FRAMES),
    workers=st.integers(1, MAX_WORKERS),
    price=st.floats(0, MAX_PRICE_PER_VCPU_HOUR),
    master=st.floats(0, MAX_PRICE_PER_HOUR),
)
def test_any_accepted_estimate_is_finite_json(
    capsys: pytest.CaptureFixture[str], frames: float, workers: int, price: float, master: float
) -> None:
    code = cli.main(["estimate", "--frames", repr(frames), "--workers", str(workers),
                     "--price", repr(price), "--master-price", repr(master), "--json"])  # fmt: skip
    assert code == 0
    result = _strict_json(capsys.readouterr().out)
    assert result["cost"]["frames"] == frames
    _finite_numbers(result)


def test_the_bounds_are_the_documented_ones() -> None:
    bounds = (cost.MAX_FRAMES, cost.MAX_WORKERS, cost.MAX_PRICE_PER_VCPU_HOUR,
              cost.MAX_PRICE_PER_HOUR)  # fmt: skip
    assert bounds == (MAX_FRAMES, MAX_WORKERS, MAX_PRICE_PER_VCPU_HOUR, MAX_PRICE_PER_HOUR)


def test_the_bounds_are_the_templates() -> None:
    """The estimate's memory bounds are the stack's: WorkerMemory's range and Fargate's rule."""
    body = stack.template_body()
    section = re.search(r"^  WorkerMemory:\n((?:    .*\n)+)", body, re.MULTILINE)
    assert section is not None
    low = int(re.search(r"MinValue: (\d+)", section.group(1)).group(1))  # type: ignore[union-attr]
    high = int(re.search(r"MaxValue: (\d+)", section.group(1)).group(1))  # type: ignore[union-attr]
    assert (low, high) == cost.WORKER_MEMORY_MIB
    rule = re.search(r"FargateWorkerMemory:.*?!Contains \[\[([^\]]*)\]", body, re.DOTALL)
    assert rule is not None
    allowed = tuple(int(v.strip().strip('"')) for v in rule.group(1).split(","))
    assert allowed == cost.FARGATE_WORKER_MEMORY_MIB


# ------------------------------------------------------------------------------ status


def _put_status(info: stack.StackInfo, body: str) -> None:
    bucket, prefix = stack.split_s3_uri(info.outputs["RunS3Uri"])
    key = f"{prefix}/status.json" if prefix else "status.json"
    boto3.client("s3").put_object(Bucket=bucket, Key=key, Body=body.encode())


@pytest.mark.parametrize(
    ("document", "reason"),
    [
        ('{"frames": null, "generation": 3}', "status.json's frames is None, not a count"),
        ('{"frames": "NaN", "generation": 3}', "status.json's frames is 'NaN', not a count"),
        ('{"frames": NaN, "generation": 3}', "status.json's frames is None, not a count"),
        ('{"frames": 1e400, "generation": 3}', "status.json's frames is None, not a count"),
        ('{"frames": -5, "generation": 3}', "status.json's frames is -5, not a count"),
        ('{"frames": {"a": 1}, "generation": 3}', "status.json's frames is {'a': 1}"),
    ],
)
def test_status_reports_a_status_json_whose_frames_are_no_count(
    aws_endpoint: str, capsys: pytest.CaptureFixture[str], document: str, reason: str
) -> None:
    assert cli.main(["--stack-name", "run1", "up", *IMAGES, "--poll-seconds", "0.1"]) == 0
    capsys.readouterr()
    _put_status(stack.require(Clients.connect(), "run1"), document)
    code = cli.main(["--stack-name", "run1", "status", "--price", "0.03"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert f"cost so far: unknown ({reason}" in captured.out
    assert "nan" not in captured.out.lower().replace("'nan'", "")
    assert "run ?: generation 3 (? phase), " in captured.out
    code = cli.main(["--stack-name", "run1", "status", "--price", "0.03", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    spent = _strict_json(captured.out)["cost"]
    assert spent["frames"] is None and spent["vcpu_hours"] is None


def test_status_refuses_a_status_json_that_is_no_object(
    aws_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["--stack-name", "run1", "up", *IMAGES, "--poll-seconds", "0.1"]) == 0
    capsys.readouterr()
    _put_status(stack.require(Clients.connect(), "run1"), "[1, 2]")
    code = cli.main(["--stack-name", "run1", "status"])
    assert code == 1
    assert "status.json: expected a JSON object, got list" in capsys.readouterr().err
