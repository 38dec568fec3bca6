"""What both sides of the wire read from one place: the Atari dynamics enum, both ways."""

from __future__ import annotations

from neuro.envs.make import ATARI_DYNAMICS, PAPER
from neuro.v1 import evolution_pb2 as pb
from neuro.wire import ATARI_DYNAMICS_FROM_WIRE, ATARI_DYNAMICS_TO_WIRE


def test_every_atari_dynamics_has_one_wire_value_and_back() -> None:
    assert set(ATARI_DYNAMICS_TO_WIRE) == set(ATARI_DYNAMICS)
    assert len(set(ATARI_DYNAMICS_TO_WIRE.values())) == len(ATARI_DYNAMICS)
    for name, value in ATARI_DYNAMICS_TO_WIRE.items():
        assert value != pb.ATARI_DYNAMICS_UNSPECIFIED
        assert ATARI_DYNAMICS_FROM_WIRE[value] == name


def test_an_unset_field_reads_as_the_papers_protocol_and_nothing_else_is_known() -> None:
    """A non-Atari task, or a master from before the field; any other value is a newer
    master's, which a worker refuses rather than plays under other rules."""
    assert ATARI_DYNAMICS_FROM_WIRE[pb.ATARI_DYNAMICS_UNSPECIFIED] == PAPER
    assert set(ATARI_DYNAMICS_FROM_WIRE) == {
        pb.ATARI_DYNAMICS_UNSPECIFIED,
        *ATARI_DYNAMICS_TO_WIRE.values(),
    }
