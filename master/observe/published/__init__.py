"""Published figures to set runs beside: Such et al. 2017, "Deep Neuroevolution", Table 1
(such2017_table1.json, with its source and notes), and which of its games an env id plays."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from typing import Any

from master.config import inspect_env_id
from neuro.envs.make import atari_game

PUBLISHED_FORMAT = "neuro.published/1"
SUCH_2017_TABLE_1 = "such2017_table1.json"
PAPER_COLUMN = "GA"
"""The published column a run is compared with, and whose frames it is set against."""


@dataclass(frozen=True)
class Published:
    """A published table: its source, notes, columns (method, frames) and scores per game."""

    source: str
    url: str
    score: str
    notes: tuple[str, ...]
    columns: dict[str, dict[str, Any]]
    games: dict[str, dict[str, float]]

    def game(self, env_id: str | None) -> str | None:
        """The table's name for the game an Atari env id plays, or None if it has none."""
        return paper_game(env_id, self.games)


def load_published() -> Published:
    """Such et al. 2017, Table 1, as the package ships it."""
    text = resources.files(__package__).joinpath(SUCH_2017_TABLE_1).read_text()
    document = json.loads(text)
    if document.get("format") != PUBLISHED_FORMAT:
        raise ValueError(f"{SUCH_2017_TABLE_1}: format {document.get('format')!r} is not known")
    return Published(
        source=document["source"],
        url=document["url"],
        score=document["score"],
        notes=tuple(document["notes"]),
        columns=document["columns"],
        games={
            game: {k: float(v) for k, v in row.items()} for game, row in document["games"].items()
        },
    )


def paper_game(env_id: str | None, games: Iterable[str]) -> str | None:
    """The game of `games` an Atari env id plays, the way neuro's env factory reads Atari ids
    (Frostbite-v4, ALE/Frostbite-v5 and FrostbiteNoFrameskip-v4 all play Frostbite)."""
    if not env_id:
        return None
    try:
        if not inspect_env_id(env_id).atari:
            return None
        rom = atari_game(env_id)
    except (ValueError, KeyError):
        return None  # an env this install does not know is in no published table
    wanted = _game_key(rom)
    return next((game for game in games if _game_key(game) == wanted), None)


def _game_key(name: str) -> str:
    return "".join(c for c in name.lower() if c.isalnum())
