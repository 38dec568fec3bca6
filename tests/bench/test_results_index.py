"""bench/results: every result path the docs cite exists, and every result is named by the
rule bench/README.md states (its machine tags and inputs read from that page) and indexed
there, or in superseded/README.md."""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterator
from pathlib import Path

from tests.support.processes import REPO

BENCH = REPO / "bench"
RESULTS = BENCH / "results"
SUPERSEDED = RESULTS / "superseded"
INDEX = BENCH / "README.md"
CITING = (REPO / "README.md", INDEX, SUPERSEDED / "README.md", REPO / "deploy" / "throughput.json")
# What follows "bench/results/" up to a character no result's name has. A path followed by
# "<", "{" or "*" is a pattern (where a command writes, a family of files), not a file.
CITATION = re.compile(r"bench/results/([\w./-]*)")
PATTERN_MARKS = "<{*"


def citing_files() -> list[Path]:
    """The docs, the benchmarks' own docstrings and defaults, and the deploy figures' sources."""
    return [*CITING, *sorted((REPO / "docs").rglob("*.md")), *sorted(BENCH.glob("*.py"))]


def cited_paths(text: str) -> Iterator[str]:
    """Each result path cited in text, relative to bench/results."""
    for match in CITATION.finditer(text):
        following = text[match.end() : match.end() + 1]
        if following and following in PATTERN_MARKS:
            continue
        cited = match.group(1).rstrip(".,;:")
        if cited:
            yield cited


def table_names(heading: str) -> list[str]:
    """The backquoted first cells of the table under `## heading` in bench/README.md."""
    section = INDEX.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", section, re.MULTILINE)


def producers() -> list[str]:
    """The names results start with: every benchmark script's, and neuro-master's own runs."""
    scripts = [p for p in BENCH.glob("*.py") if 'if __name__ == "__main__":' in p.read_text()]
    return ["neuro-master", *(p.stem.replace("_", "-") for p in scripts)]


def rule_breaks(name: str, tags: list[str], names: list[str]) -> str | None:
    """Why a result's file name breaks <script>-<variant>-<machine>-<date>, or None."""
    machine = "|".join(map(re.escape, tags))
    match = re.fullmatch(rf"(.+?)-({machine})-(\d{{4}}-\d{{2}}-\d{{2}})(\.jsonl?)?", name)
    if match is None:
        return "no machine tag and date at its end"
    stem, _, date, _ = match.groups()
    try:
        datetime.date.fromisoformat(date)
    except ValueError:
        return f"{date} is no date"
    if not any(stem == script or stem.startswith(f"{script}-") for script in names):
        return "it starts with no benchmark's name"
    return None


def test_every_cited_result_exists() -> None:
    missing = [
        f"{path.relative_to(REPO)}: bench/results/{cited}"
        for path in citing_files()
        for cited in cited_paths(path.read_text())
        if not (RESULTS / cited).exists()
    ]
    assert missing == []


def test_a_citation_of_a_missing_file_is_found_and_a_pattern_is_not() -> None:
    text = "see bench/results/no-such-file.json. Run it: --json bench/results/x-<machine>.json"
    assert list(cited_paths(text)) == ["no-such-file.json"]


def test_every_result_is_named_by_the_rule() -> None:
    tags, inputs, names = table_names("Machine tags"), set(table_names("Inputs")), producers()
    assert "virtual" in tags and len(names) > 15  # the tables and scripts were read
    broken = {}
    for path in [*RESULTS.iterdir(), *SUPERSEDED.iterdir()]:
        if path.name in inputs or path.name == "README.md" or path == SUPERSEDED:
            continue
        why = rule_breaks(path.name, tags, names)
        if why is not None:
            broken[path.name] = why
    assert broken == {}


def test_the_rule_refuses_names_that_break_it() -> None:
    tags, names = ["avx2-2core"], ["throughput", "fleet-sim"]
    assert rule_breaks("throughput-int8-avx2-2core-2026-11-26.json", tags, names) is None
    assert rule_breaks("throughput-avx2-2core-2026-11-26.json", tags, names) is None
    assert rule_breaks("throughput-int8-avx2-2core.json", tags, names) is not None
    assert rule_breaks("throughput-int8-xeon-2026-11-26.json", tags, names) is not None
    assert rule_breaks("nothing-int8-avx2-2core-2026-11-26.json", tags, names) is not None
    assert rule_breaks("throughput-avx2-2core-2026-13-26.json", tags, names) is not None


def test_every_result_is_indexed() -> None:
    """bench/README.md names every result (a folder with a trailing /), superseded/README.md
    every superseded one."""
    unindexed = []
    for folder, index in ((RESULTS, INDEX), (SUPERSEDED, SUPERSEDED / "README.md")):
        text = index.read_text()
        for path in folder.iterdir():
            if path.name in {"README.md", SUPERSEDED.name} or path.name in table_names("Inputs"):
                continue
            if f"`{path.name}{'/' if path.is_dir() else ''}`" not in text:
                unindexed.append(str(path.relative_to(RESULTS)))
    assert unindexed == []
