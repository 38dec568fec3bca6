"""Playing episodes: the one rollout loop, the env cache, the paper's Atari on the C++ vector
env, the frames int8-static calibrates on. Knows nothing of genomes or engines: an actor maps
observations to actions."""
