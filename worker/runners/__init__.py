"""What plays the tasks a worker holds: per genome (the CPU default) or batched (--envs, GPU)."""
