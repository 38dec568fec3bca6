"""One folder or file per inference engine; each exports ENGINE, and only
worker/inference/registry.py imports them."""
