"""What users look at: events, progress, TensorBoard, Prometheus, plots and `status`."""
