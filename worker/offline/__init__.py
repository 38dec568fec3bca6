"""Outside training: replay a saved genome (neuro-eval), record it as video."""
