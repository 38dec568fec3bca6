"""A task becomes a policy with parameters: the spec and its keys, the parameters a spec names
(seeds, an ES perturbation, a saved vector), the evaluator's caches."""
