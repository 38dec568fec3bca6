"""The project's benchmarks: each module a script, run from the repository root as
`python -m bench.<name>`; bench/README.md says which question each answers and where its
results are. What several of them share is in bench/common.py."""
