"""neuro-master status: where a running master's run or study stands, asked over Status."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.descriptor import FieldDescriptor

from neuro.v1 import evolution_pb2 as pb
from neuro.v1 import evolution_pb2_grpc as pb_grpc
from neuro.wire import DEFAULT_MASTER, TOKEN_ENV, bearer_metadata, load_token, open_channel

DEFAULT_TIMEOUT_S = 10.0
EXIT_UNREACHABLE = 1
EXIT_USAGE = 2
"""Also a refused token, as for neuro-worker: the caller's configuration is wrong."""
_ADDRESS = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>[0-9]{1,5})")
_MAX_RESPONSE_BYTES = 64 * 1024 * 1024
"""Room for the worker table of a very large fleet (gRPC's default cap is 4 MiB)."""


class StatusError(Exception):
    """The Status call failed; the message says why and names the master's address."""

    def __init__(self, message: str, exit_code: int = EXIT_UNREACHABLE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="neuro-master status",
        description="Show where a running neuro master's run stands: progress, leases and "
        "a table of its workers; for a study, also how busy the fleet is and a line per run "
        "(env, seed, state, generation, frames, elite).",
    )
    p.add_argument(
        "--master",
        default=os.environ.get("NEURO_MASTER", DEFAULT_MASTER),
        help="master address host:port (env NEURO_MASTER; default %(default)s)",
    )
    # The token itself is never a flag: argv is visible to every user of the host in ps.
    p.add_argument(
        "--token-file",
        default=os.environ.get("NEURO_TOKEN_FILE"),
        help="file holding the master's shared token (env NEURO_TOKEN_FILE, or the token "
        f"itself in env {TOKEN_ENV})",
    )
    p.add_argument(
        "--tls-ca",
        default=os.environ.get("NEURO_TLS_CA"),
        help="PEM root certificate of a TLS master (env NEURO_TLS_CA); plaintext without it",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="seconds to wait for the answer (default %(default)s)",
    )
    p.add_argument("--json", action="store_true", help="print the answer as one JSON object")
    return p


def parse_address(text: str) -> str:
    """`host:port` as gRPC takes it; ValueError naming the text if it is not one."""
    match = _ADDRESS.fullmatch(text.strip())
    if match is None or not 1 <= int(match["port"]) <= 65535:
        raise ValueError(
            f"--master {text!r} is not an address: expected host:port with a port in "
            "1-65535, e.g. 127.0.0.1:8080 or [::1]:8080"
        )
    return f"{match['host']}:{int(match['port'])}"


def fetch_status(
    address: str,
    token: str | None = None,
    root_certificates: bytes | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    token_source: str = "the token",
) -> pb.StatusResponse:
    """One Status call with a deadline; StatusError (naming `address`) if it fails."""
    options = [("grpc.max_receive_message_length", _MAX_RESPONSE_BYTES)]
    channel = open_channel(address, None, root_certificates, options)
    # Metadata on the one call: the channel carries no interceptor, so it closes cleanly.
    metadata = bearer_metadata(token)
    try:
        with channel:
            stub = pb_grpc.EvolutionStub(channel)
            return stub.Status(pb.StatusRequest(), timeout=timeout, metadata=metadata)
    except grpc.RpcError as error:
        raise _explained(error, address, token, root_certificates, timeout, token_source) from None


def _explained(
    error: grpc.RpcError,
    address: str,
    token: str | None,
    root_certificates: bytes | None,
    timeout: float,
    token_source: str,
) -> StatusError:
    code = error.code() if isinstance(error, grpc.Call) else None
    details = (error.details() if isinstance(error, grpc.Call) else None) or str(error)
    if code is grpc.StatusCode.UNAUTHENTICATED:
        if token is None:
            return StatusError(
                f"the master at {address} requires a token: give --token-file, "
                f"NEURO_TOKEN_FILE or {TOKEN_ENV}",
                EXIT_USAGE,
            )
        return StatusError(
            f"the master at {address} refused {token_source}: the token is wrong", EXIT_USAGE
        )
    if code is grpc.StatusCode.UNAVAILABLE:
        hint = "is it running at that address?"
        hint += (
            " If it serves plaintext, leave out --tls-ca."
            if root_certificates is not None
            else " If it serves TLS, give --tls-ca."
        )
        return StatusError(f"cannot reach the master at {address} ({details}); {hint}")
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return StatusError(f"the master at {address} did not answer within {timeout:g} s")
    name = code.name if code is not None else "error"
    return StatusError(f"Status call to the master at {address} failed: {name}: {details}")


def status_json(status: pb.StatusResponse) -> dict[str, Any]:
    """The answer as plain JSON values: every scalar field, elite seeds, the worker table and
    a study's runs."""
    document = _scalars(status)
    document["elite_seeds"] = list(status.elite.seeds)
    document["worker_status"] = [_scalars(worker) for worker in status.worker_status]
    document["runs"] = [_scalars(run) for run in status.runs]
    return document


def _scalars(message: Any) -> dict[str, Any]:
    """Every non-message, non-repeated field by name; NaN (no value yet) and an optional field
    left unset (unknown) become None."""
    values = {}
    for field in message.DESCRIPTOR.fields:
        if field.type == FieldDescriptor.TYPE_MESSAGE or field.is_repeated:
            continue
        if field.has_presence and not message.HasField(field.name):
            values[field.name] = None
            continue
        value = getattr(message, field.name)
        values[field.name] = None if isinstance(value, float) and math.isnan(value) else value
    return values


def printable(text: str) -> str:
    """`text` with every character a terminal would act on (newline, escape, ...) escaped."""
    # Ids come from workers and the master over the network: printed raw, a newline or an
    # escape sequence could forge lines of this report or drive the terminal.
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def format_status(status: pb.StatusResponse) -> str:
    """The answer for people: one figure a line, then one line per run of a study and one
    line per worker."""
    lines = _study_figures(status) if status.runs else _run_figures(status)
    lines.append(f"workers       {status.workers} connected (called in the last minute)")
    if status.HasField("utilisation"):
        lines.append(f"busy          {status.utilisation:.0%} of the workers' time, lately")
    if len(status.worker_status) < status.workers_tracked:
        lines.append(
            f"worker table  the {len(status.worker_status)} most recently seen of "
            f"{status.workers_tracked} remembered"
        )
    if status.runs:
        lines.append("")
        lines.extend(format_runs(status.runs))
    if status.worker_status:
        names = [printable(w.worker_id) for w in status.worker_status]
        width = max(6, *(len(name) for name in names))
        lines.append("")
        lines.append(
            f"{'worker':<{width}}  {'tasks':>6}  {'evaluations':>11}  {'frames':>14}  "
            f"{'frames/s':>10}  {'last contact':>12}  {'failed':>6}"
        )
        for name, w in zip(names, status.worker_status, strict=True):
            # A worker that failed every task it got lately is given nothing for a while.
            held_off = f"  held off {w.held_off_seconds:.0f} s" if w.held_off_seconds > 0 else ""
            # A worker that cannot import a module the run needs says which.
            refuses = f"  refuses: {printable(w.refusal)}" if w.refusal else ""
            lines.append(
                f"{name:<{width}}  {w.tasks_leased:>6,}  {w.evaluations:>11,}  "
                f"{w.frames:>14,}  {w.frames_per_second:>10,.1f}  "
                f"{w.seconds_since_contact:>10.1f} s  {w.tasks_failed:>6,}{held_off}{refuses}"
            )
    return "\n".join(lines)


def _run_figures(status: pb.StatusResponse) -> list[str]:
    elite = "none yet" if math.isnan(status.elite_score) else f"{status.elite_score:.2f}"
    return [
        f"run           {printable(status.run_id)}",
        f"env           {printable(status.env_id)}",
        f"generation    {status.generation} ({printable(status.phase)} phase)",
        f"frames        {status.frames:,}",
        f"evaluations   {status.evaluations:,}",
        f"elite score   {elite}",
        f"leases out    {status.tasks_leased:,} tasks",
        f"pending       {status.tasks_pending:,} tasks",
        f"done          {status.tasks_done:,} tasks (this phase)",
        f"re-issues     {status.leases_reissued:,}",
        f"run complete  {'yes' if status.run_complete else 'no'}",
    ]


def _study_figures(status: pb.StatusResponse) -> list[str]:
    """A study's figures: its runs' together (the runs' own generation and elite are theirs)."""
    return [
        f"study         {printable(status.run_id)}",
        f"runs          {_runs_by_state(status.runs)}",
        f"frames        {status.frames:,} (the runs served by this master process)",
        f"evaluations   {status.evaluations:,}",
        f"leases out    {status.tasks_leased:,} tasks",
        f"pending       {status.tasks_pending:,} tasks",
        f"done          {status.tasks_done:,} tasks (the running phases)",
        f"re-issues     {status.leases_reissued:,}",
        f"complete      {'yes' if status.run_complete else 'no'}",
    ]


def format_runs(runs: Sequence[pb.RunStatus]) -> list[str]:
    """A study's runs for people: one line each, a failed run's error at its end."""
    cells = [
        (
            printable(run.name),
            printable(run.env_id),
            str(run.seed),
            printable(run.state),
            f"{run.generation:,}",
            f"{run.frames:,}",
            "-" if math.isnan(run.elite_score) else f"{run.elite_score:.2f}",
        )
        for run in runs
    ]
    header = ("run", "env", "seed", "state", "generation", "frames", "elite")
    widths = [max(len(row[i]) for row in (header, *cells)) for i in range(len(header))]
    left = (True, True, False, True, False, False, False)

    def line(row: Sequence[str]) -> str:
        return "  ".join(
            cell.ljust(width) if flush_left else cell.rjust(width)
            for cell, width, flush_left in zip(row, widths, left, strict=True)
        )

    lines = [line(header)]
    for row, run in zip(cells, runs, strict=True):
        lines.append(line(row) + (f"  {printable(run.error)}" if run.error else ""))
    return lines


def _runs_by_state(runs: Sequence[pb.RunStatus]) -> str:
    """ "65: 13 running, 20 complete, 32 queued": the runs counted by state, in a fixed order."""
    counts = Counter(run.state for run in runs)
    order = ("running", "queued", "complete", "failed")
    ranked = sorted(counts, key=lambda s: (order.index(s) if s in order else len(order), s))
    by_state = ", ".join(f"{counts[state]} {printable(state)}" for state in ranked)
    return f"{len(runs)}: {by_state}"


def main(argv: list[str] | None = None) -> int:
    """neuro-master status [--master host:port] [--token-file F] [--tls-ca CA] [--json]."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        address = parse_address(args.master)
        token = load_token(args.token_file)
    except ValueError as error:
        parser.error(str(error))
    if not 0 < args.timeout < math.inf:
        parser.error(f"--timeout must be a number of seconds > 0, got {args.timeout}")
    root_certificates = None
    if args.tls_ca:
        try:
            root_certificates = Path(args.tls_ca).read_bytes()
        except OSError as error:
            parser.error(f"--tls-ca {args.tls_ca}: {error.strerror}")
    source = f"the token in {args.token_file}" if args.token_file else f"the token in {TOKEN_ENV}"
    try:
        status = fetch_status(address, token, root_certificates, args.timeout, source)
    except StatusError as error:
        print(f"neuro-master status: {error}", file=sys.stderr)
        return error.exit_code
    if args.json:
        print(json.dumps(status_json(status), indent=2))
    else:
        print(format_status(status))
    return 0
