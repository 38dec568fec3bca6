"""Observations to actions: the engine interface (base.py), the registry that picks an engine
from the shared table (registry.py), the policy every runner holds (policy.py), and one folder
or file per engine under engines/."""
