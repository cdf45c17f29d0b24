"""Hydra launcher plugin: ``hydra/launcher=gpuhpc`` runs a Hydra multirun as gpuhpc job arrays
on the Slurm cluster (docs/sweeps.md, "Hydra"). ``hydra_plugins`` is Hydra's namespace package
for plugins: Hydra finds this one by itself once gpuhpc is installed with its ``hydra`` extra."""
