"""One run: the training loop, its run dir and checkpoints, the S3 mirror, start-up wiring."""
