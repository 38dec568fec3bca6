"""The decode goldens: the digests of decoded parameters that pin what a genome means."""

from __future__ import annotations

SEEDS = [4070460811, 2393459932, 3391677529, 3126527182]
SIGMA = 0.002

# Golden digests of decoded parameters. Changing them breaks every saved genome: the same seeds
# would decode to different networks.
GOLDEN_MLP_CARTPOLE = "dabf6f75abbb1bf984ddad5ede4c21d80113b9ea4e297eaa79209939ab6c2aba"
GOLDEN_NATURE_18 = "a17398b8334c4704eeb4db4138b8d8c2a2d5a51686657dd0455fd9bcb0ae2476"
