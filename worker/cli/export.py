"""neuro-export: a saved genome as a standard model file (ONNX or safetensors), with the
observation preprocessing it expects written beside it."""

from __future__ import annotations

import argparse
import sys

from worker.offline.export import FORMATS, export_genome


def export_parser() -> argparse.ArgumentParser:
    """neuro-export's arguments."""
    parser = argparse.ArgumentParser(
        prog="neuro-export",
        description="Write a saved genome's float32 policy as a standard model file, and beside "
        "it (MODEL_FILE.json) the observation preprocessing, normaliser and action rule it "
        "expects. The ONNX model takes the observation (float32) and gives 'logits' and the "
        "greedy 'action', which equal neuro-eval's; the safetensors file holds the network's "
        "parameters by name.",
    )
    parser.add_argument(
        "genome",
        metavar="RUN_DIR|GENOME.json",
        help="a run dir (exports its best_genome.json) or a genome file",
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        required=True,
        dest="model_format",
        help="onnx (runs in onnxruntime and other ONNX runtimes) or safetensors (the "
        "parameters; load them into neuro.load_policy's module.network)",
    )
    parser.add_argument(
        "--out",
        metavar="FILE",
        default=None,
        help="the model file to write (default: the genome file's path with the suffix .onnx "
        "or .safetensors); its preprocessing goes to FILE.json",
    )
    parser.add_argument(
        "--check",
        type=int,
        default=0,
        metavar="STEPS",
        help="then play whole episodes of the genome's env with neuro-eval's policy until at "
        "least STEPS steps, and count the steps where the written file's greedy action "
        "differs (default 0: no check)",
    )
    parser.add_argument("--seed", type=int, default=0,
                        help="seeds the check's first reset, as neuro-eval --seed")  # fmt: skip
    return parser


def main(argv: list[str] | None = None) -> int:
    """neuro-export: export the genome and say what was written; 2 with the reason if not."""
    parser = export_parser()
    args = parser.parse_args(argv)
    if args.check < 0:
        parser.error(f"--check must be >= 0 steps, got {args.check}")
    try:
        exported = export_genome(args.genome, args.model_format, args.out)
    except (ValueError, ImportError, OSError) as error:
        print(f"neuro-export: {error}", file=sys.stderr)
        return 2
    genome = exported.document["genome"]
    network = genome["policy"]["factory"] if "policy" in genome else genome["architecture"]
    print(f"wrote {exported.model}: {genome['env_id']} {network} policy, "
          f"{genome['exported_dtype']}, as {args.model_format}")  # fmt: skip
    if "note" in genome:
        print(f"note: {genome['note']}")
    print(f"wrote {exported.preprocessing}: its observation preprocessing and action rule")
    if args.check:
        from worker.offline.export_check import check_export

        agreement = check_export(exported.model, args.genome, args.check, args.seed)
        print(f"check: {agreement}")
    return 0
