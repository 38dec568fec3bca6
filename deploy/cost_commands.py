"""What the stack's prices and settings are, and the cost so far `neuro-deploy status` shows;
`estimate` is deploy/estimate.py."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

import botocore.exceptions

from deploy import cost, stack
from deploy.stack import Clients, DeployError


def template_settings(args: argparse.Namespace, parameters: dict[str, str]) -> dict[str, Any]:
    """The capacity settings a stack would get: the flags given, else `parameters`."""

    def pick(dest: str, key: str) -> Any:
        value = getattr(args, dest, None)
        return parameters[key] if value is None else value

    capacity = pick("capacity", "WorkerCapacity")
    if capacity not in cost.CAPACITIES:
        raise DeployError(f"unknown capacity {capacity!r}: one of {', '.join(cost.CAPACITIES)}")
    return {
        "capacity": capacity,
        "workers": int(pick("workers", "WorkerCount")),
        "worker_memory": int(pick("worker_memory", "WorkerMemory")),
        "instance_types": [
            t
            for t in str(pick("worker_instance_types", "WorkerInstanceTypes")).split(",")
            if t.strip()
        ],
        "master_instance_type": pick("master_instance_type", "MasterInstanceType"),
    }


def prices(
    clients: Clients | None,
    args: argparse.Namespace,
    settings: dict[str, Any],
    region: str,
    offline: str = "--price asks AWS nothing; add --master-price USD_PER_HOUR",
) -> tuple[cost.Price, cost.Price | None, str | None]:
    """(worker price per vCPU-hour, master price per hour or None, why the master is unpriced).

    With no `clients`, only the prices given by flags count; `offline` says so for the master.
    """
    if args.price is not None:
        worker = cost.given_price(args.price, "vCPU-hour", "--price")
    else:
        assert clients is not None
        try:
            worker = cost.worker_price(
                clients,
                settings["capacity"],
                region,
                settings["instance_types"],
                settings["worker_memory"],
            )
        except botocore.exceptions.ClientError as error:
            raise DeployError(
                f"no {settings['capacity']} price for {region}: {_brief(error)}; "
                "pass --price USD_PER_VCPU_HOUR"
            ) from None
    if args.master_price is not None:
        return worker, cost.given_price(args.master_price, "hour", "--master-price"), None
    if clients is None:
        return worker, None, offline
    try:
        master = cost.on_demand_instance_price(
            clients.pricing, region, settings["master_instance_type"]
        )
    except DeployError as error:
        return worker, None, str(error)
    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as error:
        # The workers are most of the bill: an identity without pricing:GetProducts still
        # gets their estimate.
        return worker, None, f"the Price List API refused: {_brief(error)}"
    return worker, master, None


def cost_so_far(
    clients: Clients, args: argparse.Namespace, info: stack.StackInfo, run: dict[str, Any] | None
) -> dict[str, Any] | None:
    """What the run has cost so far, as a dict for --json; None before its first status.json.

    ECS keeps no history of the running count, so workers are charged by the work done:
    frames so far / the measured frames per vCPU-hour. The master runs from stack creation.
    AWS is asked for prices only with --cost: a plain `status` stays fast and needs no pricing
    permissions.
    """
    if run is None:
        return None
    rate = cost.throughput()
    model = (
        "worker vCPU-hours = frames so far / measured frames per vCPU-hour "
        f"({rate.frames_per_vcpu_hour:,.0f}, {rate.key}); master hours = since stack creation"
    )
    frames = frames_so_far(run)
    if frames is None:
        # Charged from nothing rather than from a guess: the master writes a count.
        return {"model": model, "frames": None, "vcpu_hours": None,
                "unpriced": f"status.json's frames is {run.get('frames')!r}, not a count of "
                "frames"}  # fmt: skip
    report: dict[str, Any] = {
        "model": model,
        "frames": frames,
        "vcpu_hours": rate.vcpu_hours(frames),
    }
    if args.price is None and not args.cost:
        report["unpriced"] = "--cost prices it at the region's current prices"
        return report
    try:
        settings = template_settings(argparse.Namespace(), info.parameters)
        worker_price, master_price, unpriced = prices(
            clients if args.cost else None, args, settings, clients.region,
            offline="--price without --cost asks AWS nothing; add --master-price USD_PER_HOUR",
        )  # fmt: skip
    except (DeployError, KeyError, ValueError, botocore.exceptions.ClientError,
            botocore.exceptions.BotoCoreError) as error:  # fmt: skip
        # A DeployError already says what to pass.
        hint = "" if isinstance(error, DeployError) else " (pass --price USD_PER_VCPU_HOUR)"
        report["unpriced"] = _brief(error) + hint
        return report
    master_hours = None
    if info.created is not None:
        master_hours = max(0.0, (datetime.now(UTC) - info.created).total_seconds() / 3600)
    elif master_price is not None:
        master_price, unpriced = None, "the stack's creation time is unknown"
    # workers=1: in the frames model the worker count drops out; cost() refuses only zero.
    spent = cost.cost(frames, rate, 1, worker_price, master_price, master_hours)
    report.update(
        worker_price=worker_price.__dict__,
        worker_usd=spent.worker_usd,
        master_instance_type=settings["master_instance_type"],
        master_hours=master_hours,
        master_price=master_price and master_price.__dict__,
        master_usd=spent.master_usd,
        master_unpriced=unpriced,
        total_usd=spent.worker_usd + (spent.master_usd or 0.0),
    )
    return report


def frames_so_far(run: dict[str, Any]) -> float | None:
    """status.json's frame count (0 before the first), or None if it is not a finite count."""
    frames = run.get("frames", 0)
    if isinstance(frames, bool) or not isinstance(frames, int | float):
        return None
    # A chained comparison: False for NaN, and no float conversion of a huge int.
    if not 0 <= frames <= cost.MAX_FRAMES:
        return None
    return float(frames)


def _brief(error: Exception) -> str:
    """An error in one line: AWS's code and message, not the HTML page of a failing endpoint."""
    if isinstance(error, DeployError):
        return str(error)
    if isinstance(error, botocore.exceptions.ClientError):
        detail = error.response.get("Error", {})
        message = str(detail.get("Message") or error).splitlines()[0][:200]
        return f"AWS said {detail.get('Code') or 'error'}: {message}"
    return f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"


def describe_cost_so_far(spent: dict[str, Any] | None) -> list[str]:
    if spent is None:
        return ["cost so far: none counted yet (no status.json)"]
    if spent["frames"] is None:
        return [f"cost so far: unknown ({spent['unpriced']})", f"  model: {spent['model']}"]
    lines = [
        f"cost so far: {spent['vcpu_hours']:,.2f} worker vCPU-hours for "
        f"{spent['frames']:,.0f} frames"
    ]
    if "unpriced" in spent:
        return [
            *lines,
            f"  not priced: {spent['unpriced']}",
            f"  model: {spent['model']}",
        ]
    price = spent["worker_price"]
    lines[0] += (
        f" x {price['usd']:.4f} USD = {spent['worker_usd']:,.2f} USD "
        f"({price['source']}, as of {price['as_of']})"
    )
    if spent["master_usd"] is not None:
        master = spent["master_price"]
        lines.append(
            f"  master {spent['master_instance_type']}: {spent['master_hours']:,.2f} h x "
            f"{master['usd']:.4f} USD = {spent['master_usd']:,.2f} USD ({master['source']})"
        )
    else:
        lines.append(
            f"  master {spent['master_instance_type']}: excluded ({spent['master_unpriced']})"
        )
    lines.append(f"  total so far: {spent['total_usd']:,.2f} USD")
    lines.append(f"  model: {spent['model']}")
    return lines
